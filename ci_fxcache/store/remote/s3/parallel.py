"""The S3 tier's requests in parallel: a fixed pool that stops at the first failure."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

WORKERS = 8


def run(work: Callable[[str], None], items: list[str]) -> None:
    """`work(item)` for every item on WORKERS threads; the first exception is raised once the
    others have stopped (none left waiting for a dead bucket)."""
    if not items:
        return
    with ThreadPoolExecutor(min(WORKERS, len(items))) as pool:
        futures = [pool.submit(work, item) for item in items]
        done, pending = wait(futures, return_when=FIRST_EXCEPTION)
        for future in pending:
            future.cancel()
        for future in done:
            exc = future.exception()
            if exc is not None:
                raise exc
