"""The trace reader reads blocks, not lines (jobstats/trace.py): whatever the block size, and
so wherever a block boundary falls (inside a header, a payload line, an overlong line, between
records), it gives the records a plain line-by-line reader gives."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path
from typing import Any

import pytest

from ci_fxcache.jobstats import trace


def reference(
    data: bytes, limits: trace.Limits
) -> tuple[list[trace.Record | trace.Event], dict[str, Any]]:
    """One line at a time, as the reader did before it read blocks (no byte or record
    limit reached: those stop at different points by design); a timed event read from its
    joined payload by the reader's general path (trace._event)."""
    notes = trace.ReadNotes()
    out: list[trace.Record | trace.Event] = []
    current: tuple[int, dict[str, Any]] | None = None
    payload: list[bytes] = []
    size, over = 0, False

    def finish() -> None:
        if current is None:
            return
        if over:
            notes.skipped_payloads += 1
            if "chromium_event" not in current[1]:
                out.append(trace.Record("p.log", current[0], current[1], ""))
        elif "chromium_event" in current[1]:
            event = trace._event("p.log", b"".join(payload))
            if event is not None:
                out.append(event)
        else:
            text = b"".join(payload)[1:].replace(b"\n\t", b"\n").decode("utf-8", "replace")
            out.append(trace.Record("p.log", current[0], current[1], text))

    lines = data.splitlines(keepends=True)
    for line in lines:
        if len(line.rstrip(b"\n")) > limits.line_bytes:
            notes.skipped_lines += 1
            over = over or current is not None
            continue
        if line[:1] == b"\t":
            if current is not None and not over:
                size += len(line)
                over = size > limits.payload_bytes
                payload = [] if over else [*payload, line]
            continue
        finish()
        notes.records += 1
        current, payload, size, over = trace._header(line), [], 0, False
    finish()
    return out, {"records": notes.records, "skipped_lines": notes.skipped_lines,
                 "skipped_payloads": notes.skipped_payloads}  # fmt: skip


def _header(name: str, pid: int) -> bytes:
    if name == "event":
        head = '{"chromium_event": {}, "rank": 0}'
    elif name == "other":
        head = '{"describe_tensor": {"id": 1}}'
    else:
        head = json.dumps({"artifact": {"name": name, "encoding": "json"}})
    return f"V1206 01:09:07.059000 {pid} torch/x.py:12] {head}\n".encode()


def _event_lines(rng: random.Random) -> list[bytes]:
    """A timed event's payload as torch writes it (one field a line), or with its time after
    its arguments, without a phase, with arguments past the payload limit, or cut short."""
    fields = [
        f'"name": "{rng.choice(["dynamo", "compile_file", "build_guards", "x" * 150])}"',
        f'"ts": {rng.choice(["1000000000000010.0", "12", "1e3", "9" * 40])}',
        '"args": {\n"compile_id": "0/0"\n}',
        f'"ph": "{rng.choice("BEX")}"',
        '"cat": "dynamo_timed"',
        '"tid": 0',
    ]
    if rng.random() < 0.2:
        fields.insert(3, fields.pop(1))  # the time after the arguments: searched for
    if rng.random() < 0.1:
        fields.pop(-3)  # no phase
    if rng.random() < 0.1:  # arguments past the payload limit below: counted, left unread
        fields[2] = '"args": {\n' + ",\n".join(f'"k{i}": "{"v" * 80}"' for i in range(16)) + "\n}"
    lines = ("{\n" + ",\n".join(fields) + "\n}").split("\n")
    if rng.random() < 0.1:
        lines = lines[: rng.randrange(1, len(lines))]
    return [b"\t" + line.encode() + b"\n" for line in lines]


def random_trace(rng: random.Random) -> bytes:
    parts: list[bytes] = []
    for _ in range(rng.randrange(1, 60)):
        kind = rng.choice(["event", "fx_graph_cache_miss", "fx_graph_cache_hit", "other",
                           "garbage", "empty", "orphan"])  # fmt: skip
        if kind == "garbage":
            parts.append(b"V1204 garbage ] {not json\n")
        elif kind == "empty":
            parts.append(b"\n")
        elif kind == "orphan":
            parts.append(b"\tno header above\n")
        else:
            parts.append(_header(kind, rng.randrange(1, 99999)))
        if kind == "event" and rng.random() < 0.7:
            parts += _event_lines(rng)
        for _ in range(rng.choice([0, 1, 3, 11])):
            width = rng.choice([1, 20, 90, 300])  # 300: over the line limit below
            parts.append(b"\t" + bytes(rng.choice(b'abc{}":, ') for _ in range(width)) + b"\n")
    data = b"".join(parts)
    return data[:-1] if rng.random() < 0.3 else data  # a file cut before its last newline


@pytest.mark.parametrize("block", [1, 7, 64, 257, 1 << 20])
def test_any_block_size_reads_what_a_line_reader_reads(
    block: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trace, "BLOCK_BYTES", block)
    limits = trace.Limits(line_bytes=256, payload_bytes=1200)
    rng = random.Random(block)
    for _ in range(150):
        data = random_trace(rng)
        notes = trace.ReadNotes()
        got = list(trace._records_of(Path("p.log"), io.BytesIO(data), limits, notes))
        want, counts = reference(data, limits)
        assert got == want
        assert {k: getattr(notes, k) for k in counts} == counts
        assert notes.bytes == len(data) and notes.stopped == []
