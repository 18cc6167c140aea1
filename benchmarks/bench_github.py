"""`store: github`: the scope archive as a zstd tar (now) versus the gzip tar it was, side by
side in one run, through tests/fake_cache_service.py (the Actions cache service v2 and
its blob storage on loopback), on bench_s3.py's Inductor-shaped scope (or bench_restore.py's).

Each contender saves the same scope once (timed) and restores it onto a fresh directory
`--repeat` times, taking turns (lookup + download + extraction, each after a `sync`);
medians; target: the zstd restore at least 2x faster than the gzip one.

Usage: python benchmarks/bench_github.py [--size-mib 256] [--repeat 3] [--shape inductor|restore]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_restore import _force, _populate  # noqa: E402
from benchmarks.bench_s3 import _populate_inductor  # noqa: E402
from ci_fxcache.store.remote.github import cache_service as ac  # noqa: E402
from tests.fake_cache_service import FakeCacheService  # noqa: E402

GZIP_FORMAT = "fxcache-scope/1|tar|gzip"  # what store: github wrote before


def _gzip_pack(directory: Path, archive: Path) -> int:
    """The previous format: a gzip tar (level 3) through tarfile."""
    with tarfile.open(archive, "w:gz", compresslevel=3) as tar:
        for child in sorted(directory.iterdir()):
            tar.add(child, arcname=child.name)
    return archive.stat().st_size


def _gzip_unpack(archive: Path, directory: Path) -> None:
    """The previous extraction: tarfile over gzip, the same data filter."""
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    with tarfile.open(archive, "r:gz") as tar:
        tar.extractall(staging, filter=ac._keep_read_only)
    staging.rename(directory)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--shape", choices=("inductor", "restore"), default="inductor",
                        help="bench_s3's Inductor shape, or bench_restore's")  # fmt: skip
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fxcache-bench-github-"))
    try:
        with FakeCacheService() as fake:
            _bench(args, work, fake)
    finally:
        shutil.rmtree(work, onerror=_force)
        print(f"removed {work}")


def _bench(args: argparse.Namespace, work: Path, fake: FakeCacheService) -> None:
    scope = work / "scope"
    populate = _populate_inductor if args.shape == "inductor" else _populate
    files, size = populate(scope, args.size_mib)
    (scope / "manifest.json").write_text("{}")
    where, problem = ac.runtime(fake.env())
    assert where is not None, problem
    service = ac.CacheService(where)
    formats = {
        "zstd": (ac.ENTRY_VERSION, ac.pack, ac.unpack),
        "gzip": (hashlib.sha256(GZIP_FORMAT.encode()).hexdigest(), _gzip_pack, _gzip_unpack),
    }
    current = (ac.ENTRY_VERSION, ac.pack, ac.unpack)
    saved: dict[str, tuple[float, int]] = {}

    def use(name: str) -> None:  # the module's format for one contender's calls
        ac.ENTRY_VERSION, ac.pack, ac.unpack = formats[name]  # type: ignore[misc]

    try:
        for name in formats:
            use(name)
            start = time.perf_counter()
            sent = ac.save_directory(service, scope, f"fxcache-bench-{name}-run1.1")
            saved[name] = (time.perf_counter() - start, int(sent["bytes"]))
        made: list[Path] = []
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in formats}
        counter = iter(range(10**6))

        def restore(name: str) -> Callable[[], None]:
            def run() -> None:
                use(name)
                target = work / f"r{next(counter)}" / "scope"
                made.append(target.parent)
                target.parent.mkdir()
                found = ac.restore_directory(service, target, "x-run9.1",
                                             [f"fxcache-bench-{name}-"])  # fmt: skip
                assert found and (target / "manifest.json").exists()

            return run

        for _ in range(args.repeat):
            for name in formats:
                for path in made:
                    shutil.rmtree(path, onerror=_force)
                made.clear()
                os.sync()
                wall, cpu = time.perf_counter(), time.process_time()
                restore(name)()
                samples[name].append((time.perf_counter() - wall, time.process_time() - cpu))
        for path in made:
            shutil.rmtree(path, onerror=_force)
    finally:
        ac.ENTRY_VERSION, ac.pack, ac.unpack = current  # type: ignore[misc]
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"machine: {os.cpu_count()} CPUs; uptime: {uptime}")
    print(f"scope: {files} files, {size / 2**20:.0f} MiB ({args.shape} shape); "
          f"medians of {args.repeat}; restore = lookup + download + extract")  # fmt: skip
    times = {n: statistics.median(w for w, _c in s) for n, s in samples.items()}
    for name in formats:
        cpu = statistics.median(c for _w, c in samples[name])
        print(f"{name}: archive {saved[name][1] / 2**20:.1f} MiB, save {saved[name][0]:.2f} s, "
              f"restore {times[name]:.2f} s ({cpu:.2f} s CPU of this process, fake "
              f"service included)")  # fmt: skip
    ratio = times["gzip"] / times["zstd"]
    print(f"restore, gzip / zstd: {ratio:.2f}x (target >= 2x: {'met' if ratio >= 2 else 'MISSED'})")


if __name__ == "__main__":
    main()
