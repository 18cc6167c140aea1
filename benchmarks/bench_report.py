"""`fxcache report` on large results documents: 4,000 and 20,000 combinations, side by side.

Usage: python benchmarks/bench_report.py [--sizes 4000 20000] [--fleet]
Writes synthetic documents (the H200 fixture's combinations over many workloads), runs
`fxcache report --format md` and `--format text` on each in a fresh process, and prints the
wall and CPU times and the CPU time per combination between the sizes (linear time keeps it
near 1).
Target: 20,000 combinations in under 5 s per format.
"""

from __future__ import annotations

import argparse
import copy
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "data" / "results_h200.json"
TARGET_S = 5.0


def document(size: int, fleet: bool) -> dict:
    """A results document (or a 4-environment fleet) holding `size` combinations."""
    base = json.loads(FIXTURE.read_text())
    per = base["combos"]
    combos = []
    for i in range(size):
        c = copy.deepcopy(per[i % len(per)])
        c["workload"] = f"model_{i // len(per):05d}"
        c["id"] = f"{c['workload']}-{c['id']}"
        combos.append(c)
    if not fleet:
        base["combos"] = combos
        return base
    groups = []
    quarter = size // 4
    for g in range(4):
        shard = copy.deepcopy(base)
        shard["runner"]["name"] = f"gpu-{g}"
        shard["scope_key"] = shard["scope_key"][:-12] + f"{g:012x}"
        shard["combos"] = combos[g * quarter : (g + 1) * quarter]
        groups.append({"key": str(g), "shards": [shard]})
    return {"schema": "fxcache-merged/2", "report_id": "bench", "groups": groups}


def timed(path: Path, fmt: str) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system) of one `fxcache report` process; on a
    shared, loaded machine the CPU time is the steadier figure."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "ci_fxcache", "report", str(path), "--format", fmt],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def _met(seconds: float) -> str:
    return "met" if seconds < TARGET_S else "MISSED"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[4000, 20000])
    parser.add_argument("--fleet", action="store_true", help="a 4-environment merged document")
    args = parser.parse_args()
    results: dict[tuple[int, str], tuple[float, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            path = Path(tmp) / f"r{size}.json"
            path.write_text(json.dumps(document(size, args.fleet)))
            for fmt in ("md", "text"):
                wall, cpu = results[size, fmt] = timed(path, fmt)
                print(
                    f"{size:>6} combinations, --format {fmt:<4}: {wall:6.2f} s wall, "
                    f"{cpu:6.2f} s CPU"
                )
    small, large = min(args.sizes), max(args.sizes)
    for fmt in ("md", "text"):
        per_small = results[small, fmt][1] / small
        per_large = results[large, fmt][1] / large
        wall, cpu = results[large, fmt]
        print(
            f"--format {fmt}: CPU time per combination {large} vs {small}: "
            f"{per_large / per_small:.2f}x (1.0 = linear); target {large} < {TARGET_S} s: "
            f"wall {_met(wall)}, CPU {_met(cpu)}"
        )


if __name__ == "__main__":
    main()
