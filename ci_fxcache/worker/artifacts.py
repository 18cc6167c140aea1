"""The artifact mechanisms: torch's own APIs that save compiled code to a file and load it back.

- `aot`: `torch.compile(fn, fullgraph=True).aot_compile(((args), {}))`, then
  `save_compiled_function(path)`; a fresh process calls `torch.compiler.load_compiled_function`.
  A module is compiled through its class's `forward` with the module as the first argument, so
  the artifact holds no weights (the module is passed again when the loaded function is called).
- `precompile-api`: torch 2.15's `torch.compiler.precompile.capture(fn, artifact_path=...,
  cache_path=...)` (a make_fx trace of one call, lowered to Python source plus a kernel cache),
  then `torch.compiler.precompile.load(artifact_path, cache_path)`. The captured function is the
  whole step: the forward and, when training, the gradients (`torch.autograd.grad`: the API
  refuses input gradients left in `.grad`), so the loaded artifact returns what `run_model`
  returns. Dynamic dims are the API's `mark_unbacked` (dim 0 of the inputs whose batch size
  differs), for `dynamic: true` and `mark` alike.

The cold phase writes the artifact into the combination's directory; the hot phase loads it
(timed from the load through the first call) with empty cache directories. A load that torch
refuses (an exception, or precompile's "falling back to JIT" warning) is recorded in
`artifact.refused` and the phase falls back to the cold path, as a job would, so its outputs
can still be compared.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .tensors import flatten
from .torch_options import MissingOption, require, set_option

AOT_FILE = "aot.bin"
PRECOMPILE_FILES = ("precompile-api.py", "precompile-api.cache")
# precompile's load logs these (torch 2.15 `torch/_precompile.py`) when it ignores the cache
# half of the pair and compiles the kernels from the Python source instead.
_PRECOMPILE_FALLBACK = "Falling back to JIT from python_code"


def configure(mechanism: str) -> None:
    """Turn on what the mechanism needs (checked by presence: a clear error when missing)."""
    import torch._dynamo.config as dynamo_config

    if mechanism == "aot":
        # Off by default before torch 2.13 (2.9.0, 2.10.0); torch.compile() reads it.
        set_option(dynamo_config, "enable_aot_compile", True)
        require(torch.compiler, "load_compiled_function")
    elif mechanism == "precompile-api":
        api = getattr(torch.compiler, "precompile", None)
        if api is not None and not hasattr(api, "capture"):
            raise MissingOption(
                "this torch's torch.compiler.precompile is the torch 2.14 callable "
                "(precompile(fn, *inputs)), which fxcache does not support; precompile-api "
                "needs torch 2.15's module (torch.compiler.precompile.capture / load)"
            )
        require(require(torch.compiler, "precompile"), "capture")


def fixed_projection(index: int, out: torch.Tensor) -> torch.Tensor:
    """The training loss term of one output for `precompile-api`: its dot product with a fixed
    pattern over the output's trailing dims, broadcast over the batch.

    The captured step cannot draw seeded weights (a generator is no graph input) nor take
    weights shaped like a batch it does not know yet, so the pattern is computed in the step,
    the same way in eager: the eager reference and the gradients use this loss too."""
    wide = torch.float64 if out.dtype == torch.float64 else torch.float32
    trailing = tuple(out.shape[1:])
    count = 1
    for size in trailing:
        count *= int(size)
    ramp = torch.arange(count, device=out.device, dtype=wide)
    weights = (ramp * 0.6180339887 + 0.1 * index).remainder(1.0).sub(0.5).reshape(trailing)
    return (out.to(wide) * weights).sum()


class _AotFunction:
    """`aot_compile` on the first call (with the real, possibly marked, arguments), saved to
    `path` when given; every later call runs the compiled function."""

    def __init__(self, target: Any, dynamic: bool | None, path: Path | None) -> None:
        self.target, self.dynamic, self.path = target, dynamic, path
        self.fn: Any = None

    def __call__(self, *args: Any) -> Any:
        if self.fn is None:
            wrapper = torch.compile(self.target, fullgraph=True, dynamic=self.dynamic)
            self.fn = require(wrapper, "aot_compile")((args, {}))
            if self.path is not None:
                self.fn.save_compiled_function(str(self.path))
        return self.fn(*args)


class _BoundModule(torch.nn.Module):
    """A module's compiled `forward`, called with the module first (the artifact holds no
    weights); its parameters are the module's, as `torch.compile`'s wrapper module's are."""

    def __init__(self, call: Callable[..., Any], module: torch.nn.Module) -> None:
        super().__init__()
        self._orig_mod = module
        self._call = call

    def forward(self, *args: Any) -> Any:
        return self._call(self._orig_mod, *args)


