"""`fxcache verify` (the default CPU matrix) versus the naive way, side by side.

The naive baseline runs every phase of every combination in a fresh `python` that imports
torch, strictly one after another, with an eager reference in both phases (as a hand-written
cold/hot script would). The product runs the same matrix with `fxcache verify`: a fork server
that has imported torch (nothing compiled) forks one child per phase, combinations run in
parallel, only the cold phase runs eager, fxgraph and mega share one cold phase per
workload / dtype / dynamic / training, and a C++ kernel is compiled once per run, later phases
copying it from the run's build memo (docs/verify.md). Every hot phase runs in a fresh process
in both.

Then the job after: `fxcache verify` hot-only on the cache the product run built, once
re-checking every combination (`--recheck-all`) and once as every later job does (carrying the
no-gain verdicts whose inputs cannot have changed; docs/verify.md), side by side.

And what the hot-only job spends on the workload identity check (issue 38: a workload edited
since its reference is verified again, never judged by it): the same `Runner.match_versions`
call the job makes, timed on its own against the same cache, beside the job's wall time.

And the compile modes (issue 46): for `--modes default` and `--modes max-autotune` on a small
matrix (`MODES_AXES`), the first run and the hot-only job after it, side by side (target:
max-autotune's hot-only job <= 0.15x its first run).

And `--ranks 1` against `--ranks 2` (issue 46): the first run and the hot-only job after it for
the same combinations, side by side (`--ranks-only` runs just that; target: 2 ranks at most
1.5x the wall time of 1 rank).

Usage: python benchmarks/bench_matrix.py [--python PY] [--order naive-first|product-first]
       [--no-naive]  (the first run and the job after it only: no baseline, no ratio to it)
       [--part all|matrix|modes]  (default all)
       [--ranks-only]  (only --ranks 1 against --ranks 2)
Prints the wall times and the ratios (targets: the first run <= 0.25x naive; the hot-only job
after it no slower than before issue 34: 0.094x naive, 10.8 s on a quiet 2-core machine).
Quiet 2-core figures (docs/verify.md, Performance): 0.12x; the job after it 7.4 s, 0.019x.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ci_fxcache.env import fingerprint, interpreter, torch_support
from ci_fxcache.verify import forkserver, matrix, runner

ENV = {"TORCHINDUCTOR_COMPILE_THREADS": "1"}
TARGET = 0.25
# The modes part: a small model max-autotune compiles in minutes on two cores, not hours.
MODES_AXES = ("--workloads", "mlp", "--dtypes", "float32", "--dynamic", "false",
              "--mechanisms", "fxgraph,mega", "--training", "false")  # fmt: skip
MODES = ("default", "max-autotune")
MODES_TARGET = 0.15
RANKS_TARGET = 1.5
# The combinations `--ranks 1` and `--ranks 2` both run (issue 46): one small model, training
# (DDP synchronises the gradients), the mechanism every rank layout verifies.
RANKS_AXES = ("--device", "cpu", "--workloads", "mlp", "--dtypes", "float32",
              "--dynamic", "false", "--mechanisms", "fxgraph", "--training", "true")  # fmt: skip


def run_verify(python: str, work: Path, *axes: str) -> tuple[float, dict[str, Any]]:
    """Wall time and results document of `fxcache verify` (the default matrix unless `axes`)."""
    out = work / "results.json"
    start = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ci_fxcache",
            "verify",
            "--python",
            python,
            "--cache-dir",
            str(work / "cache"),
            "--json",
            str(out),
            "--fail-on",
            "never",
            *axes,
        ],
        env={**os.environ, **ENV},
        capture_output=True,
        text=True,
        check=False,
    )
    elapsed = time.perf_counter() - start
    if proc.returncode != 0 or not out.exists():
        raise SystemExit(f"fxcache verify failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return elapsed, json.loads(out.read_text())


def hot_only(python: str, work: Path) -> dict[str, tuple[float, dict[str, Any]]]:
    """Wall time and summary of hot-only runs on the product's cache: every combination
    re-checked, then the default policy; each must really be hot-only."""
    timed = {}
    for name, extra in (("full", ("--recheck-all",)), ("policy", ())):
        elapsed, doc = run_verify(python, work, *extra)
        if doc["settings"]["phase"] != "hot":
            raise SystemExit(f"hot-only run ({name}) was not hot-only: {doc['settings']}")
        carried = sum(
            any(n["kind"] == "carried" for n in c.get("notes") or []) for c in doc["combos"]
        )
        timed[name] = (elapsed, {**doc["summary"], "carried": carried})
    return timed


def modes_part(python: str, work: Path) -> dict[str, tuple[float, float, dict[str, int]]]:
    """Per mode: the first run's wall time, the hot-only job's on its cache (it must be
    hot-only), and that job's summary."""
    timed = {}
    for mode in MODES:
        where = work / f"modes-{mode}"
        where.mkdir()
        first, _ = run_verify(python, where, *MODES_AXES, "--modes", mode)
        hot, doc = run_verify(python, where, *MODES_AXES, "--modes", mode)
        if doc["settings"]["phase"] != "hot":
            raise SystemExit(f"hot-only run (--modes {mode}) was not hot-only: {doc['settings']}")
        timed[mode] = (first, hot, doc["summary"])
    return timed


