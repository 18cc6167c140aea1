"""One verification phase (cold or hot) of one combination, in a process of its own.

The phase spec and the result are JSON files; tensors travel in `reference.pt` beside the cache.
A phase is four steps: prepare (the workload, its state and a warm-up), the timed compile (the
first call), the second input shape, and record (cold) or compare (hot). Both phases reach the
timer from the same warm state, and every call of the model starts from the recorded state and
a fixed seed, so cold and hot see the same random numbers (docs/verify.md).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import os
import random
import re
import shutil
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import torch

from . import (
    artifacts,
    identity,
    keyinfo,
    ranks,
    tolerances,
    triton_builds,
    workarounds,
    workloads,
)
from .accuracy import bitwise_equal, compare, fp64_judgement
from .tensors import flatten
from .torch_options import MissingOption, note, require, set_option

DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bfloat16-autocast": torch.float32,
}
KERNEL_SUFFIXES = (".so", ".pyd", ".dll", ".cubin", ".hsaco", ".spv")


class Torch(NamedTuple):
    """What a mechanism turns on in torch: the worker's half of its record in
    ci_fxcache/mechanisms.py, keyed by the same name (the worker imports nothing of the
    orchestrator: tests/test_mechanisms.py checks that both name the same mechanisms and agree)."""

    remote: bool = False  # torch's Redis remote caches
    caching_precompile: bool = False
    cache_artifacts: bool = False  # hot: load_cache_artifacts(CACHE_ARTIFACTS) before compiling
    artifact: bool = False  # compiled and loaded through torch's save/load APIs (artifacts.py)


# The mega-cache blob the runner has the cold phase write (spec["artifacts"]).
CACHE_ARTIFACTS = "mega.bin"
TORCH: dict[str, Torch] = {
    "fxgraph": Torch(),
    "mega": Torch(cache_artifacts=True),
    "precompile": Torch(caching_precompile=True, cache_artifacts=True),
    "remote": Torch(remote=True),
    "aot": Torch(artifact=True),
    "precompile-api": Torch(artifact=True),
}


def _configure(spec: dict[str, Any]) -> None:
    """Point Inductor at this combination's cache dirs and enable exactly one mechanism.

    Set explicitly rather than through the environment: the fork server imported the config
    modules before this phase's environment existed.
    """
    import torch._dynamo.config as dynamo_config
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    mechanism = spec["combo"]["mechanism"]
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = spec["inductor_dir"]
    os.environ["TRITON_CACHE_DIR"] = spec["triton_dir"]
    set_option(inductor_config, "force_disable_caches", False)
    set_option(inductor_config, "fx_graph_cache", True)
    set_option(functorch_config, "enable_autograd_cache", True)
    turns = TORCH[mechanism]
    remote = turns.remote
    set_option(inductor_config, "fx_graph_remote_cache", remote)
    set_option(inductor_config, "autotune_remote_cache", remote)
    set_option(functorch_config, "enable_remote_autograd_cache", remote)
    if remote:
        os.environ["TORCHINDUCTOR_REDIS_URL"] = spec["redis_url"]
    set_option(dynamo_config, "caching_precompile", turns.caching_precompile)
    if turns.artifact:
        artifacts.configure(mechanism)
    if spec.get("deterministic"):
        _deterministic(inductor_config)
    # The remote mechanism's own tag isolates its entries; otherwise the user's tag stays.
    tag = spec.get("cache_tag") or os.environ.get("TORCH_COMPILE_CACHE_KEY_TAG", "")
    try:
        import torch.compiler.config as compiler_config
    except ImportError:  # torch < 2.6
        if tag:
            raise MissingOption("this torch has no torch.compiler.config.cache_key_tag") from None
    else:
        set_option(compiler_config, "cache_key_tag", tag)


def _deterministic(inductor_config: Any) -> None:
    """`--deterministic`: torch's deterministic algorithms and Inductor's deterministic mode.

    Both are part of torch's cache key: FxGraphHashDetails hashes
    `torch.are_deterministic_algorithms_enabled()` (with warn-only and
    fill_uninitialized_memory) and the Inductor config, `deterministic` included (not in
    `_cache_config_ignore_prefix`; torch 2.13.0 and 2.14.1). cuBLAS needs its workspace setting
    before its first use, which comes later in this process."""
    deterministic_algorithms()
    set_option(inductor_config, "deterministic", True)


def deterministic_algorithms() -> None:
    """torch's deterministic algorithms, with the cuBLAS workspace they need (eager too: the
    identity check's eager step runs as the cold phase's did)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)


