"""The end-to-end worlds the tests run in, built in one place from a few parameters. Each is made of:

- ``slack_world(engine)``: a given engine (the chat tests' FakeEngine, or a real one) behind the whole Slack
  app: fake Slack Web API + ChatHandlers + SlackNotifier + HomePublisher + the bolt app, served by bot.web
  under uvicorn on 127.0.0.1 (``notifier=False``: the bolt app alone). A ``SlackStack`` sends it signed
  requests as Slack does.
- ``engine_slack_world(root, providers)``: the same on the real Engine (SQLite under ``root``, real planner),
  configured from Settings as `tunebot serve` is (TUNEBOT_ADMINS=U_ADMIN unless given);
  ``engine_slack_worlds(root)`` makes them with in-memory clouds and given settings.
- ``host_world(...)`` / ``HostWorld``: that Slack world whose cloud is the fake Vast API, its instances real
  sandboxed hosts (fakes/remote_host.py), checkpoints in S3; ``sts_host_world`` (the ``world`` fixture
  ``sts_world``): the same for two tenants on one bucket whose store enforces STS credentials, with what a
  host's owner can do (``as_host``, ``attempt``, ``RunsCode``).
- ``console_world(tmp, tiny, cadence)`` / ``ConsoleWorld``: ChatHandlers as the CLI console drives them, on
  the real engine with the local provider, training a tiny model for real.
- ``serve_web(...)``: bot.web alone under uvicorn.

Each test keeps its own database and data dir: the builders take the test's folder. What is immutable and
costly (the tiny model) is the caller's to share (tests/chat/conftest.py: ``tiny_model``, once a session).
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from fakes.slack_api import FakeSlack, UvicornThread
from slack_sdk.signature import SignatureVerifier

BOT_TOKEN = "xoxb-FAKE-BOT-TOKEN-7d1e5c"
SIGNING_SECRET = "FAKE-SIGNING-SECRET-93ab11"
RUNNER_TOKEN = "JOBTOKEN-FAKE-5f00d"
ADMIN = "U_ADMIN"


def sign(body: str, *, secret: str = SIGNING_SECRET, timestamp: int | None = None) -> dict[str, str]:
    ts = str(int(time.time()) if timestamp is None else timestamp)
    signature = SignatureVerifier(secret).generate_signature(timestamp=ts, body=body)
    return {"X-Slack-Request-Timestamp": ts, "X-Slack-Signature": signature}


def estimate_id_from(message: dict) -> str:
    """The estimate id an estimate card's Launch buttons carry."""
    for block in message["blocks"]:
        if block["type"] == "actions":
            return block["elements"][0]["value"]
    raise AssertionError("no launch buttons")


