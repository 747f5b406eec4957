"""docs/configuration.md (the README links it) lists every setting: its table is generated from
bot/settings.py and must not drift; and what the code and docs cite under docs/ exists in the repository."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _script():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("settings_doc", ROOT / "scripts" / "settings_doc.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_the_settings_table_is_the_generated_one() -> None:
    doc = _script()
    readme = (ROOT / "docs" / "configuration.md").read_text()
    assert doc.block() in readme, (
        "docs/configuration.md's settings table is stale: run `python scripts/settings_doc.py --write`"
    )


def test_every_setting_and_cloud_variable_is_in_the_configuration_doc() -> None:
    from bot.providers.registry import CLOUDS
    from bot.settings import Settings

    doc = _script()
    readme = (ROOT / "docs" / "configuration.md").read_text()
    names = [n for f in Settings.model_fields.values() for n in doc.env_names(f)]
    names += [e for s in CLOUDS.values() for e in (s.key_env, s.url_env, *s.options.values())]
    missing = [n for n in names if f"`{n}`" not in readme]
    assert not missing, missing
    for needed in ("TUNEBOT_MIN_RELIABILITY", "TUNEBOT_RETRY_BUDGET", "TUNEBOT_IDLE_STOP_MINUTES"):
        assert f"`{needed}`" in readme  # three of the nine the README's table once lacked


def test_what_the_code_cites_under_docs_exists() -> None:
    cited: set[str] = set()
    for folder in ("bot", "runner", "store", "bench", "scripts", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            cited |= set(re.findall(r"docs/([\w-]+\.md)", path.read_text(errors="replace")))
    for doc in (ROOT / "docs").glob("*.md"):
        cited |= set(re.findall(r"\]\(([\w-]+\.md)\)", doc.read_text()))
    missing = sorted(name for name in cited if not (ROOT / "docs" / name).is_file())
    assert not missing, missing
    assert {"providers.md", "estimation.md", "slack.md"} <= cited
