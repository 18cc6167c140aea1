"""Where the compile time went, from the timed events torch writes into its trace
(`chromium_event` records: `{"name", "ph": "B"|"E", "ts"}` in microseconds, nested). Each
event's own time (its span less its children's) goes to the phase its name says, or to the
phase of the event it runs inside. Measured names, torch 2.13 and 2.15 on the CPU: `dynamo` >
`entire_frame_compile` > `compile_attempt_0` > `bytecode_tracing`, `build_guards`,
`backend_compile` > (`AOTAutogradCache.inductor_load` > `PyCodeCache.load_by_key_path` >
`compile_file` on a hit; `create_aot_dispatcher_function` > ... `inductor_compile` >
`fx_codegen_and_compile` > `code_gen` > `compile_file` on a miss); `entire_backward_compile`
for the backward."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

DYNAMO, GUARDS, AOT = "Dynamo tracing", "guard building", "AOTAutograd tracing"
LOAD, INDUCTOR, AUTOTUNE = "cache lookup and load", "Inductor compiling", "autotuning"
CUDAGRAPHS, OTHER = "CUDA-graph capture", "other"
PHASES = (DYNAMO, GUARDS, AOT, LOAD, INDUCTOR, AUTOTUNE, CUDAGRAPHS, OTHER)
DEPTH = 256  # open events kept per process; deeper ones are not timed
PROCESSES_SHOWN = 64

_LOAD_PREFIXES = ("AOTAutogradCache", "FxGraphCache", "TritonBundler", "CacheBase",
                  "inductor_codecache", "PyCodeCache", "load_")  # fmt: skip
_INDUCTOR_PREFIXES = ("inductor_compile", "fx_codegen_and_compile", "GraphLowering", "Scheduler",
                      "code_gen", "compile_fx", "compile_file", "pass.", "_recursive_",
                      "PythonWrapperCodegen", "triton", "async_compile", "CppCodeCache",
                      "TritonCodeCache", "cpp_")  # fmt: skip


@lru_cache(maxsize=1024)  # a job's events repeat a few hundred names thousands of times
def phase_of(name: str) -> str | None:
    """The phase an event's own time belongs to; None: that of the event it runs inside."""
    low = name.lower()
    if "autotune" in low or low.startswith("benchmark"):
        return AUTOTUNE
    if "cudagraph" in low:
        return CUDAGRAPHS
    if name == "build_guards":
        return GUARDS
    if name in ("dynamo", "entire_frame_compile", "bytecode_tracing") or name.startswith(
        "compile_attempt_"
    ):
        return DYNAMO
    if name.startswith(_LOAD_PREFIXES) or name.endswith("_load"):
        return LOAD
    if name.startswith(_INDUCTOR_PREFIXES):
        return INDUCTOR
    if name in ("backend_compile", "create_aot_dispatcher_function", "entire_backward_compile",
                "min_cut_rematerialization_partition") or name.startswith("aot_"):  # fmt: skip
        return AOT
    return None


class Phases:
    """Seconds per phase and process, from the events as they come. Events that overlap
    inside one parent (Inductor's compile threads time their C++ builds side by side) are
    scaled to the parent's span, so that the parts add up to the time torch spent."""

    def __init__(self) -> None:
        # process -> open events: [name, begin (us), phase, {phase: s} of what ran inside]
        self._open: dict[str, list[list[Any]]] = {}
        self.seconds: dict[str, dict[str, float]] = {}

    def timed(self, process: str, name: str, ph: object, ts: float) -> None:
        """One timed event of `process`: its name, phase ("B" begins, "E" ends; anything else
        is ignored) and time (us)."""
        stack = self._open.get(process)
        if stack is None:
            stack = self._open[process] = []
        if ph == "B":
            if len(stack) < DEPTH:
                parent = stack[-1][2] if stack else OTHER
                stack.append([name, float(ts), phase_of(name) or parent, {}])
        elif ph == "E":
            if stack and stack[-1][0] == name:  # the usual case: the innermost event ends
                at: int | None = len(stack) - 1
            else:
                at = next((i for i in range(len(stack) - 1, -1, -1) if stack[i][0] == name), None)
            if at is None:
                return
            opened = stack[at]
            del stack[at:]  # events left open inside it are not timed
            span = max(0.0, float(ts) - opened[1]) / 1e6
            inside: dict[str, float] = opened[3]
            total = sum(inside.values())
            if total > span:  # children that ran side by side: their shares of the span
                inside = {k: v * span / total for k, v in inside.items()}
            inside[opened[2]] = inside.get(opened[2], 0.0) + max(0.0, span - total)
            into = stack[-1][3] if stack else self.seconds.setdefault(process, {})
            for phase, seconds in inside.items():
                into[phase] = into.get(phase, 0.0) + seconds

    def figures(self, ranks: dict[str, int], processes: list[str]) -> dict[str, Any]:
        """`{job: {phase: s}, processes: [{process, rank, phases}], largest, per_process_s}`:
        the job's seconds summed over `processes` (those that compiled: a compile worker's
        builds are inside its parent's time); `per_process_s` the largest part's seconds in
        the process that spent the most on it."""
        seconds = {p: self.seconds[p] for p in processes if p in self.seconds}
        job = {p: 0.0 for p in PHASES}
        for spent in seconds.values():
            for phase, s in spent.items():
                job[phase] += s
        shown = [
            {"process": p[:120], "rank": ranks.get(p),
             "phases": {k: round(v, 3) for k, v in spent.items() if v >= 0.0005}}
            for p, spent in list(seconds.items())[:PROCESSES_SHOWN]
        ]  # fmt: skip
        largest = max((p for p in PHASES if p != OTHER), key=lambda p: job[p], default=None)
        if largest is not None and job[largest] <= 0:
            largest = None
        most = max((s.get(largest or OTHER, 0.0) for s in seconds.values()), default=0.0)
        return {
            "job": {p: round(s, 3) for p, s in job.items() if s >= 0.0005},
            "total_s": round(sum(job.values()), 3),
            "processes": shown,
            "largest": largest,
            "per_process_s": round(most, 3) if largest else 0.0,
        }
