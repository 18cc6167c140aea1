"""One verification phase (cold or hot) of one combination, in a process of its own.

The phase spec and the result are JSON files; tensors travel in `reference.pt` beside the cache.
"""

from __future__ import annotations

import contextlib
import os
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from . import tolerances, workloads
from .tensors import flatten
from .torch_options import MissingOption, note, require, set_option

DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bfloat16-autocast": torch.float32,
}
KERNEL_SUFFIXES = (".so", ".pyd", ".dll", ".cubin", ".hsaco", ".spv")


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
    remote = mechanism == "remote"
    set_option(inductor_config, "fx_graph_remote_cache", remote)
    set_option(inductor_config, "autotune_remote_cache", remote)
    set_option(functorch_config, "enable_remote_autograd_cache", remote)
    if remote:
        os.environ["TORCHINDUCTOR_REDIS_URL"] = spec["redis_url"]
    set_option(dynamo_config, "caching_precompile", mechanism == "precompile")
    tag = spec.get("cache_tag") or ""
    try:
        import torch.compiler.config as compiler_config
    except ImportError:  # torch < 2.6
        if tag:
            raise MissingOption("this torch has no torch.compiler.config.cache_key_tag") from None
    else:
        set_option(compiler_config, "cache_key_tag", tag)


def _run(model: Any, inputs: tuple[Any, ...], spec: dict[str, Any]) -> list[torch.Tensor]:
    """Outputs (and, when training, input and parameter gradients), detached."""
    combo = spec["combo"]
    device = combo["device"]
    autocast = (
        torch.autocast(device_type=device, dtype=torch.bfloat16)
        if combo["dtype"] == "bfloat16-autocast"
        else contextlib.nullcontext()
    )
    if not combo["training"]:
        with torch.no_grad(), autocast:
            return [t.detach().clone() for t in flatten(model(*inputs))]
    leaves = tuple(
        t.detach().clone().requires_grad_(True)
        if isinstance(t, torch.Tensor) and t.is_floating_point()
        else t
        for t in inputs
    )
    params = list(model.parameters()) if isinstance(model, torch.nn.Module) else []
    for p in params:
        p.grad = None
    with autocast:
        outs = flatten(model(*leaves))
    loss = sum(o.float().sum() for o in outs if o.requires_grad)
    if isinstance(loss, torch.Tensor):
        loss.backward()
    grads = [t.grad for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]
    grads += [p.grad for p in params if p.requires_grad]
    return [t.detach().clone() for t in outs] + [g.detach().clone() for g in grads if g is not None]


def _counters() -> dict[str, int]:
    from torch._dynamo.utils import counters

    out: dict[str, int] = {}
    for group, prefix in (("inductor", ""), ("aot_autograd", "aot_"), ("dynamo_cache", "")):
        for name, value in counters[group].items():
            if "cache" in name or "lookup" in name:
                out[prefix + name] = int(value)
    return out


_BUILDS: list[str] = []
_T0 = [0.0]


def _count_kernel_builds() -> bool:
    """Count C++ compiler runs in this process (CppBuilder.build): a hot load that still runs
    the compiler rebuilt kernels, whatever the cache counters say. Files appearing in the cache
    dir prove nothing: artifact loads write compiled kernels there too. False when this torch
    has no such hook."""
    try:
        from torch._inductor import cpp_builder

        original = cpp_builder.CppBuilder.build
    except (ImportError, AttributeError):
        return False
    if getattr(original, "_fxcache_counted", False):
        return True

    def build(self: Any) -> None:
        target = os.path.basename(str(self.get_target_file_path()))
        started = time.perf_counter()
        original(self)
        if target.endswith((".so", ".pyd", ".dll", ".dylib")):  # not header preprocessing
            at = started - _T0[0]
            _BUILDS.append(f"{target} at {at:.1f}s took {time.perf_counter() - started:.1f}s")

    build._fxcache_counted = True  # type: ignore[attr-defined]
    cpp_builder.CppBuilder.build = build
    return True


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().reshape(-1).contiguous().view(torch.uint8)


