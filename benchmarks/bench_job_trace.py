"""The job trace's cost: cold compile time with and without TORCH_TRACE, side by side in one run.

Usage: python benchmarks/bench_job_trace.py [--python PY] [--repeat N] [--blocks B]
       python benchmarks/bench_job_trace.py --stats [--processes 8] [--graphs 2000]

--stats: `fxcache stats` on a generated trace of an 8-process job with 2,000 graphs (the same
keys in every process), after a real `fxcache restore`: wall and CPU seconds and the peak
memory of the command (goal: at most 2 s and 256 MiB).
Models: the default matrix's workload (sin_matmul, forward + backward) and a larger one, a stack
of B transformer blocks (forward + backward). Each sample is a fresh process with an empty
Inductor cache (a cold compile); with and without the trace alternate, so the machine's load
falls on both alike: pairs run back to back, which side goes first alternating. Compile time is
measured as CPU time (the process's own and its C++ compiler runs'), which a loaded machine
stretches far less than wall time; wall time is reported too. Prints, per model, the overhead
as the median of the pairs' ratios with its spread (quartiles, min, max), torch's own measure
of its structured logging (`structured_logging_overhead_s`), the trace's size, the time fxcache
takes to read it, what is left on disk once it was read, and the load average during the run
(goal: overhead at most 5 %, nothing left).
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
from dataclasses import dataclass
from pathlib import Path

from ci_fxcache.jobstats import count, trace

# A generated trace shaped like torch 2.13's (measured on a real one): per graph and process an
# FX graph lookup whose payload carries the key's components (`[hash] name: value`, one line
# each: the graph's code, its inputs, Inductor's settings...), Dynamo's compilation metrics,
# timed events (`chromium_event`) and the generated code (an artifact the figures skip).
_PREFIX = "V1206 01:09:07.059000 {pid} torch/_inductor/compile_fx.py:1449] "


def _record(pid: int, head: dict[str, object], payload: str | None = None) -> str:
    line = _PREFIX.format(pid=pid) + json.dumps(head) + "\n"
    return line if payload is None else line + "".join(f"\t{x}\n" for x in payload.split("\n"))


def _event(pid: int, name: str, ph: str, ts: float, frame: int) -> str:
    """A timed event as torch writes it (torch._dynamo.utils' chromium events: these keys in
    this order, the payload dumped with `indent=0` by torch._logging.trace_structured)."""
    head = {"chromium_event": {}, "rank": 0, "frame_id": frame, "frame_compile_id": 0}
    event = {"name": name, "ts": ts, "args": {"compile_id": f"{frame}/0"}, "ph": ph,
             "cat": "dynamo_timed", "tid": 0, "pid": 0}  # fmt: skip
    return _record(pid, head, json.dumps(event, indent=0))


def write_trace(directory: Path, processes: int, graphs: int, components: int = 120) -> int:
    """An 8-process-job-shaped trace: `processes` files, each with `graphs` FX graph lookups
    (the same keys in every process, as ranks have; the first process misses, the others hit)
    and their metrics, events and code. Returns its size in bytes."""
    directory.mkdir(parents=True, exist_ok=True)
    settings = [f"[h{i:010d}] inductor_config[setting_{i}]: {i % 7}" for i in range(components)]
    size = 0
    for rank in range(processes):
        pid = 1000 + rank
        path = directory / f"dedicated_log_torch_trace_rank_{rank}_x.log"
        with path.open("w", encoding="utf-8") as out:
            for g in range(graphs):
                base = {"rank": rank, "frame_id": g, "frame_compile_id": 0}
                ts = 1.0e15 + g * 1e6
                code = f"def forward(self, x):\n    return torch.sin(x) * {g}\n" * 8
                state = "miss" if rank == 0 else "hit"
                lookup = {
                    "key": f"f{g:051d}", "cache_state": state, "cache_event_time": int(ts * 1000),
                    "components": [f"[g{g:010d}] gm: {code}",
                                   f"[e{g % 13:010d}] example_inputs[0]: f32[{g % 13 + 1}, 8]",
                                   *settings],
                    "time_taken_ns" if state == "miss" else "time_saved_ns": 2 * 10**9,
                }  # fmt: skip
                parts = [
                    _event(pid, "dynamo", "B", ts, g),
                    _event(pid, "bytecode_tracing", "B", ts + 10, g),
                    _event(pid, "bytecode_tracing", "E", ts + 3000, g),
                    _event(pid, "build_guards", "B", ts + 3100, g),
                    _event(pid, "build_guards", "E", ts + 4000, g),
                    _event(pid, "backend_compile", "B", ts + 4100, g),
                    _record(pid, {"artifact": {"name": f"fx_graph_cache_{state}",
                                               "encoding": "json"}, **base},
                            json.dumps(lookup)),
                    _record(pid, {"artifact": {"name": "inductor_output_code",
                                               "encoding": "string"}, **base}, code * 4),
                    _event(pid, "compile_file", "B", ts + 5000, g),
                    _event(pid, "compile_file", "E", ts + 90_000, g),
                    _event(pid, "backend_compile", "E", ts + 95_000, g),
                    _event(pid, "dynamo", "E", ts + 100_000, g),
                    _record(pid, {"compilation_metrics": {
                        "compile_id": f"{g}/0", "entire_frame_compile_time_s": 0.1,
                        "dynamo_config": json.dumps({f"option_{i}": i for i in range(150)}),
                    }, **base}),
                ]  # fmt: skip
                text = "".join(parts)
                size += len(text)
                out.write(text)
    return size


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
import resource
def cpu():
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # the C++ compiler runs, waited for
    return time.process_time() + kids.ru_utime + kids.ru_stime
compiled = torch.compile(model)
start, start_cpu = time.perf_counter(), cpu()
compiled(*inputs).sum().backward()
print(time.perf_counter() - start, cpu() - start_cpu)
"""


