"""The planner's core is pure: bot/planner/inputs.py reads the model and the dataset once per request, and
plan.estimate() - handed those inputs and the offers - reads no file, socket, environment or registry.
LoRA targets are resolved against the model once per request, however often memory and speed ask."""

from __future__ import annotations

import builtins
import io
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from bot.engine.launching.offers import priced_estimate, snapshot_estimate
from bot.planner.architectures import Architecture
from bot.planner.inputs import plan_request, resolve_inputs
from bot.planner.models import table_lookup
from bot.planner.plan import estimate
from bot.planner.request import EstimateRequest
from bot.providers.snapshot import snapshot_as_of, snapshot_offers
from bot.settings import get_settings


class _NoEnvironment(dict):  # type: ignore[type-arg]
    """os.environ while estimate() runs: any read is a test failure."""

    def _refuse(self, *args: object, **kwargs: object) -> None:
        raise AssertionError("estimate() read the environment")

    __getitem__ = get = __contains__ = __iter__ = keys = items = copy = _refuse  # type: ignore[assignment]


@contextmanager
def no_io(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every way the planner used to reach outside (files, sockets, httpx, os.environ) raises."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"I/O inside estimate(): {args[:1]!r}")

    with monkeypatch.context() as m:
        for module, name in (
            (builtins, "open"),
            (io, "open"),
            (os, "open"),
            (os, "stat"),
            (os, "scandir"),
            (os, "listdir"),
            (socket, "create_connection"),
            (socket.socket, "connect"),
            (httpx, "stream"),
            (httpx, "get"),
            (httpx.Client, "send"),
        ):
            m.setattr(module, name, refuse)
        m.setattr(os, "environ", _NoEnvironment())
        yield


@pytest.fixture
def on_disk(tmp_path: Path) -> EstimateRequest:
    """A request whose model is a config.json and whose dataset is a file: both need reading."""
    hit = table_lookup("meta-llama/Llama-3.2-1B")
    assert hit is not None
    config = tmp_path / "config.json"
    config.write_text(json.dumps(hit.config))
    data = tmp_path / "data.jsonl"
    data.write_text(
        "".join(
            json.dumps({"instruction": f"add {i} and {i}", "input": "", "output": str(2 * i)}) + "\n"
            for i in range(40)
        )
    )
    return EstimateRequest(model=str(config), dataset=str(data), lora_targets=["q", "v"], gpus=2)


def test_estimate_reads_nothing_and_prices_as_before(
    on_disk: EstimateRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    offers, as_of = snapshot_offers(), snapshot_as_of()
    before = plan_request(on_disk, offers=offers, prices_as_of=as_of)  # inputs resolved here, with I/O
    inputs = resolve_inputs(on_disk)
    assert inputs.model_source == "config file" and inputs.dataset_format == "alpaca"
    assert inputs.dataset_bytes == Path(on_disk.dataset or "").stat().st_size and inputs.tokens > 0
    with no_io(monkeypatch):
        with pytest.raises(AssertionError, match="I/O inside|environment"):
            resolve_inputs(on_disk)  # the guard does catch what used to happen inside estimate()
        after = estimate(on_disk, inputs, offers=offers, prices_as_of=as_of)
    assert after.model_dump() == before.model_dump()
    assert after.training is not None and after.training.dataset_format == "alpaca"
    assert after.training.lora_targets == ["q_proj", "v_proj"]


def test_the_pure_core_imports_no_io_module() -> None:
    code = (
        "import sys, json; import bot.planner.plan\n"
        "print(json.dumps(sorted(m for m in sys.modules if m in ('httpx', 'bot.settings', "
        "'bot.planner.models', 'bot.planner.tokens', 'bot.planner.data_plan', 'bot.planner.inputs', "
        "'runner.contract.reading') or m.startswith('bot.providers'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


@pytest.mark.parametrize("door", ["snapshot", "priced"])
@pytest.mark.parametrize(
    "request_",
    [
        EstimateRequest(model="llama-3.1-8b", lora_targets=["q", "v"], tokens=10**6, gpus=2),
        # nothing fits an 8B full-rank model's LoRA on one 4090 at 32k tokens: the suggestions re-estimate
        EstimateRequest(
            model="llama-3.1-8b",
            lora_targets="all-linear",
            tokens=10**6,
            seq_len=32768,
            gpu="rtx-4090",
            gradient_checkpointing=False,
            batch_size=8,
        ),
        # a full fine-tune resolves no targets, until its suggestions price the QLoRA alternative: once
        EstimateRequest(
            model="llama-3.1-8b", method="full", lora_targets=["q", "v"], tokens=10**6, gpu="rtx-4090"
        ),
    ],
)
def test_lora_targets_are_resolved_once_per_request(
    door: str, request_: EstimateRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[object] = []
    resolve_targets = Architecture._resolve_targets

    def counted(self: Architecture, targets: list[str] | str) -> list:  # type: ignore[type-arg]
        calls.append(targets)
        return resolve_targets(self, targets)

    monkeypatch.setattr(Architecture, "_resolve_targets", counted)
    if door == "snapshot":
        est = snapshot_estimate(request_)
    else:
        est = priced_estimate(get_settings(), {}, request_)
    assert calls == [request_.lora_targets]
    assert est.model.trainable_parameters > 0 and est.training is not None
    assert bool(est.suggestions) == (request_.gpu == "rtx-4090")  # the second one did re-estimate
