"""Every built-in workload in every documented mode, on the CPU: no `unsafe`, no `error`.

Runs `fxcache verify` over the built-in workloads x float32, float16, bfloat16,
bfloat16-autocast x dynamic false, true, mark x fxgraph x training true, false (120
combinations; tens of minutes on 2 cores) and fails unless every combination is `safe` or
`no-gain`. Without an injected fault, an `unsafe` or `error` here is a false alarm of the
verdicts (or a broken built-in workload), not a cache problem.

Usage: python benchmarks/check_builtin_combos.py [--python PY] [--jobs N] [--json OUT]
       [--workloads A,B] [--dtypes ...] [--dynamic ...] [--training ...]
Prints a summary table (verdict and cause per combination, then counts); exit 1 on any
unsafe or error.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from ci_fxcache.worker.workloads import BUILTINS

AXES = {
    "workloads": ",".join(BUILTINS),
    "dtypes": "float32,float16,bfloat16,bfloat16-autocast",
    "dynamic": "false,true,mark",
    "training": "true,false",
}
ENV = {"TORCHINDUCTOR_COMPILE_THREADS": "1"}


def run_verify(args: argparse.Namespace, out: Path, cache: Path) -> int:
    """`fxcache verify` over the matrix; its exit status (`--fail-on error`)."""
    command = [sys.executable, "-m", "ci_fxcache", "verify", "--device", "cpu"]
    command += ["--mechanisms", "fxgraph", "--fail-on", "error"]
    for axis in AXES:
        command += [f"--{axis}", getattr(args, axis)]
    command += ["--cache-dir", str(cache), "--json", str(out)]
    if args.python:
        command += ["--python", args.python]
    if args.jobs:
        command += ["--jobs", str(args.jobs)]
    return subprocess.run(command, env={**os.environ, **ENV}, check=False).returncode


def table(doc: dict[str, Any]) -> str:
    """Markdown: one row per combination that is not a plain hit, then the counts."""
    rows = ["| combination | verdict | cause | speedup | notes |", "|---|---|---|---|---|"]
    counts: Counter[tuple[str, str]] = Counter()
    for combo in doc["combos"]:
        counts[(combo["verdict"], combo["cause"])] += 1
        kinds = ", ".join(sorted({n["kind"] for n in combo["notes"]}))
        if combo["cause"] != "hit" or kinds:
            speed = f"{combo['speedup']}x" if combo.get("speedup") is not None else "-"
            rows.append(
                f"| {combo['id']} | {combo['verdict']} | {combo['cause']} | {speed} | {kinds} |"
            )
    rows += ["", "| verdict | cause | combinations |", "|---|---|---|"]
    rows += [f"| {v} | {c} | {n} |" for (v, c), n in sorted(counts.items())]
    rows.append(f"\n{len(doc['combos'])} combinations: {doc['summary']}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    """Run, print the table, exit 1 on any unsafe or error."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", help="interpreter with torch (default: fxcache's choice)")
    parser.add_argument("--jobs", type=int, help="parallel combinations")
    parser.add_argument("--json", metavar="OUT", help="keep the results document here")
    for axis, default in AXES.items():
        parser.add_argument(f"--{axis}", default=default)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fxcache-builtins-") as work:
        out = Path(args.json) if args.json else Path(work) / "results.json"
        code = run_verify(args, out, Path(work) / "cache")
        if not out.exists():
            print(f"fxcache verify wrote no results (exit {code})", file=sys.stderr)
            return 2
        doc = json.loads(out.read_text())
    print(table(doc))
    bad = [c["id"] for c in doc["combos"] if c["verdict"] in ("unsafe", "error")]
    if bad:
        print(f"FAIL: {len(bad)} unsafe or error: {', '.join(bad)}", file=sys.stderr)
        return 1
    print("OK: no built-in combination is unsafe or error")
    return 0


if __name__ == "__main__":
    sys.exit(main())
