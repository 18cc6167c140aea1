"""`store: github`: the scope archive now (the remote tiers' pack format, unpacked while it
downloads) versus what it was, side by side in one run, through tests/fake_cache_service.py
(the Actions cache service v2 and its blob storage on loopback), on bench_s3.py's
Inductor-shaped scope (or bench_restore.py's), committed as the local store commits it.

The contenders are the tier's own module at three commits, the earlier two loaded from git
as they were (`git show REV:ci_fxcache/store/remote/github/cache_service.py`), so "before" is
the old code path itself, not a reimplementation:
- gzip tar (c743573, before issue 31): tarfile over gzip, the archive downloaded into a
  file, then extracted;
- zstd tar (4aafc45, issue 31's first step): tarfile over zstd, the same way;
- packs (this tree): store/remote/github/archive.py.

Each saves the same scope once (timed), then restores it onto a fresh directory `--repeat`
times, taking turns, each after a `sync` (restore = lookup + download + extraction; then,
timed apart, the local store's fast check of what was written, `manifest.inspect`, which
re-hashes a file whose mtime differs from its manifest's); medians; target: the restore at
least 2x faster than the gzip tar's. Earlier tries' trees are kept until the end (see
bench_s3.py's `settle`: on this machine's ext4, creating files just after removing as many
costs several times more).

Usage: python benchmarks/bench_github.py [--size-mib 256] [--repeat 3] [--shape inductor|restore]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_restore import _force, _populate  # noqa: E402
from benchmarks.bench_s3 import _load, _populate_inductor  # noqa: E402
from ci_fxcache.store import manifest as mf  # noqa: E402
from ci_fxcache.store.layout import MANIFEST  # noqa: E402
from ci_fxcache.store.remote.github import cache_service  # noqa: E402
from tests.fake_cache_service import FakeCacheService  # noqa: E402

MODULE = "ci_fxcache/store/remote/github/cache_service.py"
BEFORE = {"gzip tar": "c743573", "zstd tar": "4aafc45"}


def _module_at(rev: str) -> types.ModuleType:
    """The tier's cache-service module as it was at commit `rev`."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{MODULE}"],
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
    name = f"_bench_cache_service_{rev}"
    module = types.ModuleType(name)
    module.__file__ = f"{rev}:{MODULE}"
    sys.modules[name] = module  # dataclasses look their module up
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


def _commit(scope: Path, key: str) -> None:
    """A manifest as the local store's save writes it, and its files made read-only."""
    files, problems = mf.scan(scope)
    assert not problems, problems
    listed = mf.file_entries(scope, files)
    mf.make_read_only(scope, files)
    now = "2026-12-02T00:00:00Z"
    manifest = {"schema": mf.SCHEMA, "scope_key": key, "fingerprint": {}, "torch_paths": [],
                "created_at": now, "updated_at": now, "last_used_at": now,
                "verification": {"references": []}, "files": listed,
                "total_bytes": sum(m["size"] for m in listed.values())}  # fmt: skip
    mf.write_atomic(scope / MANIFEST, manifest, scope.parent)


@dataclass
class Contender:
    name: str
    module: types.ModuleType
    saved: tuple[float, int] = (0.0, 0)
    restores: list[tuple[float, float]] = field(default_factory=list)
    checks: list[tuple[float, int]] = field(default_factory=list)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--shape", choices=("inductor", "restore"), default="inductor",
                        help="bench_s3's Inductor shape, or bench_restore's")  # fmt: skip
    args = parser.parse_args()
    print(f"load average (1 / 5 / 15 min) at the start: {_load()}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="fxcache-bench-github-"))
    try:
        with FakeCacheService() as fake:
            _bench(args, work, fake)
    finally:
        shutil.rmtree(work, onerror=_force)
        print(f"removed {work}")


def _bench(args: argparse.Namespace, work: Path, fake: FakeCacheService) -> None:
    key = "fxcache-v1-linux-x86_64-bench"
    scope = work / "store" / key
    populate = _populate_inductor if args.shape == "inductor" else _populate
    files, size = populate(scope, args.size_mib)
    _commit(scope, key)
    contenders = [Contender(name, _module_at(rev)) for name, rev in BEFORE.items()]
    contenders.append(Contender("packs", cache_service))
    for c in contenders:
        where, problem = c.module.runtime(fake.env())
        assert where is not None, problem
        service = c.module.CacheService(where)
        os.sync()
        start = time.perf_counter()
        sent = c.module.save_directory(service, scope, f"fxcache-bench-{c.name}-run1.1")
        c.saved = (time.perf_counter() - start, int(sent["bytes"]))
    counter = iter(range(10**6))

    def restore(c: Contender) -> Callable[[], None]:
        def run() -> None:
            where, _ = c.module.runtime(fake.env())
            service = c.module.CacheService(where)
            target = work / f"r{next(counter)}" / key
            target.parent.mkdir()
            os.sync()
            wall, cpu = time.perf_counter(), time.process_time()
            found = c.module.restore_directory(service, target, "x-run9.1",
                                               [f"fxcache-bench-{c.name}-"])  # fmt: skip
            c.restores.append((time.perf_counter() - wall, time.process_time() - cpu))
            assert found and (target / MANIFEST).exists()
            manifest = mf.load(target / MANIFEST)
            assert len(manifest["files"]) == files
            wall = time.perf_counter()
            inspection = mf.inspect(target, manifest, full=False)
            assert inspection.problems == [], inspection.problems[:3]
            moved = sum(1 for rel, meta in manifest["files"].items()
                        if (target / rel).stat().st_mtime_ns != meta["mtime_ns"])  # fmt: skip
            c.checks.append((time.perf_counter() - wall, moved))

        return run

    for _ in range(args.repeat):
        for c in contenders:
            restore(c)()
    _report(args, files, size, contenders)


def _report(args: argparse.Namespace, files: int, size: int, contenders: list[Contender]) -> None:
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"machine: {os.cpu_count()} CPUs; uptime: {uptime}; load average (1 / 5 / 15 min) "
          f"at the end: {_load()}")  # fmt: skip
    print(f"scope: {files} files, {size / 2**20:.0f} MiB ({args.shape} shape); medians of "
          f"{args.repeat}; restore = lookup + download + extraction (CPU: this process, the "
          f"fake service's thread included)")  # fmt: skip
    head = ("format", "archive", "save", "restore", "restore CPU", "then the fast check",
            "files re-hashed there")  # fmt: skip
    rows: list[tuple[str, ...]] = []
    times: dict[str, float] = {}
    for c in contenders:
        times[c.name] = statistics.median(w for w, _c in c.restores)
        rows.append((c.name, f"{c.saved[1] / 2**20:.1f} MiB", f"{c.saved[0]:.2f} s",
                     f"{times[c.name]:.2f} s",
                     f"{statistics.median(cpu for _w, cpu in c.restores):.2f} s",
                     f"{statistics.median(w for w, _m in c.checks):.2f} s",
                     f"{statistics.median(m for _w, m in c.checks):.0f}"))  # fmt: skip
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=True)]
    for row in (head, *rows):
        print("  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=True)))
    for before in BEFORE:
        ratio = times[before] / times["packs"]
        goal = (
            "" if before != "gzip tar" else f" (target >= 2x: {'met' if ratio >= 2 else 'MISSED'})"
        )
        print(f"restore, {before} / packs: {ratio:.2f}x{goal}")


if __name__ == "__main__":
    main()