def print_modes(timed: dict[str, tuple[float, float, dict[str, int]]]) -> None:
    print(f"compile modes ({' '.join(MODES_AXES)}):")
    print(f"  {'mode':<14} {'first run':>10} {'hot-only':>10} {'ratio':>6}  hot-only summary")
    for mode, (first, hot, summary) in timed.items():
        print(f"  {mode:<14} {first:9.1f}s {hot:9.1f}s {hot / first:6.3f}  {summary}")
    first, hot, _ = timed["max-autotune"]
    met = "met" if hot / first <= MODES_TARGET else "MISSED"
    print(
        f"  max-autotune hot-only / first run: {hot / first:.3f} (target <= {MODES_TARGET}: {met})"
    )


def identity_check(python: str, work: Path) -> tuple[float, int]:
    """Wall time of the identity check a hot-only job makes before its phases (one fork
    server, as in the job; its start is not counted, the job has one anyway) on the product's
    cache, and how many combinations it checked; every one must match its reference."""
    combos = runnable(python)
    scratch = Path(tempfile.mkdtemp(prefix="bench-identity-", dir=work))
    server = forkserver.ForkServer(interpreter.resolve(python), scratch)
    try:
        settings = runner.Settings(cache_dir=work / "cache", run_dir=scratch)
        checker = runner.Runner(server, settings, lambda _: None)
        os.environ.update(ENV)
        start = time.perf_counter()
        matched = checker.match_versions(combos, runner.default_jobs(combos, server.info))
        elapsed = time.perf_counter() - start
    finally:
        server.close()
    if len(matched) != len(combos):
        raise SystemExit(f"identity check: {sorted(checker.changed.items())} did not match")
    return elapsed, len(combos)


def product(python: str, work: Path) -> tuple[float, dict[str, int]]:
    """Wall time of `fxcache verify` with the default matrix; its summary."""
    elapsed, doc = run_verify(python, work)
    return elapsed, doc["summary"]


def runnable(python: str) -> list[matrix.Combo]:
    """The default CPU matrix's combinations this torch has the mechanism for (verify skips
    the others, e.g. precompile-api before torch 2.15)."""
    combos = matrix.build(dict.fromkeys(matrix.FLAGS), None)
    combos.devices = ["cpu"]
    version = fingerprint.collect(python).torch_version
    return [c for c in combos.combos() if not torch_support.skip(version, c.to_dict())]


def naive(python: str, work: Path) -> float:
    """Wall time of the naive baseline over the combinations verify runs (`runnable`)."""
    env, private = forkserver.worker_env({**os.environ, **ENV})
    start = time.perf_counter()
    try:
        for combo in runnable(python):
            cdir = work / "naive" / combo.id
            cdir.mkdir(parents=True)
            for phase in ("cold", "hot"):
                fresh = phase == "hot" and combo.mechanism != "fxgraph"
                base = cdir / "hot" if fresh else cdir
                spec = {
                    "phase": phase,
                    "combo": combo.to_dict(),
                    "dir": str(cdir),
                    "inductor_dir": str(base / "inductor"),
                    "triton_dir": str(base / "triton"),
                    "eager": True,
                    "redis_url": None,
                    "cache_tag": "",
                    "artifacts": [str(cdir / "mega.bin")]
                    if phase == "cold" and combo.mechanism in ("mega", "precompile")
                    else [],
                }
                request = cdir / f"{phase}-request.json"
                request.write_text(
                    json.dumps(
                        {
                            "kind": "phase",
                            "spec": spec,
                            "log": str(cdir / f"{phase}.log"),
                            "result": str(cdir / f"{phase}.json"),
                        }
                    )
                )
                subprocess.run(
                    [python, "-m", forkserver.WORKER_NAME, "phase", str(request)],
                    check=True,
                    env=env,
                    stdout=subprocess.DEVNULL,
                )
                if json.loads((cdir / f"{phase}.json").read_text())["status"] != "ok":
                    raise SystemExit(f"naive baseline: {combo.id} {phase} failed")
    finally:
        shutil.rmtree(private, ignore_errors=True)
    return time.perf_counter() - start