def _counters() -> dict[str, int]:
    from torch._dynamo.utils import counters

    out: dict[str, int] = {}
    for group, prefix in (("inductor", ""), ("aot_autograd", "aot_"), ("dynamo_cache", "")):
        for name, value in counters[group].items():
            if "cache" in name or "lookup" in name:
                out[prefix + name] = int(value)
    return out


# Inductor's counters of autotuning work (torch 2.13 and 2.15 alike): template choices
# benchmarked (select_algorithm), the coordinate-descent tuner's and a combo kernel's benchmarks.
AUTOTUNE_COUNTERS = ("select_algorithm_autotune", "coordesc_tuning_bench", "combo_autotune_bench")
# The timers (dynamo_timed names) that hold their seconds: `<op>_template_autotuning`,
# `<op>_template_precompiling` (select_algorithm) and the Triton autotuner's benchmarks.
AUTOTUNE_TIMERS = ("_template_autotuning", "_template_precompiling", "benchmark_all_configs",
                   "coordinate_descent")  # fmt: skip


def autotune_evidence() -> dict[str, Any] | None:
    """What this process autotuned (None: nothing): the counters and the seconds torch timed.
    A hot process that autotunes redid work the cache should have carried."""
    from torch._dynamo.utils import compilation_time_metrics, counters

    ran = {k: int(counters["inductor"][k]) for k in AUTOTUNE_COUNTERS if counters["inductor"][k]}
    if not ran:
        return None
    seconds = sum(
        sum(times)
        for name, times in compilation_time_metrics.items()
        if any(t in name for t in AUTOTUNE_TIMERS)
    )
    return {"counters": ran, "s": round(seconds, 3)}


# The timers of CUDA graph trees' capture (torch/_inductor/cudagraph_trees.py, 2.13 and 2.15):
# recording a graph is run time on every start, not compile time a cache can save.
CUDAGRAPH_TIMERS = ("CUDAGraphNode.record", "cudagraphify")


def cudagraph_capture_s(device: str) -> float | None:
    """Seconds this process spent capturing CUDA graphs (None: none captured, or no CUDA: on
    the CPU torch skips the graphs and times nothing)."""
    from torch._dynamo.utils import compilation_time_metrics

    if not device.startswith("cuda") or not torch.cuda.is_available():
        return None
    spent = sum(
        sum(times)
        for name, times in compilation_time_metrics.items()
        if name.startswith(CUDAGRAPH_TIMERS)
    )
    return round(spent, 4) if spent else None


class KernelBuilds:
    """C++ compiler runs (CppBuilder.build) in this process, timed from `start()`: a hot load
    that still runs the compiler rebuilt kernels, whatever the cache counters say. Files
    appearing in the cache dir prove nothing: artifact loads write compiled kernels there too.

    With a memo directory (one per verify run, `BuildMemo`), a build whose command and source
    bytes another phase of the run already compiled copies that library instead of running
    the compiler again: it is still counted (the verdict stands), and `served` says how many
    were copied (their compile time is then not this phase's own)."""

    entries: ClassVar[list[str]] = []
    t0: ClassVar[float] = 0.0
    counting: ClassVar[bool] = False
    memo: ClassVar[BuildMemo | None] = None
    serves: ClassVar[bool] = True  # False: this phase only keeps what it builds
    served: ClassVar[int] = 0

    @classmethod
    def start(cls, memo_dir: str | None = None, serves: bool = True) -> bool:
        """Start counting; False when this torch has no C++ builder hook to count with."""
        cls.counting = counting = cls.install()
        cls.entries = []
        cls.served = 0
        cls.memo = BuildMemo(Path(memo_dir)) if memo_dir else None
        cls.serves = serves
        cls.t0 = time.perf_counter()
        return counting

    @classmethod
    def install(cls) -> bool:
        try:
            from torch._inductor import cpp_builder

            original = cpp_builder.CppBuilder.build
        except (ImportError, AttributeError):
            return False
        if getattr(original, "_fxcache_counted", False):
            return True

        def build(self: Any) -> None:
            target = str(self.get_target_file_path())
            started = time.perf_counter()
            library = target.endswith((".so", ".pyd", ".dll", ".dylib"))  # not preprocessing
            memo = cls.memo
            served = library and cls.serves and memo is not None and memo.serve(self, target)
            if not served:
                original(self)
                if library and memo is not None:
                    memo.keep(self, target)
            if library:
                took = time.perf_counter() - started
                how = " (copied from this run's build memo)" if served else ""
                cls.served += bool(served)
                name = os.path.basename(target)
                cls.entries.append(f"{name} at {started - cls.t0:.1f}s took {took:.1f}s{how}")

        build._fxcache_counted = True  # type: ignore[attr-defined]
        cpp_builder.CppBuilder.build = build
        return True


