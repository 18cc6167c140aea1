"""Phases of several ranks (`--ranks N`, N > 1): start N fresh processes under
torch.distributed for one phase, and judge each rank against its own cold phase.

Each rank is one fork-server child (as every phase is), joined through a rendezvous file in
the run's scratch (torch's FileStore: no port is assumed free). Each rank keeps its reference
(and mega-cache blob) in `<combination>/rank<r>/`; the Inductor and Triton caches are those of
the layout: `shared` gives every rank the combination's one directory (a torchrun job on one
machine); `one-rank` has rank 0 alone write it in the cold phase (the others compile into this
run's scratch) and every rank load it hot, with torch 2.15's compile_on_one_rank on.

The verdict is the worst rank's, and its reason names the rank; `rank_verdicts` holds each
rank's. A rank that hangs ends at the phase timeout; the ranks waiting for it end earlier, at
the process group's own timeout (`GROUP_TIMEOUT_SHARE` of the phase's), so the rank that hung
is the one named.
"""

from __future__ import annotations

import copy
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ci_fxcache import mechanisms
from ci_fxcache.verify import verdict_kinds, verdicts, versions
from ci_fxcache.verify.matrix import Combo

if TYPE_CHECKING:
    from ci_fxcache.verify.runner import GpuSlot, Runner

# The process group's timeout as a share of the phase's: a rank left waiting for a peer ends
# with torch's own timeout error before the phase timeout kills the peer that hangs.
GROUP_TIMEOUT_SHARE = 0.5
# Among ranks with the same verdict, the cause that names the rank at fault first: a rank
# that crashed or hung leaves its peers failing in a collective (hot-error), not the reverse.
CAUSE_SEVERITY = ("crash", "timeout", "hot-mismatch", "recompile", "cold-error", "miss")
STATUS_SEVERITY = ("crash", "timeout", "error", "not-run", "ok")


def supported(layout: str) -> tuple[str, ...]:
    """The mechanisms several ranks can verify in `layout`: not the artifact ones (they save
    and load one process's compiled function, no collective runs through them); with
    `one-rank` only those whose hot phase reads the caches alone (the directory, Redis), which
    carry rank 0's compile to every rank."""
    return tuple(
        m.name
        for m in mechanisms.ALL
        if m.hits != "artifact" and (layout == "shared" or not m.files)
    )


def skip(combo: Combo, info: dict[str, Any]) -> tuple[str, str] | None:
    """Why `combo`'s ranks cannot run on this runner (cause, reason), or None."""
    if combo.ranks == 1:
        return None
    if not info.get("distributed", True):
        return "unsupported", "this torch has no torch.distributed"
    if combo.mechanism not in supported(combo.layout):
        allowed = ", ".join(supported(combo.layout))
        return "unsupported", (
            f"{combo.ranks} ranks ({combo.layout} layout) verify {allowed}; "
            f"{combo.mechanism} saves one process's compiled function"
        )
    if combo.layout == "one-rank" and not info.get("compile_on_one_rank"):
        return "torch-too-old", "compile on one rank needs torch 2.15 (compile_on_one_rank)"
    if combo.device == "cuda":
        devices = len(info.get("cuda_capabilities") or [])
        if devices < combo.ranks:
            return "no-device", (
                f"{combo.ranks} ranks need {combo.ranks} CUDA devices; this runner has {devices}"
            )
        if not info.get("nccl"):
            return "unsupported", "this torch has no NCCL backend for ranks on CUDA"
    elif not info.get("gloo", True):
        return "unsupported", "this torch has no gloo backend for ranks on the CPU"
    return None


def rank_dir(base: Path, rank: int) -> Path:
    """Where rank `rank` keeps its reference (and mega-cache blob) in a combination's `base`
    (rank 0's is where versions.has_reference looks)."""
    return base / (versions.FIRST_RANK if rank == 0 else f"rank{rank}")


def rank_spec(
    runner: Runner, combo: Combo, name: str, spec: dict[str, Any], rank: int, rendezvous: Path
) -> dict[str, Any]:
    """Rank `rank`'s copy of the phase spec `runner.spec` made for one process."""
    out = copy.deepcopy(spec)
    combo_dir = Path(spec["dir"])
    out["dir"] = str(rank_dir(combo_dir, rank))
    Path(out["dir"]).mkdir(parents=True, exist_ok=True)
    out["artifacts"] = [
        str(rank_dir(Path(a).parent, rank) / Path(a).name) for a in spec["artifacts"]
    ]
    for a in out["artifacts"]:
        Path(a).parent.mkdir(parents=True, exist_ok=True)
    if combo.layout == "one-rank" and name == "cold" and rank:
        scratch = runner.settings.run_dir / combo.id / f"cold-rank{rank}"
        out["inductor_dir"], out["triton_dir"] = str(scratch / "inductor"), str(scratch / "triton")
    out["dist"] = {
        "rank": rank,
        "world_size": combo.ranks,
        "backend": "nccl" if combo.device == "cuda" else "gloo",
        "init_method": rendezvous.as_uri(),
        "timeout_s": max(1.0, runner.settings.timeout * GROUP_TIMEOUT_SHARE),
        "one_rank": combo.layout == "one-rank",
    }
    return out