def ranks_side_by_side(python: str, work: Path) -> dict[str, tuple[float, float, Any]]:
    """For `--ranks 1` and `--ranks 2` on `RANKS_AXES`, each in its own cache: the first run's
    and the hot-only job's (every combination re-checked) wall times, and the job's verdicts."""
    timed = {}
    for ranks in ("1", "2"):
        where = work / f"ranks-{ranks}"
        where.mkdir()
        first, _ = run_verify(python, where, *RANKS_AXES, "--ranks", ranks)
        hot, doc = run_verify(python, where, *RANKS_AXES, "--ranks", ranks, "--recheck-all")
        if doc["settings"]["phase"] != "hot":
            raise SystemExit(f"--ranks {ranks}: the job after was not hot-only")
        timed[ranks] = (first, hot, [c["verdict"] for c in doc["combos"]])
    return timed


def print_ranks(timed: dict[str, tuple[float, float, Any]]) -> None:
    (first1, hot1, v1), (first2, hot2, v2) = timed["1"], timed["2"]
    print(f"--ranks 1 vs --ranks 2 on {' '.join(RANKS_AXES)}")
    print(f"  first run:     {first1:7.1f} s  vs {first2:7.1f} s  ratio {first2 / first1:.2f}")
    print(f"  hot-only job:  {hot1:7.1f} s  vs {hot2:7.1f} s  ratio {hot2 / hot1:.2f}")
    worst = max(first2 / first1, hot2 / hot1)
    print(
        f"  verdicts {v1} vs {v2}; target <= {RANKS_TARGET:.1f}x: "
        f"{'met' if worst <= RANKS_TARGET else 'MISSED'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--python", default=sys.executable, help="interpreter with torch")
    parser.add_argument("--order", choices=("naive-first", "product-first"), default="naive-first")
    parser.add_argument("--no-naive", action="store_true", help="skip the naive baseline")
    parser.add_argument("--part", choices=("all", "matrix", "modes"), default="all")
    parser.add_argument("--ranks-only", action="store_true", help="only --ranks 1 vs 2")
    args = parser.parse_args()
    if args.part == "modes":
        work = Path(tempfile.mkdtemp(prefix="bench-modes-"))
        try:
            print_modes(modes_part(args.python, work))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return
    load_at_start = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="bench-matrix-"))
    if args.ranks_only:
        try:
            print_ranks(ranks_side_by_side(args.python, work))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print(f"load average (1, 5, 15 min): {load_at_start} at the start, {os.getloadavg()} now")
        return
    try:
        base = None
        if args.order == "naive-first" and not args.no_naive:
            base = naive(args.python, work)
        prod, summary = product(args.python, work)
        if args.order == "product-first" and not args.no_naive:
            base = naive(args.python, work)
        hot = hot_only(args.python, work)
        identity_s, checked = identity_check(args.python, work)
        ranks = ranks_side_by_side(args.python, work)
        modes = modes_part(args.python, work) if args.part == "all" else None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cores = len(os.sched_getaffinity(0))
    print(f"default CPU matrix, {len(runnable(args.python))} combos run, {cores} cores")
    print(f"fxcache verify (fork server, parallel):              {prod:7.1f} s  {summary}")
    if base is not None:
        print(f"naive baseline (fresh python per phase, sequential): {base:7.1f} s")
        print(
            f"ratio product / naive: {prod / base:.2f}  (target <= {TARGET:.2f}: "
            f"{'met' if prod / base <= TARGET else 'MISSED'})"
        )
    (full, full_summary), (policy, policy_summary) = hot["full"], hot["policy"]
    print("the job after: hot-only on that cache")
    print(f"  every combination re-checked (--recheck-all): {full:7.1f} s  {full_summary}")
    print(f"  default (no-gain carried where unchanged):    {policy:7.1f} s  {policy_summary}")
    print(f"  ratio default / full re-check: {policy / full:.2f}")
    if base is not None:
        print(f"  ratio default hot-only / naive first run: {policy / base:.3f}")
    print(
        f"  of which the workload identity check ({checked} combinations): {identity_s:5.2f} s, "
        f"{identity_s / policy:.2f}x of the default hot-only job"
    )
    print_ranks(ranks)
    if modes is not None:
        print_modes(modes)
    print(f"load average (1, 5, 15 min): {load_at_start} at the start, {os.getloadavg()} now")


if __name__ == "__main__":
    main()