class BuildMemo:
    """Libraries the C++ compiler built in this verify run, by a hash of the command line (the
    phase's own cache directory written as one placeholder) and of every input file it names.
    The same command on the same bytes gives the same library: a phase that needs one another
    phase built copies it. Written atomically; an unreadable entry is built again."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def key(self, builder: Any, target: str) -> str | None:
        """The memo key of a build, or None for one outside this phase's cache directory."""
        base = os.environ.get("TORCHINDUCTOR_CACHE_DIR", "")
        if not base or not target.startswith(base):
            return None
        command = str(builder.get_command_line())
        digest = hashlib.sha256(command.replace(base, "<cache>").encode())
        for word in command.split():
            if word.startswith(base) and word != target and os.path.isfile(word):
                digest.update(word.replace(base, "<cache>").encode() + b"\0")
                digest.update(Path(word).read_bytes())
        return digest.hexdigest()

    def serve(self, builder: Any, target: str) -> bool:
        """Copy the library another phase built for this command, if there is one (False, and
        the phase builds it, whenever that fails)."""
        try:
            key = self.key(builder, target)
            if key is None or not (self.root / f"{key}.so").is_file():
                return False
            Path(target).parent.mkdir(parents=True, exist_ok=True)
            part = f"{target}.{os.getpid()}.part"
            shutil.copyfile(self.root / f"{key}.so", part)
            os.chmod(part, 0o755)
            os.replace(part, target)
        except OSError:
            return False
        return True

    def keep(self, builder: Any, target: str) -> None:
        """Record the library just built (the last phase to finish a build replaces it with
        the same bytes); a failure only means later phases build it themselves."""
        with contextlib.suppress(OSError):
            key = self.key(builder, target)
            if key is None or not os.path.isfile(target):
                return
            self.root.mkdir(parents=True, exist_ok=True)
            part = self.root / f"{key}.{os.getpid()}.part"
            shutil.copyfile(target, part)
            os.replace(part, self.root / f"{key}.so")


# Every call of the model is seeded: the first input shape with FIRST_SEED, the second with
# SECOND_SEED; OTHER_SEED only tells whether the model draws random numbers at all. The
# factory is called after seed_all(FACTORY_SEED).
FIRST_SEED, SECOND_SEED, OTHER_SEED, FACTORY_SEED = 1234, 1235, 4321, 0


def seed_all(seed: int) -> None:
    """Seed every RNG a factory or a model may draw from: torch's (all devices), Python's
    `random`, and numpy's global one where numpy is installed (a data pipeline draws its batch
    from it). Without the last two, a factory drawing from them built other bits in every
    process, and each job called its model changed (issue 47)."""
    random.seed(seed)
    torch.manual_seed(seed)
    # `import torch` imports numpy itself wherever numpy is installed: the worker imports
    # nothing beyond the standard library and torch (tests/test_verify_plan.py).
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed)


@dataclass
class PhaseRun:
    """One phase's workload, reference and clock, passed between its steps."""

    spec: dict[str, Any]
    work: workloads.Workload
    second: tuple[Any, ...] | None
    reference: dict[str, Any]
    tol: dict[str, float]
    marked: list[int] = field(default_factory=list)
    t0: float = field(default_factory=time.perf_counter)
    timeline: dict[str, float] = field(default_factory=dict)
    names: list[str] = field(default_factory=list)  # of the last call's tensors (`which`)
    projection: Any = None  # the training loss term (`_projected` unless the mechanism says)

    @property
    def combo(self) -> dict[str, Any]:
        return dict(self.spec["combo"])

    @property
    def cold(self) -> bool:
        return bool(self.spec["phase"] == "cold")

    @property
    def path(self) -> Path:
        return Path(self.spec["dir"])

    def mark(self, event: str) -> None:
        """Note the time of `event` (after the device finished the work queued before it)."""
        self.sync()
        self.timeline[event] = round(time.perf_counter() - self.t0, 3)

    def sync(self) -> None:
        """Wait for the device, so that a timer mark covers the work queued before it."""
        if str(self.combo["device"]).startswith("cuda") and torch.cuda.is_available():
            torch.cuda.synchronize()

    def call(self, model: Any, inputs: tuple[Any, ...], seed: int) -> list[torch.Tensor]:
        """`model` on `inputs` from the recorded state and `seed` (outputs, then gradients)."""
        if isinstance(self.work.model, torch.nn.Module) and self.reference.get("state"):
            self.work.model.load_state_dict(self.reference["state"])
        seed_all(seed)
        combo = self.combo
        autocast = combo["dtype"] == "bfloat16-autocast"
        self.names = []
        if isinstance(model, artifacts.PrecompiledStep):
            return model.run(inputs, self.names)
        return run_model(
            model,
            inputs,
            combo["device"],
            combo["training"],
            autocast,
            self.marked,
            self.names,
            self.projection or _projected,
        )

    def which(self, index: int) -> str:
        """What the `index`-th tensor of the last call's result is (an output or a gradient)."""
        return self.names[index] if index < len(self.names) else f"tensor {index}"


