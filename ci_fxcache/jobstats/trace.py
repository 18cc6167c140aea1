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
from typing import Any, BinaryIO

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
_HEADER = re.compile(rb"^[VIWEC]\d{4} [\d:.]+ +(?P<pid>\d+) [^\]\n]*\] (?P<json>\{.*)$", re.S)


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


@dataclass(frozen=True)
class Record:
    """One record the figures use: the process, its header object, its payload text."""

    process: str  # file name: one per process
    pid: int
    head: dict[str, Any]
    payload: str


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


def _rest(stream: BinaryIO, line: bytes, limit: int, budget: int) -> tuple[bytes, bool, int]:
    """The rest of an overlong line (`line`, `limit` + 1 bytes without its end) read through
    and dropped, never held, and never past `budget`: the line cut, and the bytes consumed."""
    consumed = len(line)
    while consumed <= budget:
        more = stream.readline(1 << 20)
        consumed += len(more)
        if not more or more.endswith(b"\n"):
            break
    return line[:limit], True, consumed


_EVENT_HEAD = b'] {"chromium_event": {}, '  # a timed event's header: nothing else in it is used


def _header(line: bytes) -> tuple[int, dict[str, Any]] | None:
    event = _EVENT_HEAD in line  # most records: tested first, it spares the search below
    if not event and _WANTED.search(line) is None:
        return None
    match = _HEADER.match(line.rstrip(b"\n"))
    if match is None:
        return None
    if event:
        return int(match["pid"]), {"chromium_event": {}}
    try:
        head = json.loads(match["json"])
    except (ValueError, RecursionError):
        return None
    return (int(match["pid"]), head) if isinstance(head, dict) else None


def _records_of(path: Path, stream: BinaryIO, limits: Limits, notes: ReadNotes) -> Iterator[Record]:
    current: tuple[int, dict[str, Any]] | None = None
    payload: list[bytes] = []  # the record's payload lines, each with its leading tab
    size = 0
    over = False
    readline, most, tab = stream.readline, limits.line_bytes, b"\t"
    done, total, most_payload = notes.bytes, limits.total_bytes, limits.payload_bytes
    while True:  # the per-line work is kept small: a trace has millions of lines
        if done > total:
            notes.bytes = done
            notes.stopped.append(f"read {total} bytes, the limit")
            break
        line = readline(most + 1)
        consumed = len(line)
        if consumed > most and not line.endswith(b"\n"):
            line, _, consumed = _rest(stream, line, most, total - done)
            done += consumed
            notes.skipped_lines += 1
            over = over or current is not None
            continue
        done += consumed
        if line[:1] == tab:  # a payload line: kept only for a wanted record
            if current is not None and not over:
                size += consumed
                over = size > most_payload
                if over:
                    payload = []
                else:
                    payload.append(line)
            continue
        notes.bytes = done
        if current is not None:
            if over:  # still counted (a lookup without its key), its payload left unread
                notes.skipped_payloads += 1
                yield Record(path.name, current[0], current[1], "")
            else:
                # every line starts with its tab: drop the first, then each after a newline
                joined = payload[0] if len(payload) == 1 else b"".join(payload)
                text = joined[1:].replace(b"\n\t", b"\n").decode("utf-8", "replace")
                payload = []
                yield Record(path.name, current[0], current[1], text)
        if not line:
            return
        current, payload, size, over = None, [], 0, False
        notes.records += 1
        if notes.records > limits.records:
            notes.stopped.append(f"read {limits.records} records, the limit")
            return
        current = _header(line)


def stream(directory: Path, limits: Limits, notes: ReadNotes) -> Iterator[Record]:
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


def read(directory: Path, limits: Limits | None = None) -> tuple[list[Record], ReadNotes]:
    """Every record `stream` gives, as a list (small traces, tests)."""
    notes = ReadNotes()
    return list(stream(directory, limits or Limits(), notes)), notes


def remove(directory: Path) -> None:
    """Remove the job-private trace directory once read (never a directory the job named)."""
    shutil.rmtree(directory, ignore_errors=True)