@dataclass(frozen=True)
class Sample:
    """One cold compile: wall and CPU seconds (the process's own and its C++ compiler runs'),
    the trace's size, fxcache's read of it, what is left after the read, torch's own clock on
    its structured logging, and the machine's load average when it started."""

    wall_s: float
    cpu_s: float
    trace_bytes: int = 0
    read_s: float = 0.0
    left_bytes: int = 0
    logging_s: float = 0.0
    load: float = 0.0


def _sample(python: str, model: str, blocks: int, traced: bool) -> Sample:
    work = Path(tempfile.mkdtemp(prefix="bench-trace-"))
    # One compile thread: no worker pool whose CPU time the parent could not see; both sides alike.
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor"),
           "TORCHINDUCTOR_COMPILE_THREADS": "1"}  # fmt: skip
    env.pop("TORCH_TRACE", None)
    directory = work / "state.json.torch-trace"
    if traced:
        env["TORCH_TRACE"] = str(directory)
    load = os.getloadavg()[0]
    try:
        out = subprocess.run(
            [python, "-c", MODEL, model, str(blocks)], env=env, check=True,
            capture_output=True, text=True,
        ).stdout  # fmt: skip
        wall, cpu = (float(x) for x in out.strip().splitlines()[-1].split())
        if not traced:
            return Sample(wall, cpu, load=load)
        size = sum(p.stat().st_size for p in directory.glob("*"))
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
        return Sample(wall, cpu, size, read_s, left, logging, load)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _pct(ratios: list[float]) -> dict[str, float]:
    """Overhead in per cent: the median of the pairs' ratios, and their spread."""
    qs = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    return {
        "median": round(100 * (statistics.median(ratios) - 1), 1),
        "q1": round(100 * (qs[0] - 1), 1),
        "q3": round(100 * (qs[2] - 1), 1),
        "min": round(100 * (min(ratios) - 1), 1),
        "max": round(100 * (max(ratios) - 1), 1),
    }


