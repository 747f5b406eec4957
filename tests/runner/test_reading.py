"""Bounded reads of untrusted datasets: bytes, line length, records, compression ratio and time."""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path

import pytest

from runner.contract.reading import DatasetError, DatasetLimitError, LineReader, ReadLimits
from runner.contract.records import check_dataset

SETTINGS = {
    "line": "TUNEBOT_DATASET_MAX_LINE_MB",
    "ratio": "TUNEBOT_DATASET_MAX_RATIO",
    "seconds": "TUNEBOT_DATASET_READ_SECONDS",
}


def gzip_bomb(path: Path, mb: int) -> Path:
    """One jsonl record whose text is ``mb`` MiB of "a": about 1,000 times smaller compressed."""
    packer = zlib.compressobj(6, zlib.DEFLATED, 31)
    parts = [packer.compress(b'{"text": "')]
    block = b"a" * (1 << 20)
    parts += [packer.compress(block) for _ in range(mb)]
    parts += [packer.compress(b'"}\n'), packer.flush()]
    path.write_bytes(b"".join(parts))
    return path


def rows(n: int, text: str = "hello world") -> str:
    return "".join(json.dumps({"text": f"{text} {i}"}) + "\n" for i in range(n))


def test_a_gzip_bomb_is_refused_by_ratio_without_expanding_it(tmp_path: Path) -> None:
    bomb = gzip_bomb(tmp_path / "data.jsonl.gz", 64)
    assert bomb.stat().st_size < 100_000
    reader = LineReader(str(bomb), ReadLimits(max_ratio=100, settings=SETTINGS))
    with pytest.raises(DatasetLimitError) as info:
        list(reader)
    assert info.value.limit == "ratio"
    assert "expands more than 100 times" in str(info.value) and "TUNEBOT_DATASET_MAX_RATIO" in str(info.value)
    assert reader.decoded < 16 << 20  # stopped long before the 64 MiB


def test_a_long_line_is_refused_by_line_cap_naming_the_line_and_the_setting(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(rows(2) + json.dumps({"text": "x" * 300_000}) + "\n" + rows(1))
    with pytest.raises(DatasetLimitError) as info:
        list(LineReader(str(path), ReadLimits(max_line_bytes=100_000, settings=SETTINGS)))
    assert info.value.limit == "line" and info.value.line == 3
    assert f"{path}:3: a line is longer than 100,000 bytes" in str(info.value)
    assert "TUNEBOT_DATASET_MAX_LINE_MB" in str(info.value)
    # a bomb that stays under the ratio is still one line: refused by the line cap with little memory held
    bomb = gzip_bomb(tmp_path / "b.jsonl.gz", 32)
    with pytest.raises(DatasetLimitError, match="a line is longer than 8 MiB"):
        list(LineReader(str(bomb), ReadLimits(max_line_bytes=8 << 20)))


def test_samples_stop_early_and_say_how_much_was_read(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(rows(1000))
    by_records = LineReader(str(path), ReadLimits(sample_records=100))
    assert len(list(by_records)) == 100 and by_records.stopped == "records"
    assert by_records.fraction_read() == pytest.approx(0.1, rel=0.05)
    by_bytes = LineReader(str(path), ReadLimits(sample_bytes=2_000))
    got = list(by_bytes)
    assert by_bytes.stopped == "bytes" and 2_000 <= sum(len(t) + 1 for _, t in got) < 2_100
    whole = LineReader(str(path), ReadLimits(sample_records=1000))
    assert len(list(whole)) == 1000 and whole.stopped is None and whole.fraction_read() == 1.0
    gz = tmp_path / "d.jsonl.gz"
    gz.write_bytes(gzip.compress(rows(50_000).encode()))
    sampled = LineReader(str(gz), ReadLimits(sample_records=5_000))
    assert len(list(sampled)) == 5_000 and sampled.stopped == "records"
    assert 0.05 < (sampled.fraction_read() or 0) < 0.3


def test_a_slow_read_hits_the_deadline(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(rows(100))
    now = [0.0]

    def clock() -> float:
        now[0] += 1.0  # every look at the clock: one second later
        return now[0]

    with pytest.raises(DatasetLimitError) as info:
        list(LineReader(str(path), ReadLimits(seconds=30, settings=SETTINGS), clock=clock))
    assert info.value.limit == "seconds" and "longer than 30 s" in str(info.value)
    assert "TUNEBOT_DATASET_READ_SECONDS" in str(info.value)


def test_line_numbers_blank_lines_crlf_and_bad_bytes(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"text": "a"}\r\n\n   \n{"text": "b"}')
    assert list(LineReader(str(path))) == [(1, '{"text": "a"}'), (4, '{"text": "b"}')]
    path.write_bytes(b'{"text": "a"}\n{"text": "\xff"}\n')
    with pytest.raises(DatasetError, match=r"d.jsonl:2: not UTF-8"):
        list(LineReader(str(path)))
    corrupt = tmp_path / "c.jsonl.gz"
    corrupt.write_bytes(gzip.compress(rows(100).encode())[:-40])
    with pytest.raises(DatasetError, match="gzip data is corrupt or truncated"):
        list(LineReader(str(corrupt)))
    with pytest.raises(DatasetError, match="dataset not found"):
        list(LineReader(str(tmp_path / "missing.jsonl")))


def test_check_dataset_is_bounded_and_deep_json_is_a_clear_error(tmp_path: Path) -> None:
    bomb = gzip_bomb(tmp_path / "d.jsonl.gz", 32)
    with pytest.raises(DatasetError, match="expands more than"):
        check_dataset(str(bomb), limits=ReadLimits(max_ratio=100))
    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"text": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    with pytest.raises(DatasetError, match="nested too deeply"):
        check_dataset(str(deep))
    ok = tmp_path / "ok.jsonl.gz"
    ok.write_bytes(gzip.compress(rows(300).encode()))
    found = check_dataset(str(ok), limit=100, limits=ReadLimits(max_ratio=100))
    assert (found.format.value, found.records, found.complete) == ("text", 100, False)


def test_a_slow_http_dataset_is_refused_at_the_deadline_even_while_a_read_blocks() -> None:
    """Issue 28: a dataset server that sends a byte every few seconds held the reading thread for as long as
    it kept sending (the deadline was checked only between reads of 64 KB). Now the deadline holds while a
    read blocks, in the body and in the headers alike, and the connection is closed."""
    import time

    from fakes.slow_http import slow_server

    with slow_server(rows(50).encode(), every_s=0.25) as server:
        for mode in ("body", "headers"):
            server.mode = mode
            reader = LineReader(server.url(), ReadLimits(seconds=1.5, settings=SETTINGS))
            with pytest.raises(DatasetLimitError) as info:
                list(reader)
            assert info.value.limit == "seconds", (mode, info.value)
            said = str(info.value)
            assert "longer than 1.5 s" in said and "TUNEBOT_DATASET_READ_SECONDS" in said
        server.mode = "fast"  # the same server when it answers: read whole, size known
        reader = LineReader(server.url(), ReadLimits(seconds=30, sample_records=10))
        assert len(list(reader)) == 10 and reader.raw_size == len(rows(50).encode())
        assert reader.fraction_read() is not None
        deadline = time.monotonic() + 30  # the reader hung up: nothing is left sending
        while server.open_connections and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server.open_connections == 0
    missing = LineReader("http://127.0.0.1:9/nothing-listens.jsonl", ReadLimits(seconds=5))
    with pytest.raises(DatasetError, match="cannot read"):
        list(missing)
