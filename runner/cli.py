"""`tunebot-runner`: train a JobSpec, or write a tiny offline job for tests and demos.

    tunebot-runner --spec job.json          # or TUNEBOT_JOB_SPEC='{"job_id": ...}' / a path in it
    tunebot-runner make-tiny DIR [--seed N] [--method lora|qlora|full]

The last line of stdout is always the RunSummary as one JSON object; the exit code is one of
runner.contract.spec's EXIT_* (0 finished or plateau, 1 failed, 2 invalid spec or dataset, 75 preempted).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any, NoReturn

from pydantic import ValidationError

from runner.contract.spec import EXIT_BAD_SPEC, EXIT_FAILED, JobSpec, RunSummary

SPEC_ENV = "TUNEBOT_JOB_SPEC"
_early_sigterm: list[int] = []


def _note_sigterm(signum: int, _frame: Any) -> None:
    """Until the trainer takes over, a SIGTERM is only remembered (torch imports take seconds)."""
    _early_sigterm.append(signum)


def _print_summary(summary: RunSummary) -> None:
    from runner.redact import scrub, secret_values

    if summary.message:  # the local provider shows this line's message to people
        summary.message = scrub(summary.message, secret_values())
    sys.stdout.flush()
    print(summary.model_dump_json(), flush=True)


def _invalid(message: str) -> int:
    print(f"error: {message}", file=sys.stderr, flush=True)
    _print_summary(RunSummary(status="invalid", message=message))
    return EXIT_BAD_SPEC


def load_spec_text(spec_arg: str | None) -> str:
    """The spec's JSON from --spec (a path) or TUNEBOT_JOB_SPEC (JSON text or a path)."""
    source = spec_arg or os.environ.get(SPEC_ENV)
    if not source:
        raise ValueError(f"no job spec: pass --spec job.json or set {SPEC_ENV}")
    if spec_arg is None and source.lstrip().startswith("{"):
        return source
    path = Path(source).expanduser()
    if not path.is_file():
        raise ValueError(f"spec file {source!r} not found")
    return path.read_text(encoding="utf-8")


def parse_spec(text: str) -> JobSpec:
    try:
        return JobSpec.model_validate_json(text)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'spec'}: {err['msg']}" for err in exc.errors()
        )
        raise ValueError(f"invalid job spec: {problems}") from None


class _Parser(argparse.ArgumentParser):
    """Usage errors also end with the summary line, so whoever reads the last line always finds one."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        raise SystemExit(_invalid(message))


def _make_tiny(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="tunebot-runner make-tiny",
        description="Write a tiny offline model, dataset and job.json to DIR.",
    )
    parser.add_argument("dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--method", choices=["lora", "qlora", "full"], default="lora")
    args = parser.parse_args(argv)
    from runner.tiny import make_tiny

    path = make_tiny(args.dir, seed=args.seed, method=args.method)
    print(path)
    return 0


def run(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] != ["make-tiny"]:
        signal.signal(signal.SIGTERM, _note_sigterm)
    if argv[:1] == ["make-tiny"]:
        return _make_tiny(argv[1:])
    parser = _Parser(
        prog="tunebot-runner", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--spec", help=f"path of a JobSpec JSON file (default: ${SPEC_ENV})")
    args = parser.parse_args(argv)
    try:
        text = load_spec_text(args.spec)
        spec = parse_spec(text)
    except ValueError as exc:
        return _invalid(str(exc))

    from runner import distributed
    from runner.cuda_env import configure_allocator

    configure_allocator()  # before torch starts CUDA, here and in every worker (they inherit it)
    from runner.quiet import quiet_libraries

    quiet_libraries()  # the job's log says what the run does, not what its libraries will deprecate
    processes = distributed.processes_for(spec.gpus)
    if processes > 1 and not distributed.is_worker():
        return distributed.launch(spec.model_dump_json(), processes, sigterm_seen=bool(_early_sigterm))

    from runner.train import run as train

    try:
        summary, code = train(spec, sigterm_seen=lambda: bool(_early_sigterm))
    except KeyboardInterrupt:
        summary, code = RunSummary(status="failed", message="interrupted"), EXIT_FAILED
    if not distributed.is_worker() or os.environ.get("RANK", "0") == "0":
        _print_summary(summary)
    return code


def main() -> None:
    code = run()
    # Everything is written, uploaded and reported by now (the summary line is the last word). The
    # interpreter's own teardown with torch and transformers loaded takes about a second on a small host
    # that is billed and does nothing (runner/contract/phases.py: no phase has it): exit at once, after
    # the exit handlers and the flushes.
    import atexit
    import logging

    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