def measure(python: str, model: str, blocks: int, pairs: int) -> dict[str, object]:
    """`pairs` back-to-back pairs, which side runs first alternating (ABBA), so load and any
    drift fall on both alike; the overhead is the median of the pairs' ratios."""
    plain, traced = [], []
    for i in range(pairs):
        order = (False, True) if i % 2 == 0 else (True, False)
        got = {side: _sample(python, model, blocks, side) for side in order}
        plain.append(got[False])
        traced.append(got[True])
    loads = [s.load for s in plain + traced]
    return {
        "pairs": pairs,
        "cpu_overhead_pct": _pct([t.cpu_s / p.cpu_s for p, t in zip(plain, traced, strict=True)]),
        "wall_overhead_pct": _pct(
            [t.wall_s / p.wall_s for p, t in zip(plain, traced, strict=True)]
        ),
        "cpu_s_without": round(statistics.median(s.cpu_s for s in plain), 2),
        "cpu_s_with": round(statistics.median(s.cpu_s for s in traced), 2),
        "wall_s_without": [round(s.wall_s, 2) for s in plain],
        "wall_s_with": [round(s.wall_s, 2) for s in traced],
        # torch's own clock on its structured logging, against the traced CPU time.
        "torch_logging_pct": round(
            100 * statistics.median(t.logging_s / t.cpu_s for t in traced), 2
        ),
        "trace_bytes": int(statistics.median(s.trace_bytes for s in traced)),
        "read_s": round(statistics.median(s.read_s for s in traced), 3),
        "read_pct": round(100 * statistics.median(t.read_s / t.cpu_s for t in traced), 2),
        "bytes_left_after_read": max(s.left_bytes for s in traced),
        "load_average_1min": [
            round(min(loads), 1),
            round(statistics.median(loads), 1),
            round(max(loads), 1),
        ],
    }


def stats_cost(python: str, processes: int, graphs: int, repeat: int) -> dict[str, object]:
    """`fxcache stats --json` on a generated trace in the job-private directory of a real
    restore: the command's wall and CPU seconds and its peak resident memory (the median of
    `repeat` runs, and the largest peak)."""
    work = Path(tempfile.mkdtemp(prefix="bench-stats-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FXCACHE_", "TORCH"))}
    env["FXCACHE_ROOT"] = str(work / "root")
    state = work / "state.json"
    try:
        subprocess.run(
            [sys.executable, "-m", "ci_fxcache", "restore", "--python", python,
             "--state-file", str(state)], env=env, check=True, capture_output=True,
        )  # fmt: skip
        size = write_trace(trace.job_trace_dir(state), processes, graphs)
        walls, cpus, peaks = [], [], []
        for _ in range(repeat):
            started = time.perf_counter()
            with (work / "stats.json").open("wb") as out:
                child = subprocess.Popen(
                    [sys.executable, "-m", "ci_fxcache", "stats", "--state-file", str(state),
                     "--json"], env=env, stdout=out, stderr=subprocess.DEVNULL,
                )  # fmt: skip
                _, status, usage = os.wait4(child.pid, 0)  # this command's own rusage
            child.returncode = os.waitstatus_to_exitcode(status)
            assert child.returncode == 0, child.returncode
            walls.append(time.perf_counter() - started)
            cpus.append(usage.ru_utime + usage.ru_stime)
            peaks.append(usage.ru_maxrss * 1024)
            doc = json.loads((work / "stats.json").read_text(encoding="utf-8"))
        return {
            "trace_bytes": size,
            "graphs": doc["graphs"],
            "processes": doc["processes"],
            "wall_s": round(statistics.median(walls), 2),
            "cpu_s": round(statistics.median(cpus), 2),
            "peak_mib": round(max(peaks) / (1 << 20), 1),
            "load_average_1min": round(os.getloadavg()[0], 1),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--python", default=sys.executable, help="interpreter with torch")
    parser.add_argument("--repeat", type=int, default=6, help="pairs per model")
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--models", default="sin_matmul,transformer_stack")
    parser.add_argument("--stats", action="store_true", help="time `fxcache stats` instead")
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--graphs", type=int, default=2000)
    args = parser.parse_args()
    print(f"cpus: {os.cpu_count()}", flush=True)
    if args.stats:
        got = stats_cost(args.python, args.processes, args.graphs, min(args.repeat, 3))
        print(json.dumps(got, indent=2))
        return
    results = {}
    for model in args.models.split(","):
        results[model] = measure(args.python, model, args.blocks, args.repeat)
        print(model, json.dumps(results[model]), flush=True)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
