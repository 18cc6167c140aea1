"""The verification mechanisms: one record each, the one place that names them.

A mechanism is how a combination's hot phase (a fresh process) gets what its cold phase
compiled. Everything that differs by mechanism reads its record here: the matrix (its
values, its defaults), the torch gate (`env/torch_support.py`), the runner (the shared cold
phase, the files a cold phase writes, Redis), the verdicts (which counters show a hit) and
the hot-only re-check (which verdicts are carried). Adding a mechanism is a record here plus
its torch calls in the worker (`worker/phase.py` TORCH, keyed by the same name: the worker
imports nothing of the orchestrator, so tests/test_mechanisms.py checks that both agree).
No import here: every layer may read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# The mega-cache blob a cold phase saves (torch.compiler.save_cache_artifacts()) and its hot
# phase loads first (load_cache_artifacts()); the worker spells it too (worker/phase.py).
CACHE_ARTIFACTS = "mega.bin"
# What every mechanism runs on: the FX graph and AOTAutograd caches (torch_support.OPTIONS).
_BASE = ("fx_graph_cache", "autograd_cache")


@dataclass(frozen=True, kw_only=True)
class Mechanism:
    """One verification mechanism."""

    name: str
    # The torch gate: the options (env/torch_support.py OPTIONS) it cannot run without.
    needs: tuple[str, ...]
    # What its cold phase writes into the combination's directory for the hot phase to load
    # (the artifact files; () where the hot phase reads the caches alone).
    files: tuple[str, ...] = ()
    # What shows the hot phase's hits: the FX graph / AOTAutograd cache counters, Dynamo's
    # cache counters (caching_precompile loads Dynamo's own output), or the artifact's load.
    hits: Literal["caches", "dynamo", "artifact"] = "caches"
    # Whether its hot phase reads (and a miss writes) the cold phase's directory in place; else
    # it starts from empty cache directories in the run's scratch.
    hot_in_place: bool = False
    # Whether its cold phase is the same compile work as the other sharing mechanisms' (one
    # cold phase serves them all; the first in ALL runs it).
    shares_cold: bool = False
    # Whether a hot-only run may carry its recorded verdict (verify/recheck.py): its hot phase
    # reads the same bytes every run (no in-place directory, no shared Redis).
    carried: bool = False
    # Whether it uses torch's Redis remote caches (needs --redis-url).
    redis: bool = False
    # Whether the default matrix runs it.
    default: bool = True


ALL: tuple[Mechanism, ...] = (
    Mechanism(name="fxgraph", needs=_BASE, hot_in_place=True, shares_cold=True),
    # Shares fxgraph's cold phase: both compile with the FX graph and AOTAutograd caches on
    # (caching_precompile off) into an empty directory; mega then only calls
    # torch.compiler.save_cache_artifacts(), which serializes what the compile recorded
    # (CacheArtifactManager.serialize) and changes neither the compile nor the directory.
    # precompile does not share it: caching_precompile bundles the AOTAutograd entries
    # (autograd_cache.should_bundle_autograd_cache) and drops ID_MATCH / DICT_VERSION guards
    # (torch/_dynamo/guards.py), so its cold compile is different work (checked in 2.13.0).
    Mechanism(
        name="mega",
        needs=(*_BASE, "cache_artifacts"),
        files=(CACHE_ARTIFACTS,),
        shares_cold=True,
        carried=True,
    ),
    Mechanism(
        name="precompile",
        needs=(*_BASE, "cache_artifacts", "caching_precompile", "precompile_artifacts"),
        files=(CACHE_ARTIFACTS,),
        hits="dynamo",
        carried=True,
    ),
    Mechanism(
        name="remote",
        needs=(*_BASE, "fx_graph_remote_cache", "remote_autograd_cache", "cache_key_tag"),
        redis=True,
        default=False,
    ),
    # The artifact mechanisms: torch's save/load APIs (worker/artifacts.py).
    Mechanism(
        name="aot",
        needs=(*_BASE, "aot_compile"),
        files=("aot.bin",),
        hits="artifact",
        carried=True,
    ),
    Mechanism(
        name="precompile-api",
        needs=(*_BASE, "precompile_api"),
        files=("precompile-api.py", "precompile-api.cache"),
        hits="artifact",
        carried=True,
    ),
)


def names() -> tuple[str, ...]:
    """Every mechanism's name, in the matrix's order."""
    return tuple(m.name for m in ALL)


def defaults() -> list[str]:
    """The mechanisms the default matrix runs."""
    return [m.name for m in ALL if m.default]


def find(name: str) -> Mechanism | None:
    """The record of `name`, or None (a name from an older results file, a typo)."""
    return next((m for m in ALL if m.name == name), None)


def get(name: str) -> Mechanism:
    """The record of `name` (checked by the matrix already); KeyError for an unknown one."""
    found = find(name)
    if found is None:
        raise KeyError(f"unknown mechanism {name!r}")
    return found
