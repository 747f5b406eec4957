"""A fake cloud API: a real HTTP server on 127.0.0.1 with in-memory instances and injectable faults.

Usage (any test, fixture or bench)::

    with FakeVast(n_offers=50).start() as fake:
        provider = VastProvider(api_key=fake.api_key, base_url=fake.url)
        fake.inject("429", times=3)            # a burst of 429s without Retry-After
        fake.inject("429", retry_after=0.01)   # ... with one
        fake.inject("500"); fake.inject("timeout"); fake.inject("reset")
        fake.inject("create_fails")            # the create succeeds, then the response is a 500
        fake.inject("capacity")                # the cloud's own "no capacity" answer to a create
        fake.inject("echo")                    # a create refused with the request's env echoed in the error
        fake.chaos(0.1, seed=7)                # a random fault on 10% of requests from now on
        fake.preempt(instance_id)              # outbid / host failure, in the cloud's own shape
        fake.delay_s = 10.0                    # a slow cloud: every answer takes 10 s
        fake.per_request()                     # Counter of (method, path + query, body) -> times asked

Faults apply to requests whose operation (``search``, ``create``, ``status``, ``list``, ``delete``,
``volumes``, ``billing``) is in ``ops`` (default: all; ``create_fails`` and ``capacity`` only hit
creates). ``max_live_per_label`` records the most instances one label ever had alive at once.
"""

from __future__ import annotations

import itertools
import json
import random
import socket
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

FAULT_KINDS = (
    "429",
    "429_retry_after",
    "500",
    "502",
    "503",
    "timeout",
    "reset",
    "create_fails",
    "capacity",
    "echo",
)
CANNED = "response"  # inject_response(): a canned answer (the cloud's own error shapes)
CREATE_ONLY = frozenset({"create_fails", "capacity", "echo"})


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any

    @property
    def bearer(self) -> str | None:
        auth = self.headers.get("authorization", "")
        return auth[7:] if auth.lower().startswith("bearer ") else None


@dataclass
class Response:
    status: int = 200
    body: Any = None  # dict/list -> JSON; str -> text/plain; bytes raw
    headers: dict[str, str] = field(default_factory=dict)

    def encode(self) -> tuple[bytes, str]:
        if isinstance(self.body, bytes):
            return self.body, "application/octet-stream"
        if isinstance(self.body, str):
            return self.body.encode(), "text/plain"
        if self.body is None:
            return b"", "application/json"
        return json.dumps(self.body).encode(), "application/json"


@dataclass
class Fault:
    kind: str
    times: int = 1
    ops: frozenset[str] | None = None
    retry_after: float | None = None
    after: str = "500"  # what a create_fails returns after creating: "500" | "timeout" | "reset"
    response: Response | None = None  # for CANNED


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        return

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in separate writes: without this, Nagle + delayed ACK add 40 ms.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        req = Request(self.command, parts.path, query, {k.lower(): v for k, v in self.headers.items()}, body)
        result = self.server.fake.dispatch(req)
        if result is None:  # "reset": drop the connection without an answer
            self.close_connection = True
            try:
                self.connection.shutdown(2)
            except OSError:
                pass
            return
        data, ctype = result.encode()
        try:
            self.send_response(result.status)
            self.send_header("Content-Type", result.headers.pop("Content-Type", ctype))
            for k, v in result.headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _handle


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    fake: FakeCloud