def run_phase(
    runner: Runner,
    combo: Combo,
    name: str,
    spec: dict[str, Any],
    env: dict[str, str],
) -> tuple[dict[str, Any], dict[str, Any], GpuSlot | None]:
    """Run phase `name` of `combo` on all its ranks at once; the merged evidence (`merge`)."""
    work = runner.settings.run_dir / combo.id
    work.mkdir(parents=True, exist_ok=True)
    rendezvous = work / f"{name}.rendezvous"
    rendezvous.unlink(missing_ok=True)
    slots = runner.take_gpus(combo) if combo.device == "cuda" else []
    envs = []
    for rank in range(combo.ranks):
        rank_env = dict(env)
        if slots:
            rank_env[runner.visible_variable] = slots[rank].visible
        envs.append(rank_env)
    specs = [rank_spec(runner, combo, name, spec, r, rendezvous) for r in range(combo.ranks)]
    timeout = runner.settings.timeout

    def one(rank: int) -> Any:
        return runner.server.run(
            "phase", specs[rank], work, f"{name}-rank{rank}", timeout, envs[rank]
        )

    try:
        with ThreadPoolExecutor(max_workers=combo.ranks) as pool:
            outcomes = list(pool.map(one, range(combo.ranks)))
    finally:
        for slot in slots:
            runner.give_gpu(slot)
        rendezvous.unlink(missing_ok=True)
    phases = [verdicts.evidence(o, timeout) for o in outcomes]
    for phase, slot in zip(phases, slots, strict=False):
        phase["gpu"] = slot.describe()
    phase, result = merge(phases, [o.result or {} for o in outcomes])
    return phase, result, slots[0] if slots else None


def merge(
    phases: list[dict[str, Any]], results: list[dict[str, Any]]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One phase object for several ranks: the worst rank's (rank 0's when all are ok), its
    status the worst status, its compile time the slowest rank's (what the job waits for),
    each rank's phase under `ranks`; the worker results likewise (rank 0's, each under
    `ranks`)."""
    worst = min(range(len(phases)), key=lambda r: _status_rank(phases[r]["status"]))
    merged = dict(phases[worst])
    times = [p["compile_s"] for p in phases if p.get("compile_s") is not None]
    if times and merged["status"] == "ok":
        merged["compile_s"] = max(times)
    merged["ranks"] = phases
    if merged["status"] != "ok":
        merged["error"] = f"rank {worst}: {merged.get('error') or merged['status']}"
    result = {**results[0], "ranks": results}
    return merged, result


def _status_rank(status: str) -> int:
    return STATUS_SEVERITY.index(status) if status in STATUS_SEVERITY else 2


def judge(
    combo: dict[str, Any],
    cold: dict[str, Any],
    hot: dict[str, Any],
    cold_result: dict[str, Any],
    hot_result: dict[str, Any],
    settings: dict[str, Any],
) -> dict[str, Any]:
    """`verdicts.judge` for one process; for several ranks, each rank judged against its own
    cold phase, and the worst rank's verdict naming the rank (`rank_verdicts`: each rank's)."""
    cold_ranks = cold.get("ranks")
    if int(combo.get("ranks") or 1) == 1 or not isinstance(cold_ranks, list):
        return verdicts.judge(combo, cold, hot, cold_result, hot_result, settings)
    count = len(cold_ranks)
    hot_ranks: list[dict[str, Any]] = hot.get("ranks") or [hot] * count  # one not run: all
    cold_results: list[dict[str, Any]] = cold_result.get("ranks") or [cold_result] * count
    hot_results: list[dict[str, Any]] = hot_result.get("ranks") or [hot_result] * count
    each = [
        verdicts.judge(
            combo, cold_ranks[r], hot_ranks[r], cold_results[r], hot_results[r], settings
        )
        for r in range(count)
    ]
    worst = min(range(count), key=lambda r: _severity(each[r]))
    judged = dict(each[worst])
    judged["cold"], judged["hot"] = cold, hot
    if all(j["verdict"] == judged["verdict"] and j["cause"] == judged["cause"] for j in each):
        judged["reason"] = f"all {count} ranks: {judged['reason']}"
    else:
        judged["reason"] = f"on rank {worst}: {judged['reason']}"
        disagree = _disagreement(each)
        if disagree:
            judged["reason"] += f" ({disagree})"
    judged["speedup"] = _slowest(each)
    judged["rank_verdicts"] = [
        {
            "rank": r,
            "verdict": j["verdict"],
            "cause": j["cause"],
            "reason": j["reason"],
            "hits": j["hits"],
            "misses": j["misses"],
            "speedup": j["speedup"],
        }
        for r, j in enumerate(each)
    ]
    return judged


def _severity(judged: dict[str, Any]) -> tuple[int, int]:
    # the verdict of several ranks is the worst any rank has (the registry's order)
    verdict = verdict_kinds.get(judged["verdict"]).order
    cause = judged["cause"]
    return verdict, CAUSE_SEVERITY.index(cause) if cause in CAUSE_SEVERITY else len(CAUSE_SEVERITY)


def _disagreement(each: list[dict[str, Any]]) -> str:
    """`ranks disagree: rank 0 hit, rank 1 missed` when some ranks hit and others missed."""
    hit = [r for r, j in enumerate(each) if j["hits"] and not j["misses"]]
    missed = [r for r, j in enumerate(each) if j["misses"]]
    if not hit or not missed:
        return ""
    return (
        "ranks disagree: "
        + ", ".join(f"rank {r} hit" for r in hit)
        + ", "
        + ", ".join(f"rank {r} missed" for r in missed)
    )


def _slowest(each: list[dict[str, Any]]) -> float | None:
    """The job waits for its slowest rank: the smallest speedup any rank had."""
    speedups = [j["speedup"] for j in each if j["speedup"] is not None]
    return min(speedups) if len(speedups) == len(each) else None


def shares_cold(combo: Combo) -> bool:
    """Whether `combo` may share a cold phase with other mechanisms (one process only: each
    rank's reference lives in its own directory)."""
    return combo.ranks == 1 and mechanisms.get(combo.mechanism).shares_cold
