"""A workload's identity: what must be unchanged for a recorded reference to judge it.

A hot-only run compares the hot load with the outputs its cold phase recorded. That is only
right while the workload is the one the reference was recorded for; a pull request that edits
the model would otherwise be judged against the old model's outputs (a false `unsafe`).
The identity holds, each as a sha256:

- `source`: the bytes of every module the workload imported from outside the interpreter's
  installation (the user's package, a module it imports; fxcache's own `workloads.py` for a
  built-in workload): an edited line changes it, whatever it does to the numbers;
- `libraries`: the name and version of each installed distribution the workload's own modules
  use (a transformers upgrade), and of the workload's package where it is installed;
- `state`, `inputs`: the factory's initial weights and buffers, and its inputs (with the second
  input shape where the combination is dynamic), names, dtypes, shapes and bits;
- `compile`: the other arguments the factory passes to torch.compile (`compile`: fullgraph,
  backend, Inductor options): a changed option is a different compile, verified again;
- `eager`: the outputs (and gradients when training) of one eager step on them, from the
  seed every phase uses: what the workload computes, whatever the source says (a C extension,
  a data file the factory reads, an environment variable it honours).

Every RNG a factory may draw from (torch's, Python's `random`, numpy's global one when numpy
is installed) is seeded the same way before the factory in every phase and in the identity
check (`phase.seed_all`), so a factory that draws its weights or batch from any of them builds
the same bits each time. One that still does not (it reads the clock, `os.urandom`, its own
unseeded generator) is found by the cold phase, which calls it twice: its reference records
`factory: "not deterministic"`, and later runs compare what can be compared instead of `state`
and `inputs`: `shapes` (the names, dtypes and shapes of both) and the eager outputs of the
rebuilt model on the recorded weights and inputs, within the dtype's tolerance.

The first four must be equal. Eager outputs match when bitwise equal or, where they are not,
close within the dtype's tolerance: an eager reduction's last bits can differ between two
processes (nondeterministic GPU kernels; a first call under load on some CPUs), while an edit
that matters moves them further or shows in the source. The graph torch traces is compared
after the hot phase (`ci_fxcache.verify.identity.graph_changed`).

The cold phase records the identity of its warm-up step (no extra work: that step is its eager
reference); the `identity` request computes it for a workload now, in a fresh process like a
phase's, and says which recorded reference, if any, it matches.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import site
import sys
import sysconfig
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from . import workloads
from .accuracy import compare

EXACT = ("source", "libraries", "state", "inputs", "compile")
# What is compared of a factory that builds different bits from the same seeds.
LOOSE = ("source", "libraries", "shapes", "compile")
# `factory` of an identity whose cold phase built different bits twice from the same seeds.
NOT_DETERMINISTIC = "not deterministic"
# What each exact part's change means, in the words of the report's line.
CHANGED = {
    "source": "its source changed",
    "libraries": "a library it imports changed version",
    "state": "its initial weights changed",
    "inputs": "its inputs changed",
    "compile": "its torch.compile options changed",
    "shapes": "the names, dtypes or shapes of its weights or inputs changed",
}
# At most this many libraries are named in one line ("and N more").
NAMED_LIBRARIES = 4
_WORKER = Path(__file__).resolve().parent


class Modules:
    """The modules a workload imports: those that appear after `start()` in this process."""

    def __init__(self) -> None:
        self.before = set(sys.modules)

    def imported(self) -> list[tuple[str, Any]]:
        return sorted((n, m) for n, m in list(sys.modules.items()) if n not in self.before)


@cache
def _installed_roots() -> tuple[str, ...]:
    """Where the interpreter's standard library and installed distributions live."""
    paths = set(site.getsitepackages()) | {site.getusersitepackages()}
    paths |= {p for k, p in sysconfig.get_paths().items() if "lib" in k or "include" in k}
    return tuple(sorted({os.path.realpath(p) + os.sep for p in paths if p}))


def _module_file(module: Any) -> str | None:
    path = getattr(module, "__file__", None)
    if not isinstance(path, str) or not os.path.isfile(path):
        return None
    return os.path.realpath(path)


def _own(path: str) -> bool:
    """Whether a module file is the workload's own code (not installed, not fxcache's worker)."""
    return not path.startswith(_installed_roots()) and not path.startswith(str(_WORKER) + os.sep)