class FakeCloud:
    """Shared machinery; each cloud subclass implements ``route`` (and ``capacity_response``)."""

    provider = "cloud"
    url_suffix = ""

    def __init__(
        self,
        *,
        api_key: str = "fake-key-7f3a9c1e5b",
        n_offers: int = 30,
        seed: int = 0,
        boot_polls: int = 1,
        gone_polls: int = 1,
        timeout_sleep_s: float = 0.5,
        page_size: int = 5,
    ) -> None:
        self.api_key = api_key
        self.seed = seed
        self.boot_polls = boot_polls  # status reads before an instance is running
        self.gone_polls = gone_polls  # status reads a terminated instance stays visible (where it does)
        self.timeout_sleep_s = timeout_sleep_s
        self.page_size = page_size
        self.lock = threading.RLock()
        self.instances: dict[str, dict[str, Any]] = {}
        self.volumes: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str, str]] = []  # (method, path, op)
        self.bodies: list[tuple[str, Any]] = []  # (op, decoded JSON body)
        self.asked: list[tuple[str, str, str]] = []  # (method, path?query, canonical body)
        self.delay_s = 0.0  # every answer waits this long (a slow or stalling cloud)
        self.faults: list[Fault] = []
        self.max_live_per_label: dict[str, int] = defaultdict(int)
        self.created_total = 0
        self.faults_fired: Counter[str] = Counter()  # fault kind -> how many times it hit
        self._chaos_rate = 0.0
        self._chaos_create_rate = 0.0
        self._chaos_kinds: tuple[str, ...] = FAULT_KINDS
        self._chaos_rng = random.Random(seed)
        self._ids = itertools.count(1000)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.offers = self.generate_offers(n_offers, random.Random(seed))

    # -- lifecycle -------------------------------------------------------------------------------------
    def start(self) -> FakeCloud:
        server = _Server(("127.0.0.1", 0), _Handler)
        server.fake = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.01},
            name=f"fake-{self.provider}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeCloud:
        return self if self._server else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None, "start() the fake first"
        return self._server.server_address[1]

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The base URL to configure the client with (``*_API_URL``)."""
        return self.root_url + self.url_suffix

    # -- faults ----------------------------------------------------------------------------------------
    def inject(
        self,
        kind: str,
        *,
        times: int = 1,
        ops: set[str] | frozenset[str] | None = None,
        retry_after: float | None = None,
        after: str = "500",
    ) -> None:
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault {kind!r}; one of {FAULT_KINDS}")
        if kind in CREATE_ONLY and ops is None:
            ops = frozenset({"create"})
        with self.lock:
            self.faults.append(Fault(kind, times, frozenset(ops) if ops else None, retry_after, after))

    def inject_response(
        self,
        status: int,
        body: Any,
        *,
        ops: set[str] | frozenset[str] | None = None,
        times: int = 1,
        headers: dict[str, str] | None = None,
    ) -> None:
        """Answer the next matching request(s) with this response (e.g. a cloud's own error body)."""
        with self.lock:
            self.faults.append(
                Fault(
                    CANNED,
                    times,
                    frozenset(ops) if ops else None,
                    response=Response(status, body, dict(headers or {})),
                )
            )

    def chaos(
        self,
        rate: float,
        *,
        seed: int = 0,
        kinds: tuple[str, ...] = FAULT_KINDS,
        create_fault_rate: float = 0.0,
    ) -> None:
        """From now on a random fault on ``rate`` of the requests (seeded); creates additionally fail
        after creating (3 in 4) or with "no capacity" (1 in 4) on ``create_fault_rate`` of them."""
        with self.lock:
            self._chaos_rate = rate
            self._chaos_create_rate = create_fault_rate
            self._chaos_kinds = kinds
            self._chaos_rng = random.Random(seed)

    def count(self, op: str) -> int:
        """How many requests of this operation the fake has seen."""
        with self.lock:
            return sum(1 for _, _, o in self.requests if o == op)

    def per_request(self, op: str | None = None) -> Counter[tuple[str, str, str]]:
        """How many times each distinct request (method, path with query, body) was sent."""
        with self.lock:
            pairs = zip(self.asked, self.requests, strict=True)
            return Counter(a for a, (_, _, o) in pairs if op in (None, o))

    def last_body(self, op: str) -> Any:
        with self.lock:
            return next((b for o, b in reversed(self.bodies) if o == op), None)

    def clear_faults(self) -> None:
        with self.lock:
            self.faults.clear()
            self._chaos_rate = 0.0
            self._chaos_create_rate = 0.0

    def _next_fault(self, op: str) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if fault.ops is not None and op not in fault.ops:
                    continue
                fault.times -= 1
                if fault.times <= 0:
                    self.faults.remove(fault)
                return fault
            rng = self._chaos_rng
            if op == "create" and self._chaos_create_rate and rng.random() < self._chaos_create_rate:
                kind = rng.choice(("create_fails", "create_fails", "create_fails", "capacity"))
                return Fault(kind, after=rng.choice(("500", "timeout", "reset")))
            if self._chaos_rate and self._chaos_rng.random() < self._chaos_rate:
                kinds = [k for k in self._chaos_kinds if k not in CREATE_ONLY or op == "create"]
                kind = self._chaos_rng.choice(kinds)
                after = self._chaos_rng.choice(("500", "timeout", "reset"))
                retry_after = 0.01 if kind == "429_retry_after" else None
                return Fault(kind, retry_after=retry_after, after=after)
        return None

    def _fault_response(self, fault: Fault) -> Response | None:
        kind = fault.kind
        if kind in ("429", "429_retry_after"):
            headers = {}
            retry_after = (
                fault.retry_after
                if fault.retry_after is not None
                else (0.01 if kind == "429_retry_after" else None)
            )
            if retry_after is not None:
                headers["Retry-After"] = f"{retry_after:g}"
            return Response(429, "API requests too frequent: endpoint threshold=4.5", headers)
        if kind in ("500", "502", "503"):
            return Response(int(kind), "<html>upstream error</html>")
        if kind == "timeout":
            time.sleep(self.timeout_sleep_s)
            return Response(504, "gateway timeout")
        if kind == "reset":
            return None
        if kind == CANNED and fault.response is not None:
            return Response(fault.response.status, fault.response.body, dict(fault.response.headers))
        raise AssertionError(kind)

    # -- dispatch --------------------------------------------------------------------------------------
    def authorized(self, req: Request) -> bool:
        return req.bearer == self.api_key

    def unauthorized(self, req: Request) -> Response:
        return Response(401, {"error": "unauthorized"})

    def op_of(self, req: Request) -> str:  # pragma: no cover - per cloud
        return "other"

    def dispatch(self, req: Request) -> Response | None:
        op = self.op_of(req)
        query = "&".join(f"{k}={v}" for k, v in sorted(req.query.items()))
        with self.lock:
            self.requests.append((req.method, req.path, op))
            self.bodies.append((op, req.body))
            self.asked.append((req.method, f"{req.path}?{query}", json.dumps(req.body, sort_keys=True)))
        if self.delay_s:
            time.sleep(self.delay_s)
        if not self.authorized(req):
            return self.unauthorized(req)
        fault = self._next_fault(op)
        if fault is not None:
            with self.lock:
                self.faults_fired[
                    fault.kind if fault.kind != "create_fails" else f"create_fails_{fault.after}"
                ] += 1
        if fault is not None and fault.kind not in CREATE_ONLY:
            return self._fault_response(fault)
        if fault is not None and fault.kind == "capacity":
            return self.capacity_response(req)
        if fault is not None and fault.kind == "echo":
            return self.echo_response(req)
        with self.lock:
            response = self.route(req, op)
        if fault is not None and fault.kind == "create_fails":
            return self._fault_response(Fault(fault.after))
        return response

    def route(self, req: Request, op: str) -> Response:  # pragma: no cover - per cloud
        raise NotImplementedError

    def capacity_response(self, req: Request) -> Response:  # pragma: no cover - per cloud
        raise NotImplementedError

    def echo_response(self, req: Request) -> Response:
        """A create refused by a validator that quotes what it was sent, environment first (seen in the
        wild: "invalid env: KEY=value, ...")."""
        body = req.body if isinstance(req.body, dict) else {}
        env = body.get("env") if isinstance(body.get("env"), dict) else {}
        quoted = ", ".join(f"{k}={v}" for k, v in env.items() if k != "TUNEBOT_JOB_SPEC")
        spec = str(env.get("TUNEBOT_JOB_SPEC", ""))
        return Response(
            400,
            {
                "success": False,
                "error": "invalid_args",
                "msg": f"invalid env: {quoted}; spec {spec}; request {json.dumps(body)}",
            },
        )

    # -- shared state helpers --------------------------------------------------------------------------
    def new_id(self) -> str:
        return str(next(self._ids))

    def track_created(self, label: str | None) -> None:
        """Call after adding an instance: records how many live instances its label now has."""
        self.created_total += 1
        if label:
            n = len(self.live_instances(label))
            self.max_live_per_label[label] = max(self.max_live_per_label[label], n)

    def is_live(self, inst: dict[str, Any]) -> bool:  # per cloud: not terminated/terminating
        return True

    def label_of(self, inst: dict[str, Any]) -> str | None:
        return inst.get("label")

    def live_instances(self, label: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            return [
                i
                for i in self.instances.values()
                if self.is_live(i) and (label is None or self.label_of(i) == label)
            ]

    def preempt(self, instance_id: str) -> None:  # pragma: no cover - per cloud
        raise NotImplementedError

    def generate_offers(self, n: int, rng: random.Random) -> list[dict[str, Any]]:  # per cloud
        return []

    def paginate(
        self, items: list[Any], token: str | None, limit: int | None
    ) -> tuple[list[Any], str | None]:
        """Cursor pagination over a list: token = index of the next item."""
        start = int(token) if token and token.isdigit() else 0
        size = min(limit or self.page_size, self.page_size)
        page = items[start : start + size]
        nxt = start + size
        return page, (str(nxt) if nxt < len(items) else None)


def json_error(status: int, body: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(status, body, headers or {})
