"""Reading torch's structured trace, streaming and bounded.

`TORCH_TRACE=DIR` makes every process write one file into DIR. A record is one header line,
glog's prefix then a JSON object (`V1204 20:59:36.331000 3895 torch/x.py:12] {...}`), followed
by its payload, one line per payload line, each starting with a tab. The trace is written by the
job's own code (a fork's, maybe): every read is bounded (files, bytes, records, line length,
payload size), a line past the limit is skipped whole, and nothing but the records the figures
need is decoded.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

from ci_fxcache import names

TRACE_ENV = names.TORCH_TRACE_ENV
# The job-private trace directory beside the restore's state file: one home for its path.
TRACE_SUFFIX = ".torch-trace"
# Header keys (or artifact names) whose records the figures use; anything else is skipped
# without decoding.
WANTED = (
    b'"compilation_metrics"',
    b'"bwd_compilation_metrics"',
    b'"fx_graph_cache_',
    b'"aotautograd_cache_',
    b'"dynamo_graph_break_reason"',
    b'"chromium_event"',  # timed phases; their payload names them (`compile_file`: a C++ build)
)
_WANTED = re.compile(b"|".join(re.escape(w) for w in WANTED))
# glog's prefix up to the header's opening brace; the JSON object is the rest of the line.
_HEADER = re.compile(rb"[VIWEC]\d{4} [\d:.]+ +(?P<pid>\d+) [^\]\n]*\] \{")


@dataclass(frozen=True)
class Limits:
    """What one read of a trace may take; past any of them the rest is left unread."""

    total_bytes: int = 1 << 30  # all files together
    files: int = 4096
    records: int = 2_000_000  # header lines seen
    # One line (a large graph's key components are one JSON line) and one record's payload:
    # what one decode may hold at once, so that a read stays within 256 MiB whatever the trace.
    line_bytes: int = 16 << 20
    payload_bytes: int = 16 << 20


class Record(NamedTuple):
    """One record the figures use: the process, its header object, its payload text (a
    tuple: a trace gives hundreds of thousands, and a frozen dataclass costs 3x to build)."""

    process: str  # file name: one per process
    pid: int
    head: dict[str, Any]
    payload: str


class Event(NamedTuple):
    """A timed event (a `chromium_event` record): its process, name, phase ("B" begins, "E"
    ends) and time (us), read straight from its payload's bytes: most of a trace's records
    are these, and nothing else of them is used."""

    process: str
    name: str
    ph: object
    ts: float


@dataclass
class ReadNotes:
    """What a read skipped, and why (all shown with the figures)."""

    files: int = 0
    bytes: int = 0
    records: int = 0
    skipped_lines: int = 0  # over line_bytes, or not valid JSON where a header was expected
    skipped_payloads: int = 0
    stopped: list[str] = field(default_factory=list)  # a limit that ended the read

    def to_dict(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "bytes": self.bytes,
            "records": self.records,
            "skipped_lines": self.skipped_lines,
            "skipped_payloads": self.skipped_payloads,
            "stopped": list(self.stopped),
        }


def job_trace_dir(state_file: Path) -> Path:
    """The job-private trace directory of the restore that wrote `state_file`."""
    return state_file.with_name(state_file.name + TRACE_SUFFIX)


def job_env(state_file: Path, enabled: bool) -> dict[str, str]:
    """What restore exports so that every later process of the job writes its trace into the
    job-private directory: nothing when turned off or when the job set its own TORCH_TRACE
    (that one is read, not replaced)."""
    if not enabled or os.environ.get(TRACE_ENV):
        return {}
    directory = job_trace_dir(state_file)
    directory.mkdir(mode=0o700, exist_ok=True)
    return {TRACE_ENV: str(directory)}


def keep_out_of_job_trace() -> None:
    """The matrix's compiles are not the job's own: nothing verify starts writes a trace,
    neither into the job-private directory restore set up nor into a TORCH_TRACE the job named
    (the user's tlparse output stays the job's own)."""
    os.environ.pop(TRACE_ENV, None)


def trace_files(directory: Path, limits: Limits, notes: ReadNotes) -> list[Path]:
    """The regular files directly in `directory` (never a symlink), sorted; at most
    `limits.files`."""
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError:
        return []
    files = [Path(e.path) for e in entries if e.is_file(follow_symlinks=False)]
    if len(files) > limits.files:
        notes.stopped.append(f"{len(files)} trace files, read the first {limits.files}")
    return files[: limits.files]


# Bytes read at a time: lines are found by searching blocks, not read one by one (a trace has
# millions of lines and a Python step per line was most of `fxcache stats`' time).
BLOCK_BYTES = 1 << 20
_RECORD_START = re.compile(rb"\n(?=[^\t])")  # a line that is not a payload line begins after it
OVERLONG = None  # what _blocks yields in place of a line over `line_bytes`


def _overlong_split(block: bytes, most: int) -> Iterator[bytes | None]:
    """`block` (complete lines) with each line over `most` bytes replaced by OVERLONG."""
    start = pos = 0
    while pos < len(block):
        end = block.find(b"\n", pos)
        end = len(block) if end < 0 else end
        if end - pos > most:
            if pos > start:
                yield block[start:pos]
            yield OVERLONG
            start = end + 1
        pos = end + 1
    if start < len(block):
        yield block[start:]


def _blocks(stream: BinaryIO, limits: Limits, notes: ReadNotes) -> Iterator[bytes | None]:
    """The stream as blocks of whole lines (the last one may lack its newline), each line
    over `limits.line_bytes` skipped whole (read through, never held) and given as OVERLONG;
    stops once `limits.total_bytes` are read (all files together, from `notes.bytes`)."""
    most, total = limits.line_bytes, limits.total_bytes
    pending = b""  # the start of a line not yet ended
    skipping = False  # inside an overlong line: dropped up to its newline
    while True:
        if notes.bytes > total:
            notes.stopped.append(f"read {total} bytes, the limit")
            return
        data = stream.read(min(BLOCK_BYTES, total + 1 - notes.bytes))
        notes.bytes += len(data)
        if not data:
            if pending:
                yield from _overlong_split(pending, most)
            return
        if skipping:
            newline = data.find(b"\n")
            if newline < 0:
                continue
            data, skipping = data[newline + 1 :], False
        data = pending + data if pending else data
        cut = data.rfind(b"\n") + 1
        block, pending = data[:cut], data[cut:]
        if block:
            if len(block) <= most:  # no line in it can be over the limit
                yield block
            else:
                yield from _overlong_split(block, most)
        if len(pending) > most:
            yield OVERLONG
            pending, skipping = b"", True


_EVENT_HEAD = b'"chromium_event": {}, '  # a timed event's header: nothing else in it is used
_EVENT: dict[str, Any] = {"chromium_event": {}}  # what _header gives for one: shared, read only
# Torch writes an event's name first, then its time; its phase after its arguments.
_EVENT_TS_FIELD = rb'"ts": ([0-9][0-9.e+]{0,30})[,\s}]'
_EVENT_NAME = re.compile(rb'\{\s*"name": "([^"\\]{1,200})",(?:\s*' + _EVENT_TS_FIELD + rb")?")
_EVENT_PH = re.compile(rb'"ph": "([A-Za-z])"')
# A timed event's whole header line (what _header takes for one), matched in the block.
_EVENT_LINE = re.compile(_HEADER.pattern + re.escape(_EVENT_HEAD) + rb"[^\n]*\n")
_EVENT_TS = re.compile(_EVENT_TS_FIELD)


def _header(line: bytes) -> tuple[int, dict[str, Any]] | None:
    match = _HEADER.match(line)
    if match is None:
        return None
    at = match.end()  # just past the header object's opening brace
    if line.startswith(_EVENT_HEAD, at):  # most records
        return int(match["pid"]), _EVENT
    if _WANTED.search(line, at) is None:  # anything else is skipped without decoding
        return None
    try:
        head = json.loads(line[at - 1 :])
    except (ValueError, RecursionError):
        return None
    return (int(match["pid"]), head) if isinstance(head, dict) else None


def _records_of(
    path: Path, stream: BinaryIO, limits: Limits, notes: ReadNotes
) -> Iterator[Record | Event]:
    """Each wanted record of one process's file: its header decoded, its payload (the lines
    after it that start with a tab) joined, or left out when over `limits.payload_bytes` or
    cut by an overlong line (the record still counts, with an empty payload). The loop is
    kept small: a trace has hundreds of thousands of records."""
    process = path.name
    most_payload = limits.payload_bytes
    current: tuple[int, dict[str, Any]] | None = None  # the record being read: pid, header
    payload: list[bytes] = []  # its payload so far, each line with its leading tab
    size = 0
    over = False  # its payload is left out
    for block in _blocks(stream, limits, notes):
        if block is OVERLONG:
            notes.skipped_lines += 1
            if current is not None:
                over, payload = True, []
            continue
        starts = [m.end() for m in _RECORD_START.finditer(block)]
        if block[:1] != b"\t":
            starts.insert(0, 0)
        first = starts[0] if starts else len(block)
        if first and current is not None and not over:  # the current record's payload goes on
            size += first
            over = size > most_payload
            payload = [] if over else [*payload, block[:first]]
        starts.append(len(block))
        last = len(starts) - 2  # the block's last record may go on in the next block
        for at in range(len(starts) - 1):
            if current is not None:
                got = _record(process, current, payload, over, notes)
                if got is not None:
                    yield got
            notes.records += 1
            if notes.records > limits.records:
                notes.stopped.append(f"read {limits.records} records, the limit")
                return
            start, end = starts[at], starts[at + 1]
            line = _EVENT_LINE.match(block, start, end) if at < last else None
            if line is not None and end - line.end() <= most_payload:
                # Most records: a timed event that ends in this block, read where it lies
                # (no header object, no payload list), as _record would read it.
                current = None
                event = _event(process, block[line.end() : end])
                if event is not None:
                    yield event
                continue
            newline = block.find(b"\n", start, end)
            head_end = end if newline < 0 else newline + 1
            current = _header(block[start:head_end])
            size = end - head_end
            over = size > most_payload
            payload = [block[head_end:end]] if size and not over else []
    if current is not None and not notes.stopped:
        got = _record(process, current, payload, over, notes)
        if got is not None:
            yield got


def _record(
    process: str, current: tuple[int, dict[str, Any]], payload: list[bytes], over: bool,
    notes: ReadNotes,
) -> Record | Event | None:  # fmt: skip
    if over:  # still counted (a lookup without its key), its payload left unread
        notes.skipped_payloads += 1
        return None if current[1] is _EVENT else Record(process, current[0], current[1], "")
    joined = payload[0] if len(payload) == 1 else b"".join(payload)
    if current[1] is _EVENT:
        return _event(process, joined)
    # every line starts with its tab: drop the first, then each after a newline
    text = joined[1:].replace(b"\n\t", b"\n").decode("utf-8", "replace")
    return Record(process, *current, text)


def _event(process: str, payload: bytes) -> Event | None:
    """A timed event from its payload lines (each with its leading tab, whitespace to JSON):
    its fields where torch writes them, else decoded; None when it is not one."""
    head = _EVENT_NAME.match(payload, 1)
    if head is not None:
        ts = head[2]
        if ts is None:
            found = _EVENT_TS.search(payload)
            ts = found[1] if found else None
        ph = _EVENT_PH.search(payload)
        if ph is not None and ts is not None:
            at = _time(ts)
            return None if at is None else Event(process, head[1].decode("utf-8", "replace"),
                                                 ph[1].decode(), at)  # fmt: skip
    try:
        event = json.loads(payload.decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        return None
    if not isinstance(event, dict):
        return None
    name, ts = event.get("name"), event.get("ts")
    at = _time(ts) if isinstance(ts, int | float) else None
    if not isinstance(name, str) or at is None:
        return None
    return Event(process, name, event.get("ph"), at)


_LATEST_US = 1e17  # microseconds since 1970: the year 5138


def _time(value: bytes | float) -> float | None:
    """An event's time (us) as a number from 0 to _LATEST_US, or None: never infinite, NaN or
    so large that the spans' sums overflow (the figures stay finite, their JSON valid)."""
    if isinstance(value, bool):
        return None
    try:
        at = float(value)
    except (ValueError, OverflowError):
        return None
    return at if 0.0 <= at < _LATEST_US else None


def stream(directory: Path, limits: Limits, notes: ReadNotes) -> Iterator[Record | Event]:
    """The records the figures use from every process's file in `directory`, one at a time
    (nothing is held between them), what was skipped noted in `notes`; none when the
    directory is missing."""
    for path in trace_files(directory, limits, notes):
        if notes.stopped:
            break
        try:
            with path.open("rb") as handle:
                notes.files += 1
                yield from _records_of(path, handle, limits, notes)
        except OSError:
            continue


def read(directory: Path, limits: Limits | None = None) -> tuple[list[Record | Event], ReadNotes]:
    """Every record `stream` gives, as a list (small traces, tests)."""
    notes = ReadNotes()
    return list(stream(directory, limits or Limits(), notes)), notes


def remove(directory: Path) -> None:
    """Remove the job-private trace directory once read (never a directory the job named)."""
    shutil.rmtree(directory, ignore_errors=True)
