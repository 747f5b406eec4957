from pathlib import Path

from typer.testing import CliRunner

from bot.money import cap_covering, money


def test_sub_cent_amounts_are_not_shown_as_zero() -> None:
    assert money(0.0006) == "$0.0006"
    assert money(0) == "$0.00"
    assert money(1234.5) == "$1,234.50"
    assert money(None) == "-"


def test_sub_cent_amounts_keep_what_they_are() -> None:
    """A cap of $0.002 reads $0.0020, not $0.00; under $0.0001 two significant digits, not $0.0000."""
    assert money(0.002) == "$0.0020" and money(0.0072) == "$0.0072"
    assert money(0.000021) == "$0.000021" and money(0.00009999) == "$0.000100"
    assert money(0.012) == "$0.01"
    # a suggested cap covers the amount at the precision it is written in
    assert cap_covering(0.00071) == 0.0008 and cap_covering(0.012) == 0.02 and cap_covering(3.0) == 3.0


def test_a_sub_cent_cap_reads_right_in_the_estimate_and_in_the_refusal(tmp_path: Path) -> None:
    """Issue 38: `max_cost='$0.0002'` was told "expected $0.01 is above the cost limit $0.00", and the
    launch's refusal suggested max_cost=0.01 for a job whose expected cost was $0.0008."""
    from bot.cli import app
    from runner.tiny import make_tiny

    tiny = make_tiny(tmp_path / "tiny", seed=0).parent
    # a cap well under the tiny job's quote on this CPU (about $0.0002 at the local offer's $0.10/h)
    words = [str(tiny / "model"), f"dataset={tiny / 'data.jsonl'}", "max_cost=$0.00002"]
    estimate = CliRunner().invoke(app, ["estimate", *words])
    out = " ".join(estimate.output.split())
    assert "is above the cost limit $0.000020" in out, out[-3000:]
    assert "cost limit $0.00 " not in out and "limit $0.00│" not in out.replace(" ", "")
    launch = CliRunner().invoke(app, ["launch", *words])
    said = " ".join(launch.output.split())
    assert launch.exit_code == 2, said
    import re

    suggested = re.search(r"max_cost=(\S+) covers the cheapest offer that fits, local cpu x1", said)
    expected = re.search(r"expected \$(0\.\d+) \(up to", said)
    assert suggested and expected, said
    assert float(suggested.group(1)) < 0.01 and float(suggested.group(1)) >= float(expected.group(1)), said
