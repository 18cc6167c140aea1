"""The job trace's cost: cold compile time with and without TORCH_TRACE, side by side in one run.

Usage: python benchmarks/bench_job_trace.py [--python PY] [--repeat N] [--blocks B]
Models: the default matrix's workload (sin_matmul, forward + backward) and a larger one, a stack
of B transformer blocks (forward + backward). Each sample is a fresh process with an empty
Inductor cache (a cold compile); with and without the trace alternate, so the machine's load
falls on both alike. Prints, per model, the median compile time of each side, the overhead,
torch's own measure of its structured logging (`structured_logging_overhead_s`), the trace's
size, the time fxcache takes to read it, and what is left on disk once it was read (goal:
overhead at most 5 %, nothing left).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ci_fxcache.jobstats import count, trace

MODEL = r"""
import sys, time, torch, torch.nn as nn
which, blocks = sys.argv[1], int(sys.argv[2])
class Block(nn.Module):
    def __init__(self, d=256, heads=8):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))
if which == "sin_matmul":
    y = torch.rand(100, 100)
    model, inputs = (lambda x: x.sin() @ y), (torch.rand(64, 100, requires_grad=True),)
else:
    model, inputs = nn.Sequential(*[Block() for _ in range(blocks)]), (torch.randn(4, 64, 256),)
compiled = torch.compile(model)
start = time.perf_counter()
compiled(*inputs).sum().backward()
print(time.perf_counter() - start)
"""


def _sample(
    python: str, model: str, blocks: int, traced: bool
) -> tuple[float, int, float, int, float]:
    """(compile seconds, trace bytes, read seconds, bytes left after the read, torch's own
    structured-logging seconds)."""
    work = Path(tempfile.mkdtemp(prefix="bench-trace-"))
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor")}
    env.pop("TORCH_TRACE", None)
    directory = work / "state.json.torch-trace"
    if traced:
        env["TORCH_TRACE"] = str(directory)
    try:
        out = subprocess.run(
            [python, "-c", MODEL, model, str(blocks)], env=env, check=True,
            capture_output=True, text=True,
        ).stdout  # fmt: skip
        seconds = float(out.strip().splitlines()[-1])
        size = sum(p.stat().st_size for p in directory.glob("*")) if traced else 0
        started = time.perf_counter()
        records, _notes = trace.read(directory)
        count.figures(records, count.lookups(records))
        read_s = time.perf_counter() - started
        trace.remove(directory)
        left = sum(p.stat().st_size for p in directory.rglob("*")) if directory.exists() else 0
        logging = sum(
            float(
                (r.head.get("compilation_metrics") or {}).get("structured_logging_overhead_s") or 0
            )
            for r in records
        )
        return seconds, size, read_s if traced else 0.0, left, logging
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--python", default=sys.executable, help="interpreter with torch")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--blocks", type=int, default=4)
    args = parser.parse_args()
    results = {}
    for model in ("sin_matmul", "transformer_stack"):
        plain, traced = [], []
        for _ in range(args.repeat):
            plain.append(_sample(args.python, model, args.blocks, False))
            traced.append(_sample(args.python, model, args.blocks, True))
        base = statistics.median(s[0] for s in plain)
        with_trace = statistics.median(s[0] for s in traced)
        results[model] = {
            "compile_s_without": round(base, 2),
            "compile_s_with": round(with_trace, 2),
            "overhead_pct": round(100 * (with_trace - base) / base, 1),
            # Each pair ran back to back: the median of the pairs' ratios moves less with load.
            "paired_overhead_pct": round(
                100
                * (statistics.median(t[0] / p[0] for p, t in zip(plain, traced, strict=True)) - 1),
                1,
            ),
            # torch's own clock on its structured logging, against the traced compile time.
            "torch_logging_pct": round(100 * statistics.median(t[4] / t[0] for t in traced), 2),
            "samples_without": [round(s[0], 2) for s in plain],
            "samples_with": [round(s[0], 2) for s in traced],
            "trace_bytes": int(statistics.median(s[1] for s in traced)),
            "read_s": round(statistics.median(s[2] for s in traced), 3),
            "bytes_left_after_read": max(s[3] for s in traced),
            "torch_logging_s": round(statistics.median(s[4] for s in traced), 3),
        }
        print(model, json.dumps(results[model]), flush=True)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