def ticked_until(engine: Any, done: Callable[[], bool], timeout: float) -> bool:
    """Tick ``engine`` every 0.3 s until ``done()`` (True) or ``timeout`` seconds have passed (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        engine.tick()
        if done():
            join_finisher()  # what a job's end announces is said too, not only committed
            return True
        time.sleep(0.3)
    return False


def join_finisher(job_id: str = "") -> None:
    """Wait for the thread a pushed terminal event starts to end its job (Engine._finish_if_reported; every
    job's when ``job_id`` is empty): when it wins, it commits the final state and then announces it, so
    reading what was announced as soon as the job is final could come between the two (seen in parallel
    runs and in CI)."""
    import threading

    for thread in threading.enumerate():
        if thread.name == f"finish-{job_id}" or (not job_id and thread.name.startswith("finish-")):
            thread.join(60)
            assert not thread.is_alive(), f"{thread.name} still runs after 60 s"


# --- Slack ------------------------------------------------------------------------------------------------
def listeners_settled(timeout: float = 30.0) -> None:
    """Wait until the work the Slack listeners handed to tasks after their acks (bot.chat.slack.common.spawn)
    has ended. Listeners ack after they ran (process_before_response), so once a request's response or a
    Socket Mode ack came back, what it started is in that set until it ends: this ends the wait on an event
    (nothing left) where a sleep would guess how long a task takes."""
    from bot.chat.slack import common

    deadline = time.monotonic() + timeout
    while common._background:
        if time.monotonic() > deadline:
            left = len(common._background)
            raise AssertionError(f"{left} listener task(s) still running after {timeout:g} s")
        time.sleep(0.02)


def slash_command(slack: FakeSlack, text: str, *, user: str, channel: str) -> dict[str, str]:
    """A `/tune` slash command's fields as Slack sends them (HTTP form-encodes them, Socket Mode not)."""
    return {
        "token": "legacy",
        "team_id": "T1",
        "channel_id": channel,
        "user_id": user,
        "user_name": user.lower(),
        "command": "/tune",
        "text": text,
        "response_url": slack.response_url(),
        "trigger_id": f"trig-{time.time_ns()}",
        "api_app_id": "A1",
    }


def block_action(slack: FakeSlack, action_id: str, value: str, *, user: str, channel: str) -> dict[str, Any]:
    """A button click's payload (block_actions) as Slack sends it."""
    return {
        "type": "block_actions",
        "team": {"id": "T1"},
        "user": {"id": user, "name": user.lower()},
        "api_app_id": "A1",
        "channel": {"id": channel},
        "trigger_id": f"trig-{time.time_ns()}",
        "container": {"type": "message", "is_ephemeral": True},
        "response_url": slack.response_url(),
        "actions": [
            {
                "type": "button",
                "action_id": action_id,
                "block_id": "b1",
                "value": value,
                "action_ts": f"{time.time():.6f}",
            }
        ],
    }


@dataclass
class SlackStack:
    """A served Slack app: ``command()`` / ``click()`` / ``event()`` send correctly signed requests like Slack
    does; ``cloud`` is the first in-memory cloud of a real-engine world."""

    slack: FakeSlack
    engine: Any
    chat: Any
    notifier: Any
    url: str
    http: httpx.Client
    home: Any = None
    cloud: Any = None

    def command(
        self,
        text: str,
        *,
        user: str = "U_ALICE",
        channel: str = "C1",
        headers: dict | None = None,
        signature: dict | None = None,
    ) -> httpx.Response:
        body = urlencode(slash_command(self.slack, text, user=user, channel=channel))
        hdrs = {
            "Content-Type": "application/x-www-form-urlencoded",
            **(signature or sign(body)),
            **(headers or {}),
        }
        return self.http.post(self.url + "/slack/events", content=body, headers=hdrs)

    def action_payload(
        self, action_id: str, value: str, *, user: str = "U_ALICE", channel: str = "C1"
    ) -> dict:
        return block_action(self.slack, action_id, value, user=user, channel=channel)

    def click(self, payload: dict, *, headers: dict | None = None) -> httpx.Response:
        body = urlencode({"payload": json.dumps(payload)})
        hdrs = {"Content-Type": "application/x-www-form-urlencoded", **sign(body), **(headers or {})}
        return self.http.post(self.url + "/slack/events", content=body, headers=hdrs)

    def event(
        self, event: dict, *, headers: dict | None = None, event_id: str | None = None
    ) -> httpx.Response:
        body = json.dumps(
            {
                "token": "legacy",
                "team_id": "T1",
                "api_app_id": "A1",
                "type": "event_callback",
                "event": event,
                "event_id": event_id or f"Ev{time.time_ns()}",
                "event_time": int(time.time()),
            }
        )
        hdrs = {"Content-Type": "application/json", **sign(body), **(headers or {})}
        return self.http.post(self.url + "/slack/events", content=body, headers=hdrs)

    def responses(self, n: int = 1, timeout: float = 15.0) -> list[dict[str, Any]]:
        return [c.body for c in self.slack.wait_for("response", n, timeout)]

    def said(self, send: Callable[[], httpx.Response]) -> str:
        """Send a signed request; the text of the reply that follows it (ack or response_url)."""
        before = len(self.slack.of("response"))
        resp = send()
        assert resp.status_code == 200, resp.text
        body = (
            resp.json()
            if resp.content and resp.headers.get("content-type", "").startswith("application/json")
            else {}
        )
        if body.get("text") and not body["text"].startswith(":hourglass:"):
            return str(body["text"])
        return str(self.responses(before + 1)[before].get("text", ""))

    def estimate(self, text: str, *, user: str = "U_ALICE", channel: str = "C1") -> str:
        """`/tune estimate TEXT`; the estimate id of its card."""
        before = len(self.slack.of("response"))
        assert self.command(f"estimate {text}", user=user, channel=channel).status_code == 200
        return estimate_id_from(self.responses(before + 1)[before])

    def launch(
        self, text: str, *, user: str = "U_ALICE", channel: str = "C1", choice: str = "cheapest"
    ) -> str:
        """`/tune estimate TEXT`, then its Launch button; the text of the answer."""
        eid = self.estimate(text, user=user, channel=channel)
        return self.said(
            lambda: self.click(self.action_payload(f"launch_{choice}", eid, user=user, channel=channel))
        )


@contextmanager
def _served(
    slack: FakeSlack,
    engine: Any,
    chat: Any,
    bolt: Any,
    notifier: Any,
    record_runner_event: Callable[..., bool],
    *,
    home: Any = None,
    http_timeout: float = 20,
) -> Iterator[SlackStack]:
    from bot.web import create_app

    web = create_app(bolt_app=bolt, record_runner_event=record_runner_event)
    with UvicornThread(web) as server, httpx.Client(timeout=http_timeout) as http:
        yield SlackStack(slack, engine, chat, notifier, server.url, http, home)


@contextmanager
def slack_world(
    engine: Any,
    *,
    admins: tuple[str, ...] = (ADMIN,),
    notifier: bool = True,
    sources: Any = None,
    record_runner_event: Callable[..., bool] | None = None,
) -> Iterator[SlackStack]:
    """A given engine behind the whole Slack app: fake Slack Web API + ChatHandlers (these ``admins``, the
    Slack tokens as its secrets, ``sources`` if given) + the bolt app, served by bot.web under uvicorn.
    ``notifier``: with people's names (users.info), App Home (HomePublisher) and the SlackNotifier on the
    engine's bus (summary channel C_SUMMARY), as `tunebot serve` wires them; without: the bolt app alone.
    /runner/events takes ``record_runner_event`` (default: the job token RUNNER_TOKEN is good)."""
    from bot.chat.handlers import ChatHandlers
    from bot.chat.notifier import SlackNotifier
    from bot.chat.people import People
    from bot.chat.permissions import Permissions
    from bot.chat.slack.app import build_app, make_async_client, make_sync_client
    from bot.chat.slack.home import HomePublisher
    from bot.settings import Settings

    def token_is_good(job_id: str, token: str, payload: dict) -> bool:
        return token == RUNNER_TOKEN

    with FakeSlack() as slack:
        extra = {} if sources is None else {"sources": sources}
        chat = ChatHandlers(
            engine, Permissions(admins=frozenset(admins)), secrets=[BOT_TOKEN, SIGNING_SECRET], **extra
        )
        settings = Settings(SLACK_BOT_TOKEN=BOT_TOKEN, SLACK_API_URL=slack.api_url)
        record = record_runner_event or token_is_good
        if not notifier:
            bolt = build_app(chat, client=make_async_client(settings), signing_secret=SIGNING_SECRET)
            with _served(slack, engine, chat, bolt, None, record) as stack:
                yield stack
            return
        sync_client = make_sync_client(settings)
        chat.names = People.slack(sync_client)  # as `tunebot serve` does: users.info, cached
        home = HomePublisher(chat, sync_client, admins=list(admins), min_interval_s=1.0, spacing_s=0.05)
        home.start()
        notes = SlackNotifier(
            engine,
            sync_client,
            summary_channel="C_SUMMARY",
            admins=list(admins),
            update_every_s=1.0,
            chart_every_s=0.0,
            names=chat.names,
            home=home,
        )
        bolt = build_app(chat, client=make_async_client(settings), signing_secret=SIGNING_SECRET, home=home)
        notes.attach(engine.bus).start()
        with _served(slack, engine, chat, bolt, notes, record, home=home) as stack:
            yield stack
        notes.stop()
        home.stop()


@contextmanager
def engine_slack_world(
    root: Path,
    providers: dict[str, Any],
    *,
    chat_data_dir: Path | None = None,
    uploads: bool = False,
    http_timeout: float = 20,
    **env: Any,
) -> Iterator[SlackStack]:
    """The real Engine (its data dir ``root``/data, its SQLite database ``root``/db.sqlite, the real planner,
    these ``providers``) behind the Slack app, all configured from Settings as `tunebot serve` does: the fake
    Slack Web API, ChatHandlers (permissions, secrets and data sources from the settings), the bolt app and
    the SlackNotifier (the settings' admins), served by bot.web under uvicorn, /runner/events recorded by the
    engine. Settings: TUNEBOT_CHAT_DATA_DIR=``chat_data_dir`` (default ``root``), TUNEBOT_ADMINS=U_ADMIN
    unless given, then ``env``. ``uploads``: Slack uploads are read (files.info + download, the bot token)."""
    from bot.chat.handlers import ChatHandlers
    from bot.chat.notifier import SlackNotifier
    from bot.chat.permissions import Permissions
    from bot.chat.slack.app import build_app, make_async_client, make_sync_client
    from bot.chat.slack.files import SlackFiles
    from bot.engine.service import Engine
    from bot.planner.sources import SourcePolicy
    from bot.settings import Settings

    with ExitStack() as close:
        slack = close.enter_context(FakeSlack())
        if uploads:
            slack.token = BOT_TOKEN
        settings = Settings(
            TUNEBOT_DATA_DIR=str(root / "data"),
            TUNEBOT_CHAT_DATA_DIR=str(chat_data_dir or root),
            SLACK_BOT_TOKEN=BOT_TOKEN,
            SLACK_API_URL=slack.api_url,
            SLACK_SIGNING_SECRET=SIGNING_SECRET,
            **{"TUNEBOT_ADMINS": ADMIN, **env},
        )
        engine = Engine(settings, db_url=f"sqlite:///{root / 'db.sqlite'}", providers=providers)
        close.callback(engine.close)
        policy = Permissions.from_settings(settings)
        files = {"files": SlackFiles.from_settings(settings, make_sync_client(settings))} if uploads else {}
        chat = ChatHandlers(
            engine,
            policy,
            secrets=settings.secrets(),
            sources=SourcePolicy.from_settings(settings),
            **files,
        )
        bolt = build_app(chat, client=make_async_client(settings), signing_secret=SIGNING_SECRET)
        notifier = SlackNotifier(
            engine,
            make_sync_client(settings),
            admins=sorted(policy.admins),
            update_every_s=1.0,
            chart_every_s=0.0,
        )
        notifier.attach(engine.bus).start()
        close.callback(notifier.stop)
        yield close.enter_context(
            _served(
                slack, engine, chat, bolt, notifier, engine.record_runner_event, http_timeout=http_timeout
            )
        )


@contextmanager
def engine_slack_worlds(root: Path, **defaults: Any) -> Iterator[Callable[..., SlackStack]]:
    """A maker of ``engine_slack_world(root, ...)`` worlds: ``make(clouds=[...], **env)`` (clouds: in-memory
    ones, default vast at $0.40/h with volumes; ``stack.cloud`` is the first), ``defaults`` under ``env``;
    every world made is closed at the end."""
    from engine.fakes import FakeProvider

    with ExitStack() as worlds:

        def make(*, clouds: list[Any] | None = None, **env: Any) -> SlackStack:
            clouds = clouds or [FakeProvider("vast", price=0.40, volumes=True)]
            providers = {c.name: c for c in clouds}
            stack = worlds.enter_context(engine_slack_world(root, providers, **{**defaults, **env}))
            stack.cloud = clouds[0]
            return stack

        yield make


@contextmanager
def serve_web(**create_app_kwargs: Any) -> Iterator[UvicornThread]:
    """bot.web's app alone (``create_app(**create_app_kwargs)``) under uvicorn on 127.0.0.1."""
    from bot.web import create_app

    with UvicornThread(create_app(**create_app_kwargs)) as server:
        yield server


# --- a rented host ----------------------------------------------------------------------------------------


class HostWorld:
    """The Slack world on the real engine whose cloud is the fake Vast API: its instances are real sandboxed
    hosts (``hosts``, fakes/remote_host.py); ``bot`` is the bot's own folder (data dir, database, ``tiny``:
    the tiny model and its datasets), out of the hosts' reach."""

    def __init__(
        self, stack: SlackStack, vast: Any, hosts: Any, hub: Any, bot: Path, tiny: Path, **extra: Any
    ) -> None:
        self.stack, self.engine, self.vast, self.hosts, self.hub = stack, stack.engine, vast, hosts, hub
        self.bot, self.tiny = bot, tiny
        for name, value in extra.items():
            setattr(self, name, value)

    def launch(self, options: str, user: str) -> str:
        """`/tune launch` with these options, then the "Launch cheapest" button; returns the job id."""
        from bot.chat.blockkit import violations

        before = len(self.stack.slack.of("response"))
        assert self.stack.command(f"launch {self.tiny / 'model'} {options}", user=user).status_code == 200
        reply = self.stack.responses(before + 1, timeout=60)[before]
        assert not violations(reply), reply
        assert "Training:" in str(reply["blocks"]), "the estimate card lists the training plan"
        self.stack.click(self.stack.action_payload("launch_cheapest", estimate_id_from(reply), user=user))
        answer = self.stack.responses(before + 2, timeout=60)[before + 1]
        assert "Launching job" in answer["text"], answer
        (job,) = [j for j in self.engine.list_jobs(user=user)]
        return job.job_id

    def instances(self, job_id: str) -> list[Any]:
        from sqlalchemy import select

        from store.models import Instance

        with self.engine.session() as s:
            return list(
                s.execute(select(Instance).where(Instance.job_id == job_id).order_by(Instance.id)).scalars()
            )

    def tick_until(self, done: Callable[[], bool], what: str, timeout: float = 240.0) -> None:
        if ticked_until(self.engine, done, timeout):
            return
        logs = {i: self.hosts.log(i)[-3000:] for i in self.hosts.hosts}
        raise AssertionError(f"timed out waiting for {what}; host logs: {logs}")

    def wait_for_step(self, instance_id: str, step: int, timeout: float = 120.0) -> None:
        """Poll the host's log (not the engine: training a tiny model is faster than a tick)."""
        deadline = time.monotonic() + timeout
        while self.runner_step(instance_id) < step:
            assert time.monotonic() < deadline, self.hosts.log(instance_id)[-3000:]
            time.sleep(0.01)

    def runner_step(self, instance_id: str) -> int:
        steps = [
            int(line.split()[1].split("/")[0])
            for line in self.hosts.log(instance_id).splitlines()
            if line.startswith("step ")
        ]
        return max(steps, default=0)

    def state(self, job_id: str) -> str:
        return self.engine.get_job(job_id).state

    def thread_text(self, job_id: str) -> str:
        self.stack.notifier.drain(20)
        ts = self.engine.get_job(job_id).thread_ts
        posts = [c.body for c in self.stack.slack.of("chat.postMessage") if c.body.get("thread_ts") == ts]
        return " | ".join(p["text"] for p in posts)

    def adapter(self, uri: str, into: Path) -> Any:
        """The output folder from the bucket, loaded with peft on the tiny base model."""
        import fsspec
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        fs, root = fsspec.core.url_to_fs(uri)
        fs.get(root.rstrip("/") + "/", str(into), recursive=True)
        base = AutoModelForCausalLM.from_pretrained(str(self.tiny / "model"))
        return PeftModel.from_pretrained(base, str(into))


@contextmanager
def host_world(bot: Path, tiny: Path, hosts: Any, *, hub: Any = None, **env: Any) -> Iterator[HostWorld]:
    """``engine_slack_world`` in ``bot`` (members name the files in ``tiny``) whose one cloud is a fake Vast
    API (40 offers, seed 3) renting from ``hosts``; TUNEBOT_MIN_RELIABILITY=0 (every offer may be rented),
    progress lines every 0.5 s (to preempt mid-run), then ``env``. Instances are given 20 s to stop."""
    from fakes.clouds import FakeVast
    from fakes.clouds.fixtures import client_for

    vast = FakeVast(hosts=hosts, n_offers=40, seed=3).start()
    settings = {"TUNEBOT_MIN_RELIABILITY": 0.0, "TUNEBOT_REPORT_EVERY": 0.5, **env}
    try:
        with engine_slack_world(
            bot, {"vast": client_for(vast)}, chat_data_dir=tiny, http_timeout=60, **settings
        ) as stack:
            stack.engine.terminate_deadline_s = 20.0
            yield HostWorld(stack, vast, hosts, hub, bot, tiny)
    finally:
        hosts.close()
        vast.stop()


@contextmanager
def sts_host_world(tmp: Path, sts_server: Any, monkeypatch: Any, *, scoped: bool) -> Iterator[HostWorld]:
    """``host_world`` for two tenants on one bucket: the bot in ``tmp``/bot with the tiny model and Bob's own
    dataset (bob.jsonl), hosts that start a team's prebuilt runner image (TUNEBOT_RUNNER_IMAGE), storage on
    moto with authentication, session policies and expiry (fakes/moto_sts.StsWorld: ``world.store``, its
    keys in this process's environment). ``scoped``: each launch gets STS credentials for its own folder
    (60 s, renewed at half-life); else every host gets the bot's static keys. Costs up to $100 need no one's
    approval."""
    import sys

    import s3fs
    from fakes.moto_sts import StsWorld
    from fakes.remote_host import HostPool

    from runner.tiny import make_tiny

    store = StsWorld(sts_server)
    for key, value in store.env.items():
        monkeypatch.setenv(key, value)
    s3fs.S3FileSystem.clear_instance_cache()
    bot = tmp / "bot"
    tiny = make_tiny(bot / "tiny").parent
    records = [json.loads(line) for line in (tiny / "data.jsonl").read_text().splitlines()]
    with (tiny / "bob.jsonl").open("w") as fh:  # B's own data: A must not read it
        for r in records:
            fh.write(json.dumps({**r, "output": r["output"] + " (bob)"}) + "\n")
    image = "ghcr.io/acme/tunebot-runner:1"  # a team's prebuilt runner image (TUNEBOT_RUNNER_IMAGE)
    hosts = HostPool(
        tmp / "hosts",
        images={image: [str(Path(sys.executable).parent / "tunebot-runner")]},
        bot_roots=[bot],
    )
    try:
        with host_world(
            bot,
            tiny,
            hosts,
            TUNEBOT_CHECKPOINT_URI=f"s3://{store.bucket}/tunebot",
            TUNEBOT_RUNNER_IMAGE=image,
            TUNEBOT_STORAGE_CREDENTIALS="assume-role" if scoped else "static",
            TUNEBOT_STORAGE_ROLE_ARN=store.role_arn,
            TUNEBOT_STORAGE_CREDENTIALS_SECONDS=60,  # renewed at half-life while the jobs run
            TUNEBOT_MAX_COST_LIMIT=100,
            **store.env,
        ) as world:
            world.store, world.scoped = store, scoped  # type: ignore[attr-defined]
            yield world
    finally:
        s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture(name="world", params=["scoped", "static"])
def sts_world(
    request: pytest.FixtureRequest, tmp_path: Path, sts_server: Any, monkeypatch: pytest.MonkeyPatch
) -> Iterator[HostWorld]:
    """The ``world`` fixture of the tests that import it (with fakes.moto_sts.sts_server): ``sts_host_world``
    with scoped credentials, then with static ones."""
    with sts_host_world(tmp_path, sts_server, monkeypatch, scoped=request.param == "scoped") as world:
        yield world


# --- what a host's owner can do with the instance's environment -------------------------------------------


class RunsCode:
    """Pickled into a checkpoint's optimizer.pt: unpickling it runs code (it writes ``marker``)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


def as_host(env: dict[str, str], endpoint: str) -> Any:
    """The filesystem a host owner gets from the instance's environment."""
    import s3fs

    return s3fs.S3FileSystem(
        key=env["AWS_ACCESS_KEY_ID"],
        secret=env["AWS_SECRET_ACCESS_KEY"],
        token=env.get("AWS_SESSION_TOKEN"),
        skip_instance_cache=True,
        client_kwargs={"endpoint_url": endpoint, "region_name": "eu-west-1"},
    )


def attempt(fn: Any) -> str:
    """What ``fn`` came to: "done", or "refused (PermissionError)" (or OSError) where the store said no."""
    try:
        fn()
    except (PermissionError, OSError) as exc:
        return f"refused ({type(exc).__name__})"
    return "done"


# --- the CLI console --------------------------------------------------------------------------------------


def console_text(reply: Any) -> str:
    """A reply as the CLI console prints it, white space folded."""
    from bot.chat.terminal import cli_console, render

    buf = io.StringIO()
    render(reply, cli_console(buf))
    return " ".join(buf.getvalue().split())


class ConsoleWorld:
    """ChatHandlers as the CLI console drives them (an operator, ``alice``), on the real engine (SQLite and
    data dir in ``tmp``) with the local provider at $50/h (seconds of CPU cost cents: enough for a cap to
    bite mid-run), approval above $50; jobs train the tiny model in ``tiny`` for real, their checkpoint and
    report cadence ``cadence`` (spec overrides). ``events``: what the engine's bus published."""

    def __init__(self, tmp: Path, tiny: Path, cadence: dict[str, Any]) -> None:
        from bot.chat.handlers import Actor, ChatHandlers
        from bot.chat.permissions import Permissions
        from bot.engine.service import Engine
        from bot.providers.local import LocalProvider
        from bot.settings import Settings

        self.alice = Actor("alice", None, operator=True)
        self.model, self.data = tiny / "model", tiny / "data.jsonl"
        self.local = LocalProvider(
            workdir=tmp / "local", price_per_hour=50.0, extra_env={"PYTHONUNBUFFERED": "1"}
        )
        settings = Settings(
            TUNEBOT_DATA_DIR=str(tmp / "data"),
            TUNEBOT_RECONCILE_EVERY=1.0,
            TUNEBOT_HEARTBEAT_TIMEOUT=300,
            TUNEBOT_APPROVAL_ABOVE=50.0,
        )
        self.engine = Engine(
            settings, db_url=f"sqlite:///{tmp / 'db.sqlite'}", providers={"local": self.local}
        )
        self.chat = ChatHandlers(
            self.engine, Permissions(approval_above=50.0), job_options={"spec_overrides": cadence}
        )
        self.events: list[Any] = []
        self.engine.bus.subscribe(self.events.append)

    def say(self, line: str) -> Any:
        return self.chat.handle_text(line, self.alice)

    def launch(self, line: str) -> str:
        """`launch ...` (or `clone ...`), then the cheapest offer's button; the new job's id."""
        from bot.chat.replies import Buttons

        reply = self.say(line)
        buttons = [b for p in reply.parts if isinstance(p, Buttons) for b in p.buttons]
        assert buttons, console_text(reply)
        launched = self.chat.launch(buttons[0].value, "cheapest", self.alice)
        assert launched.kind == "success", console_text(launched)
        return next(j.job_id for j in self.engine.list_jobs(user="alice"))  # newest first

    def until(self, done: Callable[[], bool], what: str, timeout: float = 480) -> None:
        if ticked_until(self.engine, done, timeout):
            return
        jobs = [(j.job_id, j.state, j.step, j.checkpoint_step, j.message) for j in self.engine.list_jobs()]
        raise AssertionError(f"timed out waiting for {what}: {jobs}\n{self.runner_logs()}")

    def runner_logs(self) -> str:
        return "\n".join(f"{p}:\n{p.read_text()[-3000:]}" for p in sorted(self.local.workdir.rglob("*.log")))

    def job(self, job_id: str) -> Any:
        return self.engine.get_job(job_id)

    def close(self) -> None:
        for inst in self.local.list_instances():
            self.local.terminate(inst.instance_id)
        self.engine.close()


@contextmanager
def console_world(tmp: Path, tiny: Path, cadence: dict[str, Any]) -> Iterator[ConsoleWorld]:
    world = ConsoleWorld(tmp, tiny, cadence)
    try:
        yield world
    finally:
        world.close()
