"""Work split across forked processes, each answering in JSON, for the store's bulk filesystem
calls (tens of thousands of lstat or mkdir calls on every restore or overlay build).

Threads do not help there (the Python part of each call holds the GIL); processes do. The
orchestrator never imports torch and is single-threaded where this runs, so forking is safe;
with another thread running it does not fork at all. A child that fails in any way (crash,
non-zero exit, an answer that is not JSON) is reported as `FAILED`: its caller does that share
itself, so a failed fork costs time, never a result.
"""

from __future__ import annotations

import gc
import json
import os
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

from ci_fxcache.env import cpus

Share = TypeVar("Share")
FAILED = object()  # the answer of a child that did not answer
MAX_WORKERS = 4


def workers(count: int, min_per_worker: int) -> int:
    """How many processes `count` items are worth: one per usable CPU (env.cpus: the affinity
    mask within any cgroup quota; at most MAX_WORKERS), at least `min_per_worker` items each;
    1 when another thread runs (forking a multi-threaded process can deadlock the child) or
    there is no fork."""
    if threading.active_count() > 1 or not hasattr(os, "fork"):
        return 1
    return max(1, min(cpus.usable_cpus(), MAX_WORKERS, count // max(1, min_per_worker)))


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def run(shares: Sequence[Share], work: Callable[[Share], object]) -> list[object]:
    """`work(share)` for every share, in order: shares[1:] each in a forked child, shares[0]
    in this process. Each child's answer comes back through JSON (so it must be JSON-able), or
    is FAILED."""
    children: list[tuple[int, int]] = []
    for share in shares[1:]:
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: do its share, send the answer, leave at once
            code = 1
            try:
                gc.disable()  # a collection would touch, and so copy, every inherited object
                os.close(read_fd)
                payload = json.dumps(work(share)).encode("utf-8")
                while payload:
                    payload = payload[os.write(write_fd, payload) :]
                code = 0
            finally:
                os._exit(code)
        os.close(write_fd)
        children.append((pid, read_fd))
    answers = [work(shares[0])] if shares else []
    for pid, read_fd in children:
        try:
            data = _read_all(read_fd)
        finally:
            os.close(read_fd)
        _, status = os.waitpid(pid, 0)
        answer: object = FAILED
        if os.waitstatus_to_exitcode(status) == 0:
            try:
                answer = json.loads(data)
            except ValueError:
                answer = FAILED
        answers.append(answer)
    return answers