def compare(
    got: list[torch.Tensor], want: list[torch.Tensor], tol: dict[str, float]
) -> dict[str, Any]:
    """Max absolute error, bitwise equality and closeness (dtype tolerance) of two results."""
    if len(got) != len(want):
        return {
            "max_abs_err": None,
            "bitwise": False,
            "close": False,
            "detail": f"{len(got)} tensors vs {len(want)}",
        }
    err, bitwise, close, detail = 0.0, True, True, ""
    for i, (a, b) in enumerate(zip(got, want, strict=False)):
        if a.shape != b.shape or a.dtype != b.dtype:
            return {
                "max_abs_err": None,
                "bitwise": False,
                "close": False,
                "detail": f"tensor {i}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}",
            }
        a64, b64 = a.detach().cpu().double(), b.detach().cpu().double()
        if a.numel():
            diff = (a64 - b64).abs().nan_to_num(nan=float("inf"))
            both_nan = a64.isnan() & b64.isnan()
            e = float(diff.masked_fill(both_nan, 0.0).max())
            if e > err:
                err = e
        if not torch.equal(_bits(a), _bits(b)):
            bitwise = False
        if not torch.allclose(a64, b64, rtol=tol["rtol"], atol=tol["atol"], equal_nan=True):
            if close:
                detail = f"tensor {i} differs beyond rtol={tol['rtol']} atol={tol['atol']}"
            close = False
    if err == float("inf"):  # NaN or inf where the other side is finite: not valid JSON
        return {
            "max_abs_err": None,
            "bitwise": False,
            "close": False,
            "detail": detail or "non-finite values differ",
        }
    return {"max_abs_err": err, "bitwise": bitwise, "close": close, "detail": detail}


def _compile(model: Any, dynamic: str) -> Any:
    return torch.compile(model, dynamic={"true": True, "false": False}.get(dynamic))


def _mark(inputs: tuple[Any, ...], second: tuple[Any, ...] | None) -> None:
    """mark_dynamic dim 0 of every input whose batch size differs in the second input set."""
    for i, t in enumerate(inputs):
        other = second[i] if second is not None and i < len(second) else None
        if (
            isinstance(t, torch.Tensor)
            and t.dim()
            and isinstance(other, torch.Tensor)
            and other.shape[0] != t.shape[0]
        ):
            torch._dynamo.mark_dynamic(t, 0)


