"""One total time bound per restore, save or invalidate on S3, honoured by every request.

A per-request timeout does not bound an operation: the client retries a timed-out request
(client.MAX_ATTEMPTS attempts of connect + read timeout each), a fetch makes dozens of
requests, and a server that freezes in the middle of a body leaves a read blocked until the
socket's own timeout. So each operation gets one `Deadline`, and every network call of the
tier runs through `Deadline.run`: the call (the client's retries and backoff included, and the
read of the body when the caller reads it inside `work`) runs on a daemon thread, and the
caller stops waiting when the bound is spent, whatever the socket is doing. obstore's retries
stop at the bound it was made with; botocore's (a versioned bucket's clean-up only) are stopped
by `refuse_if_passed`, registered on its `before-send` event: no request is sent once the
bound is spent. A request beside the operation's own (the last-used marker) runs within a
shorter bound of its own (`sub`).

`FXCACHE_S3_DEADLINE` sets the bound in seconds (default `DEFAULT_S`, at most `MAX_S`: the
garbage collector's minimum grace period (invalidate.py) is derived from it).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ci_fxcache.errors import UsageError

DEADLINE_ENV = "FXCACHE_S3_DEADLINE"
DEFAULT_S = 600.0
MAX_S = 3600.0
# The last-used marker is one empty PUT that nothing waits for: a restore that has what it
# needs never spends more than this on it.
TOUCH_S = 5.0

T = TypeVar("T")


class DeadlinePassed(TimeoutError):
    """The operation's time bound is spent."""


def configured_seconds() -> float:
    """The bound `FXCACHE_S3_DEADLINE` sets (DEFAULT_S when unset); UsageError when it is not
    a number of seconds in (0, MAX_S]. Read before anything is committed (store.tiered)."""
    raw = os.environ.get(DEADLINE_ENV)
    if not raw:
        return DEFAULT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= MAX_S):
        raise UsageError(f"{DEADLINE_ENV}={raw!r}: give seconds, more than 0 and at most {MAX_S:g}")
    return value


class Deadline:
    """`seconds` from now (monotonic clock): what is left, and calls that never outlive it."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._end = time.monotonic() + seconds

    def left(self) -> float:
        """Seconds left (0 when spent)."""
        return max(0.0, self._end - time.monotonic())

    def passed(self) -> bool:
        """Whether the bound is spent."""
        return self.left() <= 0

    def capped(self, seconds: float) -> float:
        """`seconds`, or what is left when that is less (a timeout never beyond the bound)."""
        return min(seconds, self.left())

    def sub(self, seconds: float) -> Deadline:
        """A shorter bound inside this one (the last-used marker within a restore)."""
        return Deadline(self.capped(seconds))

    def _late(self, what: str) -> DeadlinePassed:
        return DeadlinePassed(f"{what}: no answer within the time bound ({self.seconds:g} s)")

    def refuse_if_passed(self, **_event: Any) -> None:
        """botocore `before-send` handler: no request (first try or retry) once spent."""
        if self.passed():
            raise self._late("request not sent")

    def run(self, work: Callable[[], T], what: str) -> T:
        """`work()`'s result, or DeadlinePassed when it does not return within what is left
        (it is then abandoned on its daemon thread: a blocked read ends with its socket's own
        timeout, and botocore sends no retry after the bound)."""
        left = self.left()
        if left <= 0:
            raise self._late(what)
        outcome: list[tuple[bool, Any]] = []
        done = threading.Event()

        def call() -> None:
            try:
                outcome.append((True, work()))
            except BaseException as exc:  # handed to the waiting thread
                outcome.append((False, exc))
            finally:
                done.set()

        threading.Thread(target=call, name=f"fxcache-s3 {what}", daemon=True).start()
        if not done.wait(left):
            raise self._late(what)
        ok, value = outcome[0]
        if not ok:
            raise value
        result: T = value
        return result
