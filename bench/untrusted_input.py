"""What untrusted input costs the real server: `tunebot serve --http` as a child process, measured outside.

Usage: .venv/bin/python bench/untrusted_input.py [--root CHECKOUT] [--body-mb 200] [--bomb-mb 300]
``--root`` runs the server of another checkout (e.g. a worktree of an older commit) for a baseline.

Cases (issue 19, item 5), each printed with the server's resident memory (VmRSS) and peak (VmHWM):
  bodies    POST /runner/events with a 200 MB body (Content-Length), /slack/events with 400 MB, and
            /runner/events with 200 MB chunked (no Content-Length); the headers are well-formed but not
            valid (an unknown bearer token, a wrong signature); the status, the bytes the server took
  deep      deeply nested JSON to /runner/events and /slack/events (unsigned and signed)
  bomb      a Slack upload of one 300 MB line compressed to ~300 KB, served gzip-encoded as data.jsonl
            and as data.jsonl.gz, estimated with `/tune estimate ... dataset=slack:F...`
  blocking  six users estimate a dataset served slowly (20 s) while a seventh asks `/tune jobs`:
            how long the seventh waits for its answer
Targets: 413/401 before the body is read; 400 (never 500) for bad JSON; RSS growth < 50 MB in every case;
`/tune jobs` answered in < 2 s.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from fakes.serve_process import ServeProcess, raw_post, sign, zeros  # noqa: E402
from fakes.slack_api import FakeSlack  # noqa: E402

TOKEN = "A" * 43  # the shape of secrets.token_urlsafe(32), belonging to no job


def gzip_line(mb: int) -> bytes:
    packer = zlib.compressobj(6, zlib.DEFLATED, 31)
    parts = [packer.compress(b'{"text": "')]
    block = b"a" * (1 << 20)
    parts += [packer.compress(block) for _ in range(mb)]
    return b"".join([*parts, packer.compress(b'"}\n'), packer.flush()])


class SlowFiles:
    """An HTTP file server that sends a small jsonl dataset one line per second."""

    def __init__(self, lines: int = 20) -> None:
        self.lines = lines
        self.paths: list[str] = []
        files = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def do_HEAD(self) -> None:  # noqa: N802
                files.paths.append("HEAD " + self.path)
                self.send_response(404)
                self.end_headers()

            def do_GET(self) -> None:  # noqa: N802
                files.paths.append(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.end_headers()
                try:
                    for i in range(files.lines):
                        self.wfile.write((json.dumps({"text": f"slow line {i} " * 20}) + "\n").encode())
                        self.wfile.flush()
                        time.sleep(1.0)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args: object) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: object, client_address: object) -> None:
                pass  # a client that hung up mid-file (the bot's read stopping) is expected here

        self.server = Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


def bodies(server: ServeProcess, mb: int) -> list[dict]:
    rows = []
    runner = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    slack = {**sign(b"not this body"), "Content-Type": "application/json"}
    cases = [
        ("/runner/events", mb, runner, False),
        ("/slack/events", 2 * mb, slack, False),
        ("/runner/events", mb, runner, True),
        ("/slack/events", mb, slack, True),
    ]
    for path, size, headers, chunked in cases:
        before = server.rss_mb()
        hdrs = dict(headers) if chunked else {**headers, "Content-Length": str(size << 20)}
        result = raw_post(server.port, path, hdrs, zeros(size << 20), chunked=chunked, timeout=120)
        time.sleep(1.0)
        rows.append(
            {
                "case": f"{path} {size} MB{' chunked' if chunked else ''}",
                "status": result["status"],
                "sent_mb": result["sent"] / 2**20,
                "seconds": result["seconds"],
                "rss_before": before,
                "rss_after": server.rss_mb(),
                "peak": server.peak_mb(),
            }
        )
    return rows


def deep(server: ServeProcess) -> list[dict]:
    import httpx

    nested = "[" * 100_000 + "]" * 100_000
    out = []
    r = httpx.post(
        server.url + "/runner/events",
        content=nested,
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=30,
    )
    out.append({"case": "/runner/events nested 100k", "status": r.status_code})
    r = httpx.post(
        server.url + "/slack/events",
        content=nested,
        headers={"Content-Type": "application/json", **sign(b"x")},
        timeout=30,
    )
    out.append({"case": "/slack/events nested, unsigned", "status": r.status_code})
    r = httpx.post(
        server.url + "/slack/events",
        content=nested,
        headers={"Content-Type": "application/json", **sign(nested)},
        timeout=30,
    )
    out.append({"case": "/slack/events nested, signed", "status": r.status_code})
    out.append({"case": "tracebacks in the server log", "status": server.output().count("Traceback")})
    return out


def bomb(server: ServeProcess, slack: FakeSlack, mb: int) -> list[dict]:
    data = gzip_line(mb)
    slack.add_file("F0BOMBENC1", "data.jsonl", data, user="U_EVE", content_encoding="gzip")
    slack.add_file("F0BOMBGZ01", "data.jsonl.gz", data, user="U_EVE")
    rows = []
    for fid in ("F0BOMBENC1", "F0BOMBGZ01"):
        before, peak_before = server.rss_mb(), server.peak_mb()
        n = len(slack.of("response"))
        started = time.monotonic()
        server.command(
            f"estimate llama-3.1-8b dataset=slack:{fid}", user="U_EVE", response_url=slack.response_url()
        )
        try:
            reply = slack.wait_for("response", n + 1, timeout=300)[n].body.get("text", "")
        except AssertionError:
            reply = "(no answer)"
        rows.append(
            {
                "case": f"{fid} ({len(data) / 1e3:.0f} KB -> {mb} MB line)",
                "seconds": time.monotonic() - started,
                "rss_before": before,
                "rss_after": server.rss_mb(),
                "peak_before": peak_before,
                "peak": server.peak_mb(),
                "reply": reply[:160],
            }
        )
    return rows


def blocking(server: ServeProcess, slack: FakeSlack, files: SlowFiles) -> dict:
    n = len(slack.of("response"))
    for i in range(6):
        server.command(
            f"estimate llama-3.1-8b dataset={files.url}/slow/data{i}.jsonl",
            user=f"U_SLOW{i}",
            response_url=slack.response_url(f"slow{i}"),
        )
    time.sleep(1.5)  # the six are past their acks and reading
    started = time.monotonic()
    server.command("jobs", user="U_OTHER", response_url=slack.response_url("other"))
    deadline = started + 60
    waited = None
    while time.monotonic() < deadline:
        if any(c.path.endswith("/other") for c in slack.of("response")[n:]):
            waited = time.monotonic() - started
            break
        time.sleep(0.05)
    return {"jobs_answer_s": waited}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", type=Path, default=ROOT)
    parser.add_argument("--body-mb", type=int, default=200)
    parser.add_argument("--bomb-mb", type=int, default=300)
    parser.add_argument("--skip", nargs="*", default=[])
    args = parser.parse_args()
    files = SlowFiles()
    with tempfile.TemporaryDirectory(prefix="tunebot-untrusted-") as tmp, FakeSlack() as slack:
        slack.token = "xoxb-serve-process-token"
        env = {"TUNEBOT_CHAT_STORAGE_PREFIXES": f"{files.url}/slow/"}
        with ServeProcess(Path(tmp), slack_api=slack.api_url, env=env, root=args.root) as server:
            print(f"server {args.root} pid {server.pid}: RSS {server.rss_mb():.0f} MB after start-up")
            if "bodies" not in args.skip:
                for row in bodies(server, args.body_mb):
                    print(
                        f"  {row['case']:36s} status {row['status']}  took {row['sent_mb']:7.1f} MB in "
                        f"{row['seconds']:5.1f} s  RSS {row['rss_before']:.0f} -> {row['rss_after']:.0f} MB"
                        f" (peak {row['peak']:.0f} MB)"
                    )
            if "deep" not in args.skip:
                for row in deep(server):
                    print(f"  {row['case']:36s} {row['status']}")
            if "bomb" not in args.skip:
                for row in bomb(server, slack, args.bomb_mb):
                    print(
                        f"  {row['case']:36s} {row['seconds']:5.1f} s  RSS {row['rss_before']:.0f} -> "
                        f"{row['rss_after']:.0f} MB, peak {row['peak_before']:.0f} -> {row['peak']:.0f} MB"
                    )
                    print(f"      reply: {row['reply']!r}")
            if "blocking" not in args.skip:
                got = blocking(server, slack, files)
                waited = got["jobs_answer_s"]
                shown = f"{waited:.2f} s" if waited is not None else "no answer in 60 s"
                print(f"  `/tune jobs` with six slow estimates in flight: answered after {shown}")


if __name__ == "__main__":
    main()