def _timed(fn: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Run the phase described by `spec`; return the evidence (never raises)."""
    result: dict[str, Any] = {"status": "ok", "torch_version": torch.__version__}
    try:
        _phase(spec, result)
    except Exception as exc:
        traceback.print_exc()
        result["status"] = "error"
        result["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
    result["counters"] = _counters()
    return result


def _phase(spec: dict[str, Any], result: dict[str, Any]) -> None:
    from torch._dynamo.utils import counters

    counters.clear()
    _configure(spec)
    combo = spec["combo"]
    combo_dir = Path(spec["dir"])
    tol = tolerances.tolerance(combo["dtype"])
    result["tolerance"] = tol
    torch.manual_seed(0)
    work = workloads.build(combo["workload"], DTYPES[combo["dtype"]], combo["device"])
    dynamic = combo["dynamic"]
    second = work.dynamic_inputs if dynamic != "false" else None
    if dynamic != "false" and second is None:
        raise workloads.WorkloadError(
            f"workload {combo['workload']}: dynamic combinations need 'dynamic_inputs'"
        )
    reference_path = combo_dir / "reference.pt"
    mega_path = combo_dir / "mega.bin"
    counting = _count_kernel_builds()
    if not counting:
        note(
            result,
            "kernel builds not counted: this torch has no "
            "torch._inductor.cpp_builder.CppBuilder.build to hook",
        )
    del _BUILDS[:]
    _T0[0] = time.perf_counter()
    timeline: dict[str, float] = {}
    result["timeline"] = timeline

    def mark(event: str) -> None:
        timeline[event] = round(time.perf_counter() - _T0[0], 3)

    if spec["phase"] == "cold":
        reference: dict[str, Any] = {"inputs": work.inputs, "dynamic_inputs": second}
        if isinstance(work.model, torch.nn.Module):
            reference["state"] = {k: v.detach().clone() for k, v in work.model.state_dict().items()}
        eager = _run(work.model, work.inputs, spec) if spec.get("eager", True) else None
        eager2 = _run(work.model, second, spec) if second and spec.get("eager", True) else None
    else:
        reference = torch.load(reference_path, weights_only=False)
        work.inputs = reference["inputs"]
        second = reference["dynamic_inputs"]
        if reference.get("state") is not None:
            work.model.load_state_dict(reference["state"])
    mark("inputs ready")
    # The compile time runs from loading artifacts through the end of the first call: with
    # caching_precompile, torch.compile() itself loads the package (and builds its kernels).
    started = time.perf_counter()
    loaded, load_s = None, 0.0
    if spec["phase"] == "hot" and combo["mechanism"] in ("mega", "precompile"):
        load = require(torch.compiler, "load_cache_artifacts")
        loaded, load_s = _timed(lambda: load(mega_path.read_bytes()))
        result["artifacts_loaded"] = loaded is not None
    if dynamic == "mark":
        _mark(work.inputs, second)
    compiled = _compile(work.model, dynamic)
    mark("torch.compile returned")
    outs = _run(compiled, work.inputs, spec)
    mark("first call done")
    result["compile_s"] = round(time.perf_counter() - started, 4)
    result["load_s"] = round(load_s, 4)
    outs2 = None
    if second is not None:
        graphs = counters["stats"]["unique_graphs"]
        stance = getattr(torch.compiler, "set_stance", None)
        if spec["phase"] == "hot" and stance is None:
            note(
                result,
                "recompiles counted from Dynamo's graph count: this torch has no "
                "torch.compiler.set_stance('fail_on_recompile')",
            )
        if spec["phase"] == "hot" and stance is not None:
            try:
                with stance("fail_on_recompile"):
                    outs2 = _run(compiled, second, spec)
                result["recompiles"] = 0
            except Exception as exc:
                result["recompiles"] = 1
                result["recompile_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        else:
            outs2 = _run(compiled, second, spec)
            result["recompiles"] = counters["stats"]["unique_graphs"] - graphs
    mark("second shape done")
    if counting:
        result["kernels_built"] = len(_BUILDS)
        result["kernel_builds"] = _BUILDS[:20]
    if spec["phase"] == "cold":
        if eager is not None:
            vs_eager = _vs_eager(outs, eager, work.inputs, work.model, spec, tol, result)
            if outs2 is not None and eager2 is not None and second is not None:
                vs2 = _vs_eager(outs2, eager2, second, work.model, spec, tol, result)
                vs_eager = _worst(vs_eager, vs2)
            result["vs_eager"] = vs_eager
        reference["outputs"] = outs
        reference["dynamic_outputs"] = outs2
        torch.save(reference, reference_path)
        if combo["mechanism"] in ("mega", "precompile"):
            saved = require(torch.compiler, "save_cache_artifacts")()
            if saved is None:
                raise RuntimeError("torch.compiler.save_cache_artifacts() returned nothing")
            mega_path.write_bytes(saved[0])
    else:
        vs_cold = compare(outs, reference["outputs"], tol)
        if outs2 is not None and reference.get("dynamic_outputs") is not None:
            vs_cold = _worst(vs_cold, compare(outs2, reference["dynamic_outputs"], tol))
        result["vs_cold"] = vs_cold


def _vs_eager(
    outs: list[torch.Tensor],
    eager: list[torch.Tensor],
    inputs: tuple[Any, ...],
    model: Any,
    spec: dict[str, Any],
    tol: dict[str, float],
    result: dict[str, Any],
) -> dict[str, Any]:
    """Compiled vs eager; on a mismatch, check that eager itself is reproducible first.

    On this project's AMX CI machine the first eager call of a process has, under load, come
    out ~1e-4 (relative) away from both float64 and a second eager call, while the compiled
    output was right. A mismatch is therefore confirmed against a fresh eager run; an eager
    reference that changes between runs is recorded as evidence, never silently trusted.
    """
    check = compare(outs, eager, tol)
    if check["close"]:
        return check
    again = _run(model, inputs, spec)
    if compare(again, eager, tol)["bitwise"]:
        return check  # eager is reproducible: the compiled output really differs
    result["eager_reproducible"] = False
    result.setdefault("eager_note", []).append(
        "eager reference changed between two runs (max abs err "
        f"{compare(again, eager, tol)['max_abs_err']}); compared with the second run"
    )
    return compare(outs, again, tol)


def _worst(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    errs = [e for e in (a["max_abs_err"], b["max_abs_err"]) if e is not None]
    return {
        "max_abs_err": max(errs) if len(errs) == 2 else None,
        "bitwise": a["bitwise"] and b["bitwise"],
        "close": a["close"] and b["close"],
        "detail": a["detail"] or b["detail"],
    }
