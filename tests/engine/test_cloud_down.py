"""A cloud whose API does not answer (issue 27): an unreachable Vast API took 69 s to answer, printed the same
error about 18 times on one line, and left the job `recovering` with no end.

Now a call answers within its deadline (a real closed port, a fake that accepts and never answers), a launch
asks a silent cloud once and says so once, and a job waiting on such a cloud says so with a next step, then
fails with reason "cloud unreachable" instead of recovering forever.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import httpx
import pytest

from bot.planner.offer import Offer
from bot.providers.base import InstanceStatus, ProviderDownError
from bot.providers.http import HttpClient, RetryPolicy
from store.models import Instance as InstanceRow

from .conftest import request
from .fakes import FakeProvider, make_estimate


class DownProvider(FakeProvider):
    """A cloud whose API stops answering: every call raises what the HTTP layer raises for no answer."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.down = False
        self.terminate_down = False
        self.calls = 0

    def _check(self, what: str, *, only_terminate: bool = False) -> None:
        self.calls += 1
        if self.down or (only_terminate and self.terminate_down):
            error = ProviderDownError(
                f"{self.name}: {what}: connection failed (ConnectError: [Errno 111] Connection refused)",
                provider=self.name,
            )
            error.unreachable = True  # no HTTP answer at all (bot/providers/http.py)
            raise error

    def quote(self, offer: Offer) -> Offer:
        self._check("GET /offers")
        return super().quote(offer)

    def search_offers(self, query):  # type: ignore[no-untyped-def]
        self._check("GET /offers")
        return super().search_offers(query)

    def list_instances(self):  # type: ignore[no-untyped-def]
        self._check("GET /instances")
        return super().list_instances()

    def status(self, instance_id: str):  # type: ignore[no-untyped-def]
        self._check("GET /instance")
        return super().status(instance_id)

    def terminate(self, instance_id: str) -> None:
        self._check("DELETE /instance", only_terminate=True)
        super().terminate(instance_id)


@pytest.fixture
def down() -> DownProvider:
    return DownProvider()


def several_offers(provider: DownProvider, n: int = 6):  # type: ignore[no-untyped-def]
    offers = [provider.offer().model_copy(update={"offer_id": f"ask-{i}"}) for i in range(n)]
    return make_estimate(offers)


def test_a_launch_asks_a_silent_cloud_once_says_so_once_and_fails_with_a_next_step(make_engine, down) -> None:
    engine = make_engine(providers={down.name: down})
    down.down = True
    job = engine.create_job(request(), user="alice", estimate=several_offers(down))
    view = engine.get_job(job.job_id)
    assert view.state == "recovering", view
    assert down.calls == 1  # six offers of one cloud: its API was asked once, not once per offer
    message = view.message or ""
    assert message.startswith("cloud unreachable:") and message.count("connection failed") == 1, message
    assert "Next:" in message and f"`stop {job.job_id}`" in message
    for _ in range(6):  # each tick tries again, within the retry budget (3 in these tests)
        engine.tick()
    view = engine.get_job(job.job_id)
    assert view.state == "failed" and view.stop_reason in (None, "cloud unreachable"), view
    message = view.message or ""
    assert message.startswith("cloud unreachable:") and "gave up after" in message, message
    assert f"`resume {job.job_id}`" in message and message.count("connection failed") == 1
    assert down.creates == 0  # nothing rented


def test_a_lost_instance_its_cloud_cannot_confirm_gone_ends_the_job_in_time(make_engine, down, clock) -> None:
    engine = make_engine(providers={down.name: down})
    job = engine.create_job(request(), user="alice", estimate=several_offers(down, 1))
    (iid,) = list(down.instances)
    down.set_status(iid, InstanceStatus.preempted)  # outbid; then its API stops answering terminate calls
    down.terminate_down = True
    engine.tick()
    view = engine.get_job(job.job_id)
    assert view.state == "recovering"
    assert (view.message or "").startswith("cloud unreachable:"), view.message
    assert iid in (view.message or "") and "Next:" in (view.message or "")
    clock.advance(engine.settings.cloud_down_give_up_s - 60)
    engine.tick()
    assert engine.get_job(job.job_id).state == "recovering"  # still within the give-up time
    clock.advance(120)
    engine.tick()
    view = engine.get_job(job.job_id)
    assert view.state == "failed", view
    message = view.message or ""
    assert "may still be running and billing" in message and f"`resume {job.job_id}`" in message
    assert down.creates == 1  # never two instances for one job
    with engine.session() as s:  # still on the books: the reaper keeps terminating it
        (row,) = s.query(InstanceRow).filter(InstanceRow.job_id == job.job_id).all()
        assert row.ended_at is None
    down.terminate_down = False
    engine.tick()
    with engine.session() as s:
        (row,) = s.query(InstanceRow).filter(InstanceRow.job_id == job.job_id).all()
        assert row.ended_at is not None and iid in down.terminates


# --- the HTTP layer against real sockets -------------------------------------------------------------------


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: nothing listens there


@pytest.fixture
def hanging() -> Iterator[tuple[str, list[socket.socket]]]:
    """A server that accepts every connection and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            accepted.append(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}", accepted
    stop.set()
    thread.join(5)
    for conn in accepted:
        conn.close()
    server.close()


def client(url: str, **kw) -> HttpClient:  # type: ignore[no-untyped-def]
    return HttpClient(provider="vast", base_url=url, api_key="k", retry=RetryPolicy(attempts=5), **kw)


def test_a_closed_port_is_unreachable_and_said_so() -> None:
    http = client(f"http://127.0.0.1:{closed_port()}", sleep=lambda s: None)
    with pytest.raises(ProviderDownError) as err:
        http.request("GET", "/api/v0/instances/", idempotent=True)
    assert err.value.unreachable and "connection failed" in str(err.value)


def test_a_hanging_api_is_asked_within_the_calls_deadline(hanging) -> None:
    """A server that never answers: the call's deadline bounds every attempt, not five times the timeout (on
    eac3cff: five attempts of the full timeout each, and the deadline did not exist)."""
    url, accepted = hanging
    http = client(url, timeout_s=30.0, deadline_s=1.0)
    with pytest.raises(ProviderDownError) as err:
        http.request("GET", "/api/v0/bundles/", idempotent=True)
    assert err.value.unreachable and "no answer" in str(err.value)
    assert len(accepted) == 1  # one attempt used the whole deadline; no retry past it


def test_every_attempt_is_bounded_by_what_is_left_of_the_deadline() -> None:
    timeouts: list[dict] = []

    now = [0.0]

    def refuse(req: httpx.Request) -> httpx.Response:
        timeouts.append({**req.extensions["timeout"], "at": now[0]})
        raise httpx.ConnectError("refused", request=req)

    def sleep(s: float) -> None:
        now[0] += s

    http = HttpClient(
        provider="vast",
        base_url="http://vast.test",
        api_key="k",
        timeout_s=20.0,
        deadline_s=10.0,
        retry=RetryPolicy(attempts=50, base_s=1.0, max_s=4.0),
        transport=httpx.MockTransport(refuse),
        sleep=sleep,
        clock=lambda: now[0],
    )
    with pytest.raises(ProviderDownError):
        http.request("GET", "/x", idempotent=True)
    assert now[0] < 10.0  # the backoff never sleeps past the deadline
    assert len(timeouts) > 2 and timeouts[0]["read"] == 10.0
    for t in timeouts:  # each attempt: at most what is left of the call, the connection at most 5 s
        assert t["connect"] <= 5.0 and t["read"] <= 10.0 - t["at"] + 1e-9