def _bind(call: Callable[..., Any], model: Any) -> Any:
    return _BoundModule(call, model) if isinstance(model, torch.nn.Module) else call


def _refusal(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:300]


def aot(model: Any, dynamic: str, directory: Path, cold: bool, evidence: dict[str, Any]) -> Any:
    """The callable a phase runs for `aot`: cold compiles and saves on its first call; hot loads
    the artifact (falling back to the cold path when torch refuses it)."""
    target = type(model).forward if isinstance(model, torch.nn.Module) else model
    flag = {"true": True, "false": False}.get(dynamic)
    path = directory / AOT_FILE
    if cold:
        evidence["file"] = AOT_FILE
        return _bind(_AotFunction(target, flag, path), model)
    evidence.update(_file_facts(path))
    started = time.perf_counter()
    try:
        with open(path, "rb") as f:
            loaded = torch.compiler.load_compiled_function(f)
    except Exception as exc:
        evidence.update(loaded=False, refused=_refusal(exc))
        return _bind(_AotFunction(target, flag, None), model)
    evidence.update(loaded=True, load_s=round(time.perf_counter() - started, 4))
    return _bind(loaded, model)


def _file_facts(*paths: Path) -> dict[str, Any]:
    sizes = {p.name: p.stat().st_size for p in paths if p.is_file()}
    return {"file": ", ".join(p.name for p in paths), "bytes": sum(sizes.values())}


