"""Fixtures for the runner tests (each engineer appends; names are prefixed by area)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# --- data pipeline fixtures (runner/data) -----------------------------------------------------------

DATA_SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
DATA_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
_DATA_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Below is an instruction that describes a task.",
    "Write a response that appropriately completes the request.",
    "### Instruction:\n### Input:\n### Response:\n",
    "What is two plus two? Four. Hello world. The capital of France is Paris.",
    "system user assistant: be brief, answer the question, translate to French.",
]


@pytest.fixture(scope="session")
def data_tokenizer() -> Any:
    """A byte-level BPE tokenizer trained here (vocab ~400) with BOS/EOS/PAD and a simple chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=DATA_SPECIAL_TOKENS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_DATA_CORPUS * 10, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        chat_template=DATA_CHAT_TEMPLATE,
    )


@pytest.fixture(scope="session")
def data_tiny_llama(data_tokenizer: Any) -> Callable[[str], Any]:
    """Factory: the same tiny random Llama (seed 0, float32, eval mode) for an attention implementation."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    def build(attn: str = "sdpa") -> Any:
        config = LlamaConfig(
            vocab_size=len(data_tokenizer),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
        )
        config._attn_implementation = attn
        torch.manual_seed(0)
        return LlamaForCausalLM(config).eval()

    return build


@pytest.fixture
def write_jsonl(tmp_path: Path) -> Callable[..., Path]:
    """Write records (dicts, or raw strings for malformed lines) to a jsonl file and return its path."""

    def write(records: list[Any], name: str = "data.jsonl") -> Path:
        path = tmp_path / name
        lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return path

    return write


# --- training runner fixtures (runner/train, checkpoint, cli) ----------------------------------------


@pytest.fixture(scope="session")
def runner_tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One make_tiny folder (model, tokenizer, data.jsonl, job.json) shared by the runner tests."""
    from runner.tiny import make_tiny

    out = tmp_path_factory.mktemp("runner-tiny")
    make_tiny(out, seed=0)
    return out


@pytest.fixture
def runner_job(runner_tiny_dir: Path, tmp_path: Path) -> Callable[..., Any]:
    """Factory: the tiny job with checkpoints and output in this test's tmp_path, plus overrides."""
    from runner.contract.spec import JobSpec

    def build(**overrides: Any) -> JobSpec:
        base = json.loads((runner_tiny_dir / "job.json").read_text())
        base["checkpoint"]["uri"] = str(tmp_path / "checkpoints")
        base["output_uri"] = str(tmp_path / "output")
        for key, value in overrides.items():
            if isinstance(value, dict) and isinstance(base.get(key), dict):
                base[key] = {**base[key], **value}
            else:
                base[key] = value
        return JobSpec.model_validate(base)

    return build


class RunnerProcess:
    """`python -m runner.cli --spec ...` in a subprocess; can SIGTERM it once a given step is printed."""

    def __init__(
        self, spec_path: Path, *, env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> None:
        import os
        import subprocess
        import sys

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "runner.cli", "--spec", str(spec_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=cwd,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **(env or {})},
        )
        self.lines: list[str] = []
        self.stderr = ""

    def finish(
        self, *, sigterm_at_step: int | None = None, delay: float = 0.0, timeout: float = 240
    ) -> tuple[int, dict[str, Any]]:
        """Read stdout to the end (SIGTERM once `step N/` with N >= sigterm_at_step shows); (rc, summary)."""
        import signal
        import threading
        import time

        assert self.proc.stdout is not None and self.proc.stderr is not None
        err_chunks: list[str] = []
        reader = threading.Thread(target=lambda: err_chunks.append(self.proc.stderr.read()), daemon=True)
        reader.start()
        timer = threading.Timer(timeout, self.proc.kill)
        timer.start()
        sent = False
        try:
            for line in self.proc.stdout:
                self.lines.append(line.rstrip("\n"))
                if sigterm_at_step is not None and not sent and line.startswith("step "):
                    step = int(line.split()[1].split("/")[0])
                    if step >= sigterm_at_step:
                        time.sleep(delay)
                        self.proc.send_signal(signal.SIGTERM)
                        sent = True
            rc = self.proc.wait()
        finally:
            timer.cancel()
        reader.join(10)
        self.stderr = "".join(err_chunks)
        assert self.lines, f"no output (rc {rc}); stderr:\n{self.stderr[-3000:]}"
        try:
            summary = json.loads(self.lines[-1])
        except json.JSONDecodeError:
            tail = f"{self.lines[-5:]}\n{self.stderr[-3000:]}"
            raise AssertionError(f"last line is not the summary: {tail}") from None
        return rc, summary


@pytest.fixture
def runner_process() -> Callable[..., RunnerProcess]:
    return RunnerProcess


@pytest.fixture
def write_spec(tmp_path: Path) -> Callable[..., Path]:
    """Write a JobSpec to tmp_path/<name> and return the path."""

    def write(spec: Any, name: str = "job.json") -> Path:
        path = tmp_path / name
        path.write_text(spec.model_dump_json(indent=2))
        return path

    return write


@pytest.fixture
def event_receiver() -> Any:
    """A local HTTP receiver (ThreadingHTTPServer on 127.0.0.1) recording event bodies and auth headers."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    received: list[tuple[str | None, dict[str, Any]]] = []
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with lock:
                received.append((self.headers.get("Authorization"), json.loads(body)))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    server.url = f"http://127.0.0.1:{server.server_address[1]}/runner/events"  # type: ignore[attr-defined]
    server.received = received  # type: ignore[attr-defined]
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def moto_s3(monkeypatch: pytest.MonkeyPatch) -> Any:
    """`moto_server` on a free loopback port with a bucket "tunebot"; s3fs finds it via AWS_ENDPOINT_URL."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time
    from pathlib import Path as _Path

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = _Path(sys.executable).parent / "moto_server"
    proc = subprocess.Popen(
        [str(server), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    for key, value in {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "eu-west-1",
    }.items():
        monkeypatch.setenv(key, value)
    deadline = time.monotonic() + 30
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("moto_server did not start") from None
            time.sleep(0.2)
    import boto3
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()  # a client cached by an earlier test points elsewhere
    boto3.client("s3", endpoint_url=endpoint).create_bucket(
        Bucket="tunebot", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"}
    )
    yield endpoint
    s3fs.S3FileSystem.clear_instance_cache()
    os.kill(proc.pid, signal.SIGTERM)
    proc.wait(10)
