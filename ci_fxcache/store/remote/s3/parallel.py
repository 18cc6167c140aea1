"""The S3 tier's requests in parallel: a fixed pool that stops at the first failure."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import TypeVar

# A save: packs built and uploaded at once (each worker holds three frames of its pack and
# one part of an upload: store.remote.s3.publish._upload_packs).
WORKERS = 8
# A restore: ranged reads at once. A link's bandwidth is filled by many connections (AWS:
# ~85-90 MB/s each, so ~15 for 10 Gbit/s). Each worker holds at most one frame as stored
# (store.remote.packs.FRAME_BYTES), and one decoded only while it holds one of the fetch's
# usable_cpus() slots: at most 16 x 4 MiB + CPUs x 4 MiB of pack data (72 MiB on 2 CPUs,
# never more than 128 MiB).
FETCH_WORKERS = 16
T = TypeVar("T")


def run(work: Callable[[T], None], items: Sequence[T], workers: int = WORKERS) -> None:
    """`work(item)` for every item on `workers` threads; the first exception is raised once
    the others have stopped (none left waiting for a dead bucket)."""
    if not items:
        return
    with ThreadPoolExecutor(min(workers, len(items))) as pool:
        futures = [pool.submit(work, item) for item in items]
        done, pending = wait(futures, return_when=FIRST_EXCEPTION)
        for future in pending:
            future.cancel()
        for future in done:
            exc = future.exception()
            if exc is not None:
                raise exc
