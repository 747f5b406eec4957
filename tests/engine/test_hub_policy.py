"""Hub pushes are the engine's decision (issue 19): only into TUNEBOT_HUB_NAMESPACES, public only with an
admin's approval. (The runner never pushes over a repo it did not create: tests/runner/test_hub_push.py.)"""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from bot.engine.api import PermissionDenied
from bot.engine.permissions import Permissions
from bot.settings import Settings

from .conftest import estimate_for, request


@pytest.fixture
def hub_engine(make_engine, settings):  # type: ignore[no-untyped-def]
    def make(**env: str):  # type: ignore[no-untyped-def]
        with_token = settings.model_copy(update={"hf_token": SecretStr("hf_operator_token")})
        policy = Permissions.from_settings(Settings(**env))
        return make_engine(settings=with_token, permissions=policy)

    return make


def test_without_namespaces_nobody_pushes(hub_engine, fake):
    """a9605e4: any member pushed to any repo the operator's token could write."""
    eng = hub_engine(TUNEBOT_ADMINS="boss")
    for who in ("mallory", "boss"):
        with pytest.raises(PermissionDenied, match="TUNEBOT_HUB_NAMESPACES"):
            eng.create_job(request(push_to_hub="acme/model"), user=who, estimate=estimate_for(fake))
    assert fake.creates == 0 and eng.list_jobs() == []


def test_pushes_go_only_to_the_configured_namespaces(hub_engine, fake):
    eng = hub_engine(TUNEBOT_HUB_NAMESPACES="acme, acme-research")
    with pytest.raises(PermissionDenied, match="pushes only to acme, acme-research .* not to victim"):
        eng.create_job(request(push_to_hub="victim/prod-model"), user="mallory", estimate=estimate_for(fake))
    job = eng.create_job(
        request(push_to_hub="acme-research/tiny"), user="mallory", estimate=estimate_for(fake)
    )
    assert job.state == "running" and fake.creates == 1  # private, cheap: no approval


def test_a_public_repo_needs_an_admins_approval(hub_engine, fake):
    eng = hub_engine(TUNEBOT_HUB_NAMESPACES="acme", TUNEBOT_ADMINS="boss,ops")
    job = eng.create_job(
        request(push_to_hub="acme/tiny", hub_public=True), user="alice", estimate=estimate_for(fake)
    )
    assert job.state == "pending_approval" and fake.creates == 0  # cheap, but public
    with pytest.raises(PermissionDenied, match="own job"):
        eng.approve(job.job_id, approver="alice")
    with pytest.raises(PermissionDenied, match="only an admin approves a public Hub push"):
        eng.approve(job.job_id, approver="bob")
    assert eng.approve(job.job_id, approver="boss").state == "running"
    own = eng.create_job(
        request(push_to_hub="acme/ops", hub_public=True), user="ops", estimate=estimate_for(fake)
    )
    assert own.state == "running"  # an admin's own launch is an admin's decision


def test_no_public_repo_where_no_admin_can_approve_it(hub_engine, fake):
    eng = hub_engine(TUNEBOT_HUB_NAMESPACES="acme")
    with pytest.raises(PermissionDenied, match="needs an admin's approval, and no admin is set"):
        eng.create_job(
            request(push_to_hub="acme/tiny", hub_public=True), user="alice", estimate=estimate_for(fake)
        )
    assert eng.create_job(request(push_to_hub="acme/tiny"), user="alice", estimate=estimate_for(fake)).job_id