def own_modules(workload: str, imported: list[tuple[str, Any]]) -> list[tuple[str, Any, str]]:
    """The workload's own modules among `imported` (name, module, file), in name order: those
    whose file lies outside the interpreter's installation and fxcache's worker, and
    fxcache's `workloads.py` for a built-in workload."""
    found = [(n, m, f) for n, m in imported if (f := _module_file(m)) is not None and _own(f)]
    if workload in workloads.BUILTINS:
        found.append((workloads.__name__, workloads, os.path.realpath(workloads.__file__)))
    return sorted(found, key=lambda item: item[0])


def source_digest(own: list[tuple[str, Any, str]]) -> str:
    """sha256 over the names and bytes of the workload's own modules (`own_modules`)."""
    digest = hashlib.sha256()
    for name, _, path in own:
        digest.update(f"{name}\0{os.path.getsize(path)}\0".encode())
        with open(path, "rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


@cache
def _distributions() -> dict[str, list[str]]:
    return dict(importlib.metadata.packages_distributions())


def _referenced(module: Any) -> set[str]:
    """The top-level packages a module's globals come from (`import transformers`, `from
    transformers import AutoModel`)."""
    tops = set()
    for value in list(vars(module).values()):
        try:
            name = value.__name__ if isinstance(value, ModuleType) else value.__module__
        except Exception:  # an object whose attribute access raises, or has none
            continue
        if isinstance(name, str) and name:
            tops.add(name.partition(".")[0])
    return tops


def library_versions(workload: str, own: list[tuple[str, Any, str]]) -> list[str]:
    """`name==version` of the installed distributions the workload's own modules use (their
    globals' packages), and of the workload's own package where it is installed, sorted.
    Read from the code, not from what happens to be imported in the process: a phase imports
    more (its mechanism's setup) than the identity check."""
    tops = {workload.partition(":")[0].partition(".")[0]}
    for _, module, _ in own:
        tops |= _referenced(module)
    pairs: set[str] = set()
    for top in tops:
        for dist in _distributions().get(top, []):
            try:
                pairs.add(f"{dist}=={importlib.metadata.version(dist)}")
            except importlib.metadata.PackageNotFoundError:
                continue
    return sorted(pairs)


def libraries_digest(pairs: list[str]) -> str:
    """sha256 over the sorted `name==version` lines (`library_versions`)."""
    return hashlib.sha256("\n".join(sorted(pairs)).encode()).hexdigest()


def tensors_digest(named: list[tuple[str, Any]]) -> str:
    """sha256 over each item's name, and a tensor's dtype, shape and bits (anything else: its
    type and repr, as a factory may pass a flag or a size beside its tensors)."""
    digest = hashlib.sha256()
    for name, value in named:
        digest.update(f"{name}\0".encode())
        if isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous()
            digest.update(f"{t.dtype}{list(t.shape)}\0".encode())
            digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            digest.update(f"{type(value).__name__}:{value!r}\0".encode())
    return digest.hexdigest()


def shapes_digest(named: list[tuple[str, Any]]) -> str:
    """sha256 over each item's name, and a tensor's dtype and shape (not its bits; anything
    else: its type): what a factory that is not deterministic still builds the same."""
    digest = hashlib.sha256()
    for name, value in named:
        if isinstance(value, torch.Tensor):
            digest.update(f"{name}\0{value.dtype}{list(value.shape)}\0".encode())
        else:
            digest.update(f"{name}\0{type(value).__name__}\0".encode())
    return digest.hexdigest()


def _named_inputs(inputs: tuple[Any, ...], second: tuple[Any, ...] | None) -> list[tuple[str, Any]]:
    return [(f"input {i}", t) for i, t in enumerate(inputs)] + [
        (f"second input {i}", t) for i, t in enumerate(second or ())
    ]


def built(
    state: dict[str, Any] | None, inputs: tuple[Any, ...], second: tuple[Any, ...] | None
) -> dict[str, str]:
    """The parts of the identity the factory's call decides (`state`, `inputs`, `shapes`)."""
    named_state = sorted((state or {}).items())
    named_inputs = _named_inputs(inputs, second)
    return {
        "state": tensors_digest(named_state),
        "inputs": tensors_digest(named_inputs),
        "shapes": shapes_digest(named_state + named_inputs),
    }


def of(
    workload: str,
    modules: Modules,
    state: dict[str, Any] | None,
    inputs: tuple[Any, ...],
    second: tuple[Any, ...] | None,
    eager: list[torch.Tensor],
    compile_options: dict[str, Any] | None = None,
) -> dict[str, str]:
    """The identity of a workload built and stepped since `modules` was started."""
    own = own_modules(workload, modules.imported())
    pairs = library_versions(workload, own)
    return {
        "source": source_digest(own),
        "libraries": libraries_digest(pairs),
        "library_versions": "\n".join(pairs),
        **built(state, inputs, second),
        "eager": tensors_digest([(f"tensor {i}", t) for i, t in enumerate(eager)]),
        "compile": compile_digest(compile_options or {}),
    }


def compile_digest(options: dict[str, Any]) -> str:
    """The factory's torch.compile arguments (plain values, checked by workloads.build)."""
    return hashlib.sha256(json.dumps(options, sort_keys=True).encode()).hexdigest()


def deterministic(recorded: dict[str, Any]) -> bool:
    """Whether the cold phase that recorded `recorded` found its factory deterministic (an
    identity recorded before fxcache checked says nothing: taken as deterministic)."""
    return recorded.get("factory") != NOT_DETERMINISTIC


def exact_change(recorded: Any, current: dict[str, str]) -> str | None:
    """What changed among the parts compared exactly (`EXACT`; `LOOSE` for a factory that is
    not deterministic), in a few words; None when nothing did."""
    if isinstance(recorded, dict) and "compile" not in recorded:
        # recorded before factories could name compile options: it compiled with none
        recorded = {**recorded, "compile": compile_digest({})}
    if not isinstance(recorded, dict) or not all(isinstance(recorded.get(k), str) for k in EXACT):
        return "the reference records no workload identity (recorded by an older fxcache)"
    parts = EXACT if deterministic(recorded) else LOOSE
    changed = [
        _said(k, recorded, current)
        for k in parts
        if k in current and recorded.get(k, current[k]) != current[k]
    ]
    return ", ".join(changed) or None


def _said(part: str, recorded: dict[str, Any], current: dict[str, str]) -> str:
    """What a changed part means; a library change names the libraries, with both versions."""
    text = CHANGED[part]
    if part == "libraries":
        moved = version_changes(recorded.get("library_versions"), current.get("library_versions"))
        if moved:
            text = f"{text} ({moved})"
    return text


def _versions(lines: Any) -> dict[str, str] | None:
    if not isinstance(lines, str):
        return None
    pairs = (line.partition("==") for line in lines.splitlines() if "==" in line)
    return {name: version for name, _, version in pairs}


def version_changes(recorded: Any, current: Any) -> str:
    """The libraries whose version differs, with both ("einops 0.7.0 -> 0.8.0", "einops
    (none) -> 0.8.0" for one newly used); empty when either side kept no versions (an identity
    recorded by an older fxcache holds only the hash)."""
    before, after = _versions(recorded), _versions(current)
    if before is None or after is None:
        return ""
    names = sorted(n for n in before.keys() | after.keys() if before.get(n) != after.get(n))
    said = [f"{n} {before.get(n, '(none)')} -> {after.get(n, '(none)')}" for n in names]
    if len(said) > NAMED_LIBRARIES:
        said = [*said[:NAMED_LIBRARIES], f"and {len(said) - NAMED_LIBRARIES} more"]
    return ", ".join(said)


def eager_change(
    recorded_eager: Any, eager_runs: list[list[torch.Tensor]], tol: dict[str, float]
) -> str | None:
    """None when one of this process's eager steps is bitwise equal to the recorded one, or
    close within the dtype tolerance (see the module's docstring); else what changed."""
    if not isinstance(recorded_eager, list):
        return "its eager outputs changed (the reference holds none to compare with)"
    worst: Any = None
    for run in eager_runs:
        check = compare(run, recorded_eager, tol)
        if check["bitwise"] or check["close"]:
            return None
        worst = check["max_abs_err"]
    return f"its eager outputs changed (max abs err {worst})"


def build_error(exc: Exception) -> str:
    """The reason an identity could not be computed (the cold phase will show the same)."""
    if isinstance(exc, workloads.WorkloadError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"[:300]