def run_model(
    model: Any,
    inputs: tuple[Any, ...],
    device: str,
    training: bool,
    autocast: bool,
    marked: list[int],
    names: list[str] | None = None,
    projection: Any = None,
) -> list[torch.Tensor]:
    """Outputs (and, when training, input and parameter gradients), detached.

    `marked`: indices of the inputs whose dim 0 is `mark_dynamic` (training clones the inputs
    into fresh leaves, which would lose the mark). `names`, when given, receives what each
    returned tensor is (`output 0`, `gradient of input 1`, `gradient of net.0.weight`).
    `projection`: the loss term of one output (default `_projected`)."""
    projection = projection or _projected
    names = [] if names is None else names
    context = (
        torch.autocast(device_type=device, dtype=torch.bfloat16)
        if autocast
        else contextlib.nullcontext()
    )
    args = tuple(
        t.detach().clone().requires_grad_(True)
        if training and isinstance(t, torch.Tensor) and t.is_floating_point()
        else t
        for t in inputs
    )
    for i in marked:
        torch._dynamo.mark_dynamic(args[i], 0)
    if not training:
        with torch.no_grad(), context:
            outs = [t.detach().clone() for t in flatten(model(*args))]
        names.extend(f"output {i}" for i in range(len(outs)))
        return outs
    named = list(model.named_parameters()) if isinstance(model, torch.nn.Module) else []
    params = [p for _, p in named]
    for p in params:
        p.grad = None
    with context:
        outs = flatten(model(*args))
    loss = sum(projection(i, o) for i, o in enumerate(outs) if o.requires_grad)
    if isinstance(loss, torch.Tensor):
        loss.backward()
    names.extend(f"output {i}" for i in range(len(outs)))
    grads: list[tuple[str, torch.Tensor | None]] = [
        (f"gradient of input {i}", t.grad)
        for i, t in enumerate(args)
        if isinstance(t, torch.Tensor) and t.requires_grad
    ]
    grads += [(f"gradient of {n}", p.grad) for n, p in named if p.requires_grad]
    names.extend(n for n, g in grads if g is not None)
    return [t.detach().clone() for t in outs] + [
        g.detach().clone() for _, g in grads if g is not None
    ]


def _projected(index: int, out: torch.Tensor) -> torch.Tensor:
    """The training loss term of one output: its dot product with fixed seeded weights.

    A plain `out.sum()` has an identically zero gradient through a final LayerNorm (the sum of
    a normalised vector does not depend on its input), so every gradient before it would be
    rounding noise and any accuracy check on it meaningless. The weights depend only on the
    output's index and shape, so eager, cold, hot and the float64 reference see the same loss.
    """
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1000 + index))
    wide = torch.float64 if out.dtype == torch.float64 else torch.float32
    return (out.to(wide) * weights.to(device=out.device, dtype=wide)).sum()


def _marked(inputs: tuple[Any, ...], second: tuple[Any, ...] | None) -> list[int]:
    """Indices of the inputs whose batch size (dim 0) differs in the second input set."""
    return [
        i
        for i, t in enumerate(inputs)
        if isinstance(t, torch.Tensor)
        and t.dim()
        and second is not None
        and i < len(second)
        and isinstance(second[i], torch.Tensor)
        and second[i].shape[0] != t.shape[0]
    ]


def _compile(work: workloads.Workload, combo: dict[str, Any], model: Any) -> Any:
    """torch.compile of `model` (the workload's, wrapped for its ranks) as the combination
    names it: its dynamic mode and compile mode (the default mode passes none, as a user who
    never names one does), and the factory's other arguments (`compile`), the same in every
    phase."""
    mode = combo.get("mode") or "default"
    dynamic = {"true": True, "false": False}.get(combo["dynamic"])
    kwargs = dict(work.compile)
    if mode != "default" and "options" in kwargs:
        # torch.compile takes a mode or options, not both: the mode's own options (what
        # torch.compile would apply for it), then the factory's on top
        from torch._inductor import list_mode_options

        kwargs["options"] = {**list_mode_options(mode, dynamic), **kwargs["options"]}
    elif mode != "default":
        kwargs["mode"] = mode
    return torch.compile(model, dynamic=dynamic, **kwargs)


