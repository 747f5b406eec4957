"""build_providers: every cloud whose key is set, plus local; clients point at the configured URLs."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes.clouds.fixtures import use_fake_env

from bot.providers.base import OfferQuery, Provider
from bot.providers.cloud_init import cloud_init_dict, docker_run, env_file_content, user_data
from bot.providers.local import LocalProvider
from bot.providers.registry import CLOUDS, build_providers, configured_clouds, provider_classes
from bot.settings import get_settings


def test_without_keys_only_local(tmp_path: Path) -> None:
    providers = build_providers(get_settings(), local_workdir=tmp_path)
    assert list(providers) == ["local"] and isinstance(providers["local"], LocalProvider)
    assert providers["local"].workdir == tmp_path
    assert "local" not in build_providers(get_settings(), include_local=False)


def test_every_cloud_with_a_key_is_built_against_its_url(
    monkeypatch: pytest.MonkeyPatch, fake_clouds
) -> None:
    for fake in fake_clouds.values():
        use_fake_env(monkeypatch, fake)
    assert configured_clouds() == list(CLOUDS) == list(fake_clouds)
    providers = build_providers(get_settings())
    assert set(providers) == set(provider_classes()) == {*CLOUDS, "local"}
    for name, fake in fake_clouds.items():
        provider = providers[name]
        assert isinstance(provider, Provider) and isinstance(provider, CLOUDS[name].client)
        assert provider.search_offers(OfferQuery()), name
        assert fake.count("search") >= 1


def test_local_default_workdir_is_under_the_data_dir() -> None:
    providers = build_providers()
    assert providers["local"].workdir == get_settings().data_dir / "local-provider"


def test_cloud_init_keeps_secrets_off_the_command_line() -> None:
    env = {"TUNEBOT_JOB_SPEC": '{"job_id": "a b", "x": "$HOME"}', "HF_TOKEN": "hf_secret"}
    run = docker_run("img:1", ["tunebot-runner", "--flag"])
    assert (
        run.startswith("docker run") and "--env-file /etc/tunebot/runner.env" in run and "--gpus all" in run
    )
    assert run.endswith("img:1 tunebot-runner --flag") and "hf_secret" not in run
    doc = user_data("img:1", env)
    assert doc.startswith("#cloud-config\n") and "permissions: '0600'" in doc
    yaml = pytest.importorskip("yaml")
    parsed = yaml.safe_load(doc)
    assert parsed["write_files"][0]["content"] == env_file_content(env)
    assert parsed["runcmd"][-1] == run.replace(" tunebot-runner --flag", "")
    structured = cloud_init_dict("img:1", env)
    assert structured["write_files"][0]["content"] == env_file_content(env)
    assert all("hf_secret" not in step for step in structured["runcmd"])
    with pytest.raises(ValueError, match="spans lines"):
        env_file_content({"BAD": "a\nb"})
