"""The lease holder (store.scopes.take_lease): a process of its own that keeps a lease file's
flock while the job lives.

It is started as a fresh interpreter (never a fork of the restore), with the environment of
a process that needs no secret (names.without_secrets): the restore's environment holds the
signing key, the store's credentials and the cache service's token, and a forked child would
keep them, in its memory and in /proc/PID/environ (the environment a process was started
with), readable by every later step of the job for as long as the job lives.

Usage: python -I -m ci_fxcache.store.holder FD OWNER_PID OWNER_START TTL_S (OWNER_PID and
OWNER_START empty when there is no owner to watch).
"""

from __future__ import annotations

import os
import sys
import time

from ci_fxcache.store.scopes import HOLD_POLL_S, process_start


def hold(fd: int, owner: int | None, start: str | None, ttl_s: float) -> None:
    """Keep `fd` (and so its flock) open until the lease is removed, the owner process ends
    (its start time changes: a reused pid is another process) or `ttl_s` pass."""
    deadline = time.monotonic() + ttl_s
    while time.monotonic() < deadline and os.fstat(fd).st_nlink > 0:
        if owner is not None and process_start(owner) != start:
            return
        time.sleep(HOLD_POLL_S)


def main(argv: list[str]) -> None:
    """`hold` with the arguments take_lease passes."""
    fd, owner, start, ttl_s = argv
    hold(int(fd), int(owner) if owner else None, start or None, float(ttl_s))


if __name__ == "__main__":
    main(sys.argv[1:])