def _timed(fn: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Run the phase described by `spec`; return the evidence (never raises)."""
    result: dict[str, Any] = {
        "status": "ok",
        "torch_version": torch.__version__,
        "pid": os.getpid(),
    }
    keyinfo.install()
    device = spec["combo"]["device"]
    triton_builds.install(
        in_process=spec["phase"] == "hot" and device == "cuda",
        cache_dir=Path(spec["triton_dir"]),
        device=device,
    )
    try:
        ranks.setup(spec, result)  # one rank of several: joins the process group
        _phase(spec, result)
    except Exception as exc:
        traceback.print_exc()
        result["status"] = "error"
        result["error"] = error_line(exc)
    finally:
        ranks.teardown()
    result["counters"] = _counters()
    autotuned = autotune_evidence()
    if autotuned is not None:
        result["autotune"] = autotuned
    capture = cudagraph_capture_s(device)
    if capture is not None:
        result["cudagraph_capture_s"] = capture
    result["keyinfo"] = keyinfo.collect(spec["combo"]["device"])
    result.update(triton_builds.evidence())
    return result


def error_line(exc: BaseException) -> str:
    """The exception as one line: its lines joined, not only the first (torch's guard failures
    name the failed guard on later lines: `GuardManager check failed, reason: GuardDebugInfo(`
    then `verbose_code_parts=[...]`)."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:500]


def _phase(spec: dict[str, Any], result: dict[str, Any]) -> None:
    run = prepare(spec, result)
    compiled, outs = timed_compile(run, result)
    outs2 = second_shape(run, compiled, result)
    if "artifact" in result:
        result["artifact"].update(artifacts.compile_work())
    if KernelBuilds.counting:
        result["kernels_built"] = len(KernelBuilds.entries)
        result["kernel_builds"] = KernelBuilds.entries[:20]
        if KernelBuilds.served:
            result["kernels_from_memo"] = KernelBuilds.served
    if run.cold:
        self_check(run, compiled, outs, outs2, result)
        record(run, outs, outs2, result)
    else:
        compare_with_cold(run, compiled, outs, outs2, result)
        workarounds.unmarked_inputs(run, compiled, result, _vs_eager, SECOND_SEED)


def load_reference(path: Path) -> dict[str, Any]:
    """The cold phase's `reference.pt`, read without running code: a file in the cache dir is
    data (tensors, lists, dicts), never a pickle that may import and call arbitrary objects."""
    try:
        loaded = torch.load(path, weights_only=True)
    except Exception as exc:
        raise RuntimeError(
            f"{path.name} is not a plain tensor file ({type(exc).__name__}); the cache dir may "
            "have been tampered with: run the cold phase again"
        ) from None
    if not isinstance(loaded, dict) or "outputs" not in loaded:
        raise RuntimeError(f"{path.name} does not hold a cold phase's reference")
    return loaded


def build(
    spec: dict[str, Any], modules: identity.Modules | None = None
) -> tuple[PhaseRun, identity.Modules]:
    """The workload as its factory makes it now (from seed 0), its own inputs and state as the
    reference; and what it imports from here on (the identity's `source` and `libraries`), or
    since `modules` started."""
    combo = spec["combo"]
    modules = modules or identity.Modules()
    seed_all(FACTORY_SEED)
    work = workloads.build(combo["workload"], DTYPES[combo["dtype"]], combo["device"])
    dynamic = combo["dynamic"]
    second = work.dynamic_inputs if dynamic != "false" else None
    if dynamic != "false" and second is None:
        raise workloads.WorkloadError(
            f"workload {combo['workload']}: dynamic combinations need 'dynamic_inputs'"
        )
    reference: dict[str, Any] = {"inputs": work.inputs, "dynamic_inputs": second}
    if isinstance(work.model, torch.nn.Module):
        reference["state"] = {k: v.detach().clone() for k, v in work.model.state_dict().items()}
    run = PhaseRun(spec, work, second, reference, tolerances.tolerance(combo["dtype"]))
    if combo["mechanism"] == "precompile-api":
        run.projection = artifacts.fixed_projection
    return run, modules


def eager_step(run: PhaseRun) -> list[torch.Tensor]:
    """One eager call on the run's inputs from its reference state and the first seed: the
    warm-up of both phases, the cold phase's eager reference and the identity's eager step."""
    return run.call(run.work.model, run.work.inputs, FIRST_SEED)


def workload_identity(run: PhaseRun, modules: identity.Modules, eager: list[Any]) -> dict[str, str]:
    """The identity (worker/identity.py) of the workload `build` made, after its eager step."""
    reference = run.reference
    return identity.of(
        run.combo["workload"],
        modules,
        reference.get("state"),
        run.work.inputs,
        run.second,
        eager,
        run.work.compile,
    )


def factory_repeats(spec: dict[str, Any], found: dict[str, str]) -> bool:
    """Whether the factory, called again from the same seeds, builds the same weights and
    inputs as the call whose identity is `found` (the cold phase asks, once per reference: a
    factory that does not is compared by `identity.LOOSE` from then on)."""
    again, _ = build(spec)
    parts = identity.built(again.reference.get("state"), again.work.inputs, again.second)
    return parts["state"] == found["state"] and parts["inputs"] == found["inputs"]


def prepare(spec: dict[str, Any], result: dict[str, Any]) -> PhaseRun:
    """Configure Inductor, build the workload (hot: with the cold phase's inputs and state),
    and warm up with one eager call, the same in both phases, before the timer starts. The
    cold phase keeps that call as its eager reference and records the workload's identity."""
    from torch._dynamo.utils import counters

    counters.clear()
    _configure(spec)
    result["tolerance"] = tolerances.tolerance(spec["combo"]["dtype"])
    run, modules = build(spec)
    if spec["phase"] != "cold":
        run.reference = load_reference(Path(spec["dir"]) / "reference.pt")
        run.work.inputs = tuple(run.reference["inputs"])
        run.second = run.reference["dynamic_inputs"]
    # The warm-up: library loads and first-call costs happen here in both phases, outside the
    # timer.
    warm = eager_step(run)
    if run.cold:
        found = workload_identity(run, modules, warm)
        if not factory_repeats(spec, found):
            found["factory"] = identity.NOT_DETERMINISTIC
            result["factory_deterministic"] = False
        result["identity"] = run.reference["identity"] = found
        run.reference["identity_eager"] = warm
        if spec.get("eager", True):
            run.reference["eager"] = warm
    if spec["combo"]["dynamic"] == "mark":
        run.marked = _marked(run.work.inputs, run.second)
    run.sync()
    if not KernelBuilds.start(spec.get("build_memo"), bool(spec.get("build_memo_serves", True))):
        note(
            result,
            "kernel builds not counted: this torch has no "
            "torch._inductor.cpp_builder.CppBuilder.build to hook",
        )
    run.t0 = KernelBuilds.t0
    result["timeline"] = run.timeline
    run.mark("inputs ready")
    return run


def timed_compile(run: PhaseRun, result: dict[str, Any]) -> tuple[Any, list[torch.Tensor]]:
    """Compile and call once. The compile time runs from loading artifacts through the end of
    the first call (forward and backward): with caching_precompile, torch.compile() itself
    loads the package (and builds its kernels)."""
    combo = run.combo
    turns = TORCH[combo["mechanism"]]
    run.sync()
    started = time.perf_counter()
    load_s = 0.0
    if not run.cold and turns.cache_artifacts:
        mega = (run.path / CACHE_ARTIFACTS).read_bytes()
        load = require(torch.compiler, "load_cache_artifacts")
        loaded, load_s = _timed(lambda: load(mega))
        result["artifacts_loaded"] = loaded is not None
    if turns.artifact:
        compiled = _artifact(run, result)
        load_s = float(result["artifact"].get("load_s") or 0.0)
    else:
        compiled = _compile(run.work, combo, ranks.wrap(run.work.model, result))
    run.mark("torch.compile returned")
    outs = run.call(compiled, run.work.inputs, FIRST_SEED)
    run.mark("first call done")
    # The graphs of the first call: what a recompile on the second shape adds comes after.
    result["first_call_lookups"] = keyinfo.count()
    result["compile_s"] = round(time.perf_counter() - started, 4)
    result["load_s"] = round(load_s, 4)
    tracing = _tracing_s()
    if tracing is not None:
        result["tracing_s"] = tracing
    return compiled, outs


def _tracing_s() -> float | None:
    """Seconds this process's Dynamo spent outside the backend (tracing, bytecode, guards): the
    part of a compile no cache skips. None where this torch does not account for it
    (`torch._dynamo.utils.calculate_time_spent`: `entire_frame_compile` holds `backend_compile`)."""
    try:
        from torch._dynamo.utils import calculate_time_spent

        spent = calculate_time_spent()
    except (ImportError, AttributeError):
        return None
    if not spent.get("entire_frame_compile"):
        return None
    return round(max(0.0, spent["entire_frame_compile"] - spent.get("backend_compile", 0.0)), 4)


def _artifact(run: PhaseRun, result: dict[str, Any]) -> Any:
    """What an artifact mechanism's phase calls: cold compiles and saves (on the first call),
    hot loads; `result["artifact"]` records which file, whether it loaded, or why not."""
    combo = run.combo
    evidence: dict[str, Any] = {"mechanism": combo["mechanism"]}
    result["artifact"] = evidence
    if combo["mechanism"] == "aot":
        return artifacts.aot(run.work.model, combo["dynamic"], run.path, run.cold, evidence)
    unbacked = _marked(run.work.inputs, run.second) if combo["dynamic"] != "false" else []
    scratch = Path(run.spec["inductor_dir"]).parent
    return artifacts.precompiled(
        run.work.model, combo, run.path, scratch, run.cold, unbacked, evidence
    )


def second_shape(run: PhaseRun, compiled: Any, result: dict[str, Any]) -> list[torch.Tensor] | None:
    """Call with the second input shape under `fail_on_recompile`; on a recompile record
    torch's guard failure and call again, letting it recompile, so both phases have outputs."""
    if run.second is None:
        return None
    stance = getattr(torch.compiler, "set_stance", None)
    if stance is None:
        note(
            result,
            "recompiles counted from Dynamo's graph count: this torch has no "
            "torch.compiler.set_stance('fail_on_recompile')",
        )
        from torch._dynamo.utils import counters

        graphs = counters["stats"]["unique_graphs"]
        outs2 = run.call(compiled, run.second, SECOND_SEED)
        result["recompiles"] = counters["stats"]["unique_graphs"] - graphs
        run.mark("second shape done")
        return outs2
    try:
        with stance("fail_on_recompile"):
            outs2 = run.call(compiled, run.second, SECOND_SEED)
        result["recompiles"] = 0
    except Exception as exc:
        message = f"{type(exc).__name__}: {exc}"
        result["recompiles"] = 1
        result["recompile_error"] = message.splitlines()[0][:300]
        result["recompile_guard"] = guard_failure(message)
        outs2 = run.call(compiled, run.second, SECOND_SEED)
    run.mark("second shape done")
    return outs2


def guard_failure(message: str) -> str:
    """The failed guards of torch's recompile error (its `- 0/0: tensor 'x' size mismatch ...`
    lines, without the user stack trace), joined; the first line of the message if none."""
    lines = message.splitlines()
    found = [
        " ".join(line.strip()[1:].split())
        for line in lines
        if re.match(r"-\s*\d+/\d+: ", line.strip())
    ]
    if found:
        return "; ".join(found)[:500]
    return lines[0][:300] if lines else ""


def record(
    run: PhaseRun,
    outs: list[torch.Tensor],
    outs2: list[torch.Tensor] | None,
    result: dict[str, Any],
) -> None:
    """Cold: judge compiled vs eager, save the reference (and the mega-cache artifacts)."""
    reference = run.reference
    eager = reference.pop("eager", None)
    if eager is not None:
        vs_eager = _vs_eager(run, outs, eager, run.work.inputs, FIRST_SEED, result)
        if outs2 is not None and run.second is not None:
            eager2 = run.call(run.work.model, run.second, SECOND_SEED)
            vs2 = _vs_eager(run, outs2, eager2, run.second, SECOND_SEED, result)
            vs_eager = _worst(vs_eager, vs2)
        result["vs_eager"] = vs_eager
    reference["outputs"] = outs
    reference["dynamic_outputs"] = outs2
    torch.save(reference, run.path / "reference.pt")
    # The spec names each combination this cold phase serves that loads mega-cache artifacts.
    if run.spec["artifacts"]:
        saved = require(torch.compiler, "save_cache_artifacts")()
        if saved is None:
            raise RuntimeError("torch.compiler.save_cache_artifacts() returned nothing")
        for path in run.spec["artifacts"]:
            Path(path).write_bytes(saved[0])


def compare_with_cold(
    run: PhaseRun,
    compiled: Any,
    outs: list[torch.Tensor],
    outs2: list[torch.Tensor] | None,
    result: dict[str, Any],
) -> None:
    """Hot: compare with the cold outputs; when they are not bitwise equal, check whether the
    compiled model is bitwise stable against itself (atomics, nondeterministic algorithms)."""
    reference = run.reference
    vs_cold = compare(outs, reference["outputs"], run.tol)
    if outs2 is not None and reference.get("dynamic_outputs") is not None:
        vs_cold = _worst(vs_cold, compare(outs2, reference["dynamic_outputs"], run.tol))
    result["vs_cold"] = vs_cold
    if ranks.any_rank(not vs_cold["bitwise"]):  # its calls run collectives on every rank
        self_check(run, compiled, outs, outs2, result)


def self_check(
    run: PhaseRun,
    compiled: Any,
    outs: list[torch.Tensor],
    outs2: list[torch.Tensor] | None,
    result: dict[str, Any],
) -> None:
    """Call the compiled model again on every input shape, from the same seed and state: is it
    bitwise stable against itself (atomics, nondeterministic algorithms)? Records
    `self_stable` and, when not, which tensor of which shape changed and by how much."""
    shapes = [("first", run.work.inputs, FIRST_SEED, outs)]
    if outs2 is not None and run.second is not None:
        shapes.append(("second", run.second, SECOND_SEED, outs2))
    changed: list[str] = []
    for shape, inputs, seed, before in shapes:
        again = run.call(compiled, inputs, seed)
        if bitwise_equal(again, before):
            continue
        index = _first_difference(again, before)
        err = compare(again, before, run.tol)["max_abs_err"]
        changed.append(
            f"{run.which(index)} on the {shape} input shape changed by up to {err} between two "
            "calls from one seed"
        )
    result["self_stable"] = not changed
    if changed:
        result["self_stable_detail"] = "; ".join(changed)[:500]


def _first_difference(got: list[torch.Tensor], want: list[torch.Tensor]) -> int:
    """The index of the first tensor that is not bitwise equal (its count when they all are)."""
    for i, (a, b) in enumerate(zip(got, want, strict=False)):
        if not bitwise_equal([a], [b]):
            return i
    return min(len(got), len(want))


def _vs_eager(
    run: PhaseRun,
    outs: list[torch.Tensor],
    eager: list[torch.Tensor],
    inputs: tuple[Any, ...],
    seed: int,
    result: dict[str, Any],
) -> dict[str, Any]:
    """Compiled vs eager. Within the dtype tolerance passes; otherwise, in this order: an eager
    reference that changes between two runs from one seed is replaced by the second run; a
    model whose eager output changes with the seed (when eager is not reproducible: beyond the
    tolerance under another seed, within it under the same) draws random numbers, which Inductor
    generates differently from eager (unless `fallback_random`, part of the cache key), so it
    is not compared element by element; what remains is judged against a float64 run.

    On this project's AMX CI machine the first eager call of a process has, under load, come
    out ~1e-4 (relative) away from both float64 and a second eager call, while the compiled
    output was right: hence the eager recheck, recorded as evidence, never silently trusted.
    """
    check = compare(outs, eager, run.tol)
    if check["close"]:
        return check
    model = run.work.model
    first = eager
    again = run.call(model, inputs, seed)
    reproducible = bitwise_equal(again, eager)
    if not reproducible:
        result["eager_reproducible"] = False
        result.setdefault("eager_note", []).append(
            "eager reference changed between two runs (max abs err "
            f"{compare(again, eager, run.tol)['max_abs_err']}); compared with the second run"
        )
        eager, check = again, compare(outs, again, run.tol)
        if check["close"]:
            return check
    other = run.call(model, inputs, OTHER_SEED)
    if reproducible:
        draws = not bitwise_equal(other, eager)
    else:
        # Eager changes from one seed: a changed output under another seed proves nothing by
        # itself. It draws random numbers only if one seed stays within the tolerance and
        # another seed does not.
        same_seed = compare(again, first, run.tol)["close"]
        draws = same_seed and not compare(other, eager, run.tol)["close"]
    if draws:
        result["random_ops"] = True
        return {**check, "close": True, "detail": "not compared: the model draws random numbers"}
    try:
        fp64 = _fp64_outputs(run, inputs, seed)
    except Exception as exc:
        return {**check, "detail": f"{check['detail']}; no float64 reference ({exc})"[:300]}
    combo = run.combo
    low = combo["dtype"] != "float32"
    passes, measured = fp64_judgement(outs, eager, fp64, run.tol, low)
    if passes:
        result["fp64_checked"] = (
            f"compiled differs from eager beyond the {combo['dtype']} tolerance but is about "
            f"as close to a float64 run ({measured})"
        )
        return {**check, "close": True}
    return {**check, "detail": f"{check['detail']}; {measured}"}


def _fp64_outputs(run: PhaseRun, inputs: tuple[Any, ...], seed: int) -> list[torch.Tensor]:
    """The eager model in float64 (no autocast) from the recorded state and `seed`."""
    model = run.work.model
    if isinstance(model, torch.nn.Module):
        model = copy.deepcopy(model).to(torch.float64)
        if run.reference.get("state"):
            state = {
                k: v.double() if v.is_floating_point() else v
                for k, v in run.reference["state"].items()
            }
            model.load_state_dict(state)
    wide = tuple(
        t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in inputs
    )
    torch.manual_seed(seed)
    combo = run.combo
    return run_model(
        model, wide, combo["device"], combo["training"], False, [], None, run.projection
    )


def _worst(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    errs = [e for e in (a["max_abs_err"], b["max_abs_err"]) if e is not None]
    return {
        "max_abs_err": max(errs) if len(errs) == 2 else None,
        "bitwise": a["bitwise"] and b["bitwise"],
        "close": a["close"] and b["close"],
        "detail": a["detail"] or b["detail"],
    }