class PrecompiledStep:
    """`precompile-api`: the whole step (forward, and the gradients when training) captured on
    the first cold call, or loaded hot. `run` returns what `phase.run_model` returns."""

    def __init__(
        self,
        model: Any,
        training: bool,
        autocast: bool,
        device: str,
        files: tuple[Path, Path],
        unbacked: list[int],
    ) -> None:
        self.model, self.training, self.autocast, self.device = model, training, autocast, device
        self.files, self.unbacked = files, unbacked
        self.runnable: Any = None
        self.captured = False

    @property
    def module(self) -> torch.nn.Module | None:
        return self.model if isinstance(self.model, torch.nn.Module) else None

    def step(self, *flat: Any) -> tuple[torch.Tensor, ...]:
        """What is captured: positional arguments only (the module first, if any)."""
        module = self.module
        xs = flat[1:] if module is not None else flat
        model = module if module is not None else self.model
        context = (
            torch.autocast(device_type=self.device, dtype=torch.bfloat16)
            if self.autocast
            else contextlib.nullcontext()
        )
        if not self.training:
            with torch.no_grad(), context:
                return tuple(t.detach() for t in flatten(model(*xs)))
        with context:
            outs = flatten(model(*xs))
        loss = sum(fixed_projection(i, o) for i, o in enumerate(outs) if o.requires_grad)
        targets = [t for t in xs if isinstance(t, torch.Tensor) and t.requires_grad]
        if module is not None:
            targets += [p for _, p in module.named_parameters() if p.requires_grad]
        grads = torch.autograd.grad(loss, targets, allow_unused=True) if targets else ()
        return (*(o.detach() for o in outs), *(g for g in grads if g is not None))

    def names(self, inputs: tuple[Any, ...], count: int, outputs: int) -> list[str]:
        """What each returned tensor is, as `run_model` names them (generic when unclear)."""
        names = [f"output {i}" for i in range(outputs)]
        if self.training:
            names += [f"gradient of input {i}" for i, t in enumerate(inputs) if _leaf(t)]
            if self.module is not None:
                names += [
                    f"gradient of {n}" for n, p in self.module.named_parameters() if p.requires_grad
                ]
        return names if len(names) == count else [f"tensor {i}" for i in range(count)]

    def capture(self, args: tuple[Any, ...]) -> tuple[torch.Tensor, ...]:
        """Capture the step from this call into `files`; the call's result."""
        for i in self.unbacked:
            torch._dynamo.decorators.mark_unbacked(args[i], 0, shape_id="batch")
        code, cache = self.files
        api = torch.compiler.precompile
        with api.capture(self.step, artifact_path=str(code), cache_path=str(cache)) as cap:
            result = cap(*self._flat(args))
        self.captured = True
        return tuple(result)

    def load(self, evidence: dict[str, Any]) -> None:
        """Load the pair (hot); a refusal is recorded and leaves `runnable` unset."""
        evidence.update(_file_facts(*self.files))
        started = time.perf_counter()
        with _warnings("torch._precompile") as warned:
            try:
                self.runnable = torch.compiler.precompile.load(*(str(f) for f in self.files))
            except Exception as exc:
                evidence.update(loaded=False, refused=_refusal(exc))
                return
        fallback = [w for w in warned if _PRECOMPILE_FALLBACK in w]
        if fallback:
            evidence.update(loaded=False, refused=fallback[0].splitlines()[0][:300])
        else:
            evidence.update(loaded=True, load_s=round(time.perf_counter() - started, 4))

    def _flat(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return (self.module, *args) if self.module is not None else args

    def run(self, inputs: tuple[Any, ...], names: list[str]) -> list[torch.Tensor]:
        """The step on `inputs` (fresh gradient leaves when training), capturing first when
        nothing was loaded: cold, or hot after a refusal (into the hot scratch directory)."""
        args = tuple(
            t.detach().clone().requires_grad_(True) if self.training and _leaf(t) else t
            for t in inputs
        )
        if self.runnable is None and not self.captured:
            result = self.capture(args)
        else:
            if self.runnable is None:  # captured in this process: serve what was written
                self.runnable = torch.compiler.precompile.load(*(str(f) for f in self.files))
            result = tuple(self.runnable(*self._flat(args)))
        outputs = len(result) - self._gradient_count(args, result)
        names.extend(self.names(inputs, len(result), outputs))
        return [t.detach().clone() for t in result]

    def _gradient_count(self, args: tuple[Any, ...], result: tuple[Any, ...]) -> int:
        if not self.training:
            return 0
        count = sum(1 for t in args if _leaf(t))
        if self.module is not None:
            count += sum(1 for p in self.module.parameters() if p.requires_grad)
        return min(count, len(result))


def _leaf(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point()


def precompiled(
    model: Any,
    combo: dict[str, Any],
    directory: Path,
    scratch: Path,
    cold: bool,
    unbacked: list[int],
    evidence: dict[str, Any],
) -> PrecompiledStep:
    """The step a phase runs for `precompile-api` (hot: loaded here, inside the timer)."""
    files = (directory / PRECOMPILE_FILES[0], directory / PRECOMPILE_FILES[1])
    step = PrecompiledStep(
        model,
        bool(combo["training"]),
        combo["dtype"] == "bfloat16-autocast",
        str(combo["device"]),
        files,
        unbacked if cold else [],
    )
    if cold:
        evidence["file"] = ", ".join(PRECOMPILE_FILES)
    else:
        step.load(evidence)
        if step.runnable is None:  # refused: the fallback captures afresh, into scratch
            step.files = (scratch / PRECOMPILE_FILES[0], scratch / PRECOMPILE_FILES[1])
            step.unbacked = unbacked
    return step


@contextlib.contextmanager
def _warnings(logger_name: str) -> Any:
    """The WARNING records `logger_name` emits inside the block (messages)."""
    seen: list[str] = []

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = _Keep(level=logging.WARNING)
    logger = logging.getLogger(logger_name)
    logger.addHandler(handler)
    try:
        yield seen
    finally:
        logger.removeHandler(handler)


def compile_work() -> dict[str, int]:
    """What this process compiled: Dynamo traces and AOTAutograd (Inductor) compiles."""
    from torch._dynamo.utils import counters

    return {
        "traced_graphs": int(counters["stats"]["unique_graphs"]),
        "compiled_graphs": int(counters["aot_autograd"]["total"]),
    }
