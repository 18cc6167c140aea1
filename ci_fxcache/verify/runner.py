"""Run the matrix: plan skips, schedule cold/hot phases on the fork server, judge each combo."""

from __future__ import annotations

import json
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from ci_fxcache import mechanisms, timestamps
from ci_fxcache.env import cpus, gpus, torch_support
from ci_fxcache.store.manifest import holds_committed_files
from ci_fxcache.store.remote import redis_cache
from ci_fxcache.verify import causes, ranks, recheck, verdicts, versions, workload_check
from ci_fxcache.verify.forkserver import ForkServer
from ci_fxcache.verify.matrix import Combo, Matrix

COMPILE_THREADS = "TORCHINDUCTOR_COMPILE_THREADS"


@dataclass(kw_only=True)
class Settings:
    """How to run: the results document's `settings`, plus where and how wide."""

    cache_dir: Path  # each combination's caches and reference, under <combo id>/
    run_dir: Path  # this run's scratch: phase logs, raw results, empty hot caches
    phase: str = "both"
    min_speedup: float | None = None  # a time floor only where the user sets one
    compare: str = "bitwise"
    fail_on: str = "unsafe"
    timeout: float = 600.0
    jobs: int | None = None
    redis_url: str | None = None
    share_cold: bool = True
    recheck_all: bool = False
    deterministic: bool = False
    scope_key: str | None = None  # the environment's (recheck.context), not in `to_dict`

    def to_dict(self) -> dict[str, Any]:
        """As the results document's `settings`."""
        return {
            "phase": self.phase,
            "min_speedup": self.min_speedup,
            "compare": self.compare,
            "fail_on": self.fail_on,
            "timeout_s": self.timeout,
            "deterministic": self.deterministic,
        }


def redis_problem(url: str | None, has_module: bool, python: str) -> str | None:
    """Why the `remote` mechanism cannot run, or None. Connects with a bounded timeout."""
    if not url:
        return "Redis not configured (pass --redis-url or set FXCACHE_REDIS_URL)"
    redis_cache.check_url(url)
    problem = redis_cache.probe(url)
    if problem is not None:
        return f"Redis at {redis_cache.redact(url)} unreachable ({problem})"
    if not has_module:
        return f"the redis package is not installed for {python} (torch's remote cache needs it)"
    return None


def expand_devices(matrix: Matrix, info: dict[str, Any]) -> None:
    """Replace `auto` by every available device kind (ROCm builds report as cuda)."""
    devices: list[str] = []
    for device in matrix.devices:
        found = ["cpu"] + (["cuda"] if info.get("cuda_capabilities") else [])
        for d in found if device == "auto" else [device]:
            if d not in devices:
                devices.append(d)
    matrix.devices = devices


TRITON_MIN_CAPABILITY = (7, 0)
BF16_MIN_CAPABILITY = (8, 0)


class Skip(NamedTuple):
    """Why a combination cannot run here: the results' `cause` and a sentence."""

    cause: str
    reason: str


@dataclass(frozen=True)
class GpuSlot:
    """One device the parent sees: the value a phase's visible-devices variable gets (an index,
    UUID or MIG id, as the job was given it), and what torch reported for it."""

    visible: str
    name: str
    capability: tuple[int, int]

    def describe(self) -> dict[str, Any]:
        """As the phase evidence records it."""
        return {
            "visible": self.visible,
            "name": self.name,
            "capability": ".".join(map(str, self.capability)),
        }


def gpu_slots(info: dict[str, Any], env: Mapping[str, str]) -> tuple[str, list[GpuSlot]]:
    """The variable that hands a phase its device, and the devices the fork server sees."""
    caps = [tuple(c) for c in info.get("cuda_capabilities") or []]
    names = info.get("cuda_names") or [""] * len(caps)
    variable, values = gpus.phase_slots(env, len(caps), bool(info.get("hip")))
    return variable, [
        GpuSlot(value, str(name), (int(cap[0]), int(cap[1])))
        for value, name, cap in zip(values, names, caps, strict=False)
    ]


def gpu_requirement(combo: Combo, hip: bool) -> tuple[tuple[int, int], str] | None:
    """The compute capability a CUDA combination needs, and why (None: any device will do).

    Triton (and so Inductor on a GPU) needs 7.0: torch raises GPUTooOldForTriton below it
    (torch/_inductor/scheduler.py, create_backend); bfloat16 needs 8.0. ROCm reports gfx
    versions as capabilities, which these NVIDIA limits do not apply to."""
    if combo.device != "cuda" or hip:
        return None
    if combo.dtype.startswith("bfloat16"):
        return BF16_MIN_CAPABILITY, "bfloat16 needs compute capability 8.0+"
    return TRITON_MIN_CAPABILITY, "Triton needs compute capability 7.0+ (GPUTooOldForTriton)"


def skip_reason(combo: Combo, info: dict[str, Any], redis: str | None) -> Skip | None:
    """Why a combination cannot run on this runner, or None."""
    caps = [tuple(c) for c in info.get("cuda_capabilities") or []]
    if combo.device == "cuda":
        if not caps:
            return Skip("no-device", "no CUDA device")
        need = gpu_requirement(combo, bool(info.get("hip")))
        if need is not None and all(cap < need[0] for cap in caps):
            seen = ", ".join(sorted({".".join(map(str, c)) for c in caps}))
            return Skip("gpu-too-old", f"{need[1]}; visible GPUs have {seen}")
    if mechanisms.get(combo.mechanism).redis and redis:
        return Skip("unsupported", redis)
    found = ranks.skip(combo, info)
    if found:
        return Skip(*found)
    return mode_skip(combo)


def mode_skip(combo: Combo) -> Skip | None:
    """Why a compile mode cannot do what it names here, or None (docs/verify.md "Modes")."""
    if combo.mode == "default":
        return None
    if mechanisms.get(combo.mechanism).hits == "artifact":
        return Skip(
            "unsupported",
            f"{combo.mechanism} saves and loads its artifact from torch.compile's default mode "
            f"only; {combo.mode} is verified with the cache mechanisms",
        )
    if combo.mode == "reduce-overhead" and combo.device != "cuda":
        # On the CPU torch skips the CUDA graphs (counter cudagraph_skips) and compiles what
        # the default mode compiles: a verdict would repeat the default mode's and name graphs
        # that never ran.
        return Skip(
            "unsupported",
            "reduce-overhead captures CUDA graphs, which need a CUDA device: on the "
            f"{combo.device} torch skips them and compiles what the default mode compiles "
            "(verify the default mode here, reduce-overhead on a GPU runner)",
        )
    return None


REFERENCE = versions.REFERENCE
# C++ libraries built in this run, shared by its phases (worker/phase.py BuildMemo): a phase
# whose build another phase already ran copies the library (fxgraph's phases only keep theirs).
# Like the shared cold phase, it changes no phase's evidence but its timing; --separate-cold
# turns both off.
BUILD_MEMO = "builds"


def shared_cold() -> tuple[str, ...]:
    """The mechanisms whose cold phases are the same compile work (their records'
    `shares_cold`), in the registry's order: the first runs the shared cold phase (fxgraph's
    hot phase reads the cold phase's own directory)."""
    return tuple(m.name for m in mechanisms.ALL if m.shares_cold)


class ColdRecord(NamedTuple):
    """A cold phase: its evidence, the worker's result, its cache tag, the device it ran on."""

    phase: dict[str, Any]
    result: dict[str, Any]
    tag: str
    gpu: GpuSlot | None


def cold_groups(combos: list[Combo], share: bool) -> list[list[Combo]]:
    """The combinations grouped by the cold phase that serves them, in matrix order.

    With `share`, the `shared_cold()` mechanisms of one workload / device / dtype / dynamic /
    training are served by one cold phase (the group's first combination runs it); every
    other combination has a cold phase of its own."""
    groups: list[list[Combo]] = []
    shared: dict[tuple[Any, ...], list[Combo]] = {}
    sharing = shared_cold()
    for combo in combos:
        if not share or combo.mechanism not in sharing or not ranks.shares_cold(combo):
            groups.append([combo])
            continue
        key = (combo.workload, combo.device, combo.dtype, combo.dynamic, combo.training,
               combo.mode)  # fmt: skip
        if key not in shared:
            shared[key] = []
            groups.append(shared[key])
        shared[key].append(combo)
    for group in shared.values():
        group.sort(key=lambda c: sharing.index(c.mechanism))
    return groups


def shared_first(groups: list[list[Combo]]) -> list[list[Combo]]:
    """The shared cold phases first (in matrix order), then the others: a phase that starts
    after a shared one finds the kernels it would build in the run's build memo (precompile's
    cold phase compiles the same kernels as fxgraph's)."""
    return sorted(groups, key=lambda group: len(group) == 1)


class Cancelled(Exception):
    """The run was interrupted: a phase that ends now is not judged (see `Runner.cancel`)."""


class Runner:
    """Runs one matrix on one fork server."""

    def __init__(
        self,
        server: ForkServer,
        settings: Settings,
        progress: Callable[[dict[str, Any]], None],
    ) -> None:
        self.server = server
        self.settings = settings
        self.progress = progress
        self._visible_variable, self._gpus = gpu_slots(server.info, os.environ)
        self.compile_threads = 1  # until run() knows how many phases run at once
        self._free_gpus = list(self._gpus)
        self.torch_version = str(server.info.get("torch") or "")
        self._gpu_lock = threading.Condition()
        # Combinations judged outside `cache_dir / id`, by id: the recorded version their
        # workload matches, a new version (`versions`), or this run's scratch (see `_cold`).
        self._dirs: dict[str, Path] = {}
        # Combinations whose workload changed since their newest reference: why, by id; those
        # whose identity check itself failed (it cannot tell) are also `unchecked`.
        self.changed: dict[str, str] = {}
        self.unchecked: set[str] = set()
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        """Stop now (the run was interrupted): every running phase is killed, none starts, and
        no phase that ends from here on is judged, recorded or reported."""
        self._cancelled.set()
        self.server.stop()

    def combo_dir(self, combo: Combo) -> Path:
        """Where `combo`'s caches and reference live in this run."""
        return self._dirs.get(combo.id) or self.settings.cache_dir / combo.id

    def check_workloads(self, matrix: Matrix) -> None:
        """Import each user workload and call its factory once: exit 2 on a bad one."""
        workload_check.check(
            self.server,
            workload_check.user_workloads(matrix),
            matrix.devices[0] if matrix.devices else "cpu",
            self.settings.run_dir / ".checks",
            self.settings.timeout,
            self._child_env(),
        )

    def _phase(
        self, combo: Combo, name: str, spec: dict[str, Any], like: GpuSlot | None = None
    ) -> tuple[dict[str, Any], dict[str, Any], GpuSlot | None]:
        """Run one phase; a CUDA phase gets one device (for hot: the one like cold's)."""
        if self._cancelled.is_set():
            raise Cancelled
        env = self._child_env()
        if combo.device == "cpu":
            # The pool compiles Triton kernels only; this stops the early warm-up that torch's
            # registered `inductor` backend does (torch/_dynamo/backends/inductor.py).
            env["TORCH_WARM_POOL"] = "0"
        if combo.ranks > 1:
            phase, result, slot = ranks.run_phase(self, combo, name, spec, env)
            if self._cancelled.is_set():
                raise Cancelled
            return phase, result, slot
        slot = None
        if combo.device == "cuda" and self._gpus:
            slot = self._take_gpu(combo, like)
            env[self._visible_variable] = slot.visible
        try:
            outcome = self.server.run(
                "phase", spec, self.settings.run_dir / combo.id, name, self.settings.timeout, env
            )
        finally:
            if slot is not None:
                self._give_gpu(slot)
        if self._cancelled.is_set():
            raise Cancelled  # killed by `cancel`: not a crash of the phase
        phase = verdicts.evidence(outcome, self.settings.timeout)
        if slot is not None:
            phase["gpu"] = slot.describe()
        return phase, outcome.result or {}, slot

    def _child_env(self) -> dict[str, str]:
        """Environment every child gets: Inductor's compile threads, unless the user set them."""
        if COMPILE_THREADS in os.environ:
            return {}
        return {COMPILE_THREADS: str(self.compile_threads)}

    def _take_gpu(self, combo: Combo, like: GpuSlot | None) -> GpuSlot:
        """A free device that can run `combo`; for a hot phase, the device that ran cold or one
        of the same model and capability (torch's cache key holds the GPU name)."""
        need = gpu_requirement(combo, bool(self.server.info.get("hip")))

        def capable(slot: GpuSlot) -> bool:
            return need is None or slot.capability >= need[0]

        def same(slot: GpuSlot) -> bool:
            return like is not None and (slot.name, slot.capability) == (
                like.name,
                like.capability,
            )

        fits = same if any(same(s) for s in self._gpus) else capable
        if not any(fits(s) for s in self._gpus):
            raise RuntimeError(f"no visible GPU can run {combo.id}")  # skip_reason prevents it
        with self._gpu_lock:
            while True:
                if like is not None and like in self._free_gpus:
                    self._free_gpus.remove(like)
                    return like
                for slot in self._free_gpus:
                    if fits(slot):
                        self._free_gpus.remove(slot)
                        return slot
                self._gpu_lock.wait()

    @property
    def visible_variable(self) -> str:
        """The variable that hands a phase its device."""
        return self._visible_variable

    def take_gpus(self, combo: Combo) -> list[GpuSlot]:
        """`combo.ranks` devices at once, one per rank, all taken together (never some held
        while waiting for the rest, which could deadlock two phases)."""
        need = gpu_requirement(combo, bool(self.server.info.get("hip")))
        if sum(need is None or s.capability >= need[0] for s in self._gpus) < combo.ranks:
            raise RuntimeError(f"fewer visible GPUs than ranks can run {combo.id}")
        with self._gpu_lock:
            while True:
                fits = [s for s in self._free_gpus if need is None or s.capability >= need[0]]
                if len(fits) >= combo.ranks:
                    for slot in fits[: combo.ranks]:
                        self._free_gpus.remove(slot)
                    return fits[: combo.ranks]
                self._gpu_lock.wait()

    def give_gpu(self, slot: GpuSlot) -> None:
        """Hand a device back."""
        self._give_gpu(slot)

    def _give_gpu(self, slot: GpuSlot) -> None:
        with self._gpu_lock:
            self._free_gpus.append(slot)
            self._gpu_lock.notify_all()

    def spec(
        self, combo: Combo, phase: str, tag: str, serves: tuple[Combo, ...] = ()
    ) -> dict[str, Any]:
        """The worker's phase spec.

        Hot phases of artifact / remote mechanisms get an empty dir in this run's scratch: what
        a run writes besides the cold phase's genuine cache and reference never goes into
        `cache_dir`, whose files a store may have committed. A cold phase also writes the
        mega-cache artifacts (`mega.bin`) into the directory of each combination it serves
        (`combo` itself and `serves`) that loads them hot."""
        combo_dir = self.combo_dir(combo)
        base = combo_dir
        in_place = mechanisms.get(combo.mechanism).hot_in_place
        if phase == "hot" and not in_place:
            base = self.settings.run_dir / combo.id / "hot"
            shutil.rmtree(base, ignore_errors=True)
        blob = mechanisms.CACHE_ARTIFACTS
        artifacts = [
            str(self.combo_dir(c) / blob)
            for c in (combo, *serves)
            if phase == "cold" and blob in mechanisms.get(c.mechanism).files
        ]
        return {
            "phase": phase,
            "combo": combo.to_dict(),
            "dir": str(combo_dir),
            "inductor_dir": str(base / "inductor"),
            "triton_dir": str(base / "triton"),
            "eager": phase == "cold",
            "redis_url": self.settings.redis_url,
            "cache_tag": tag,
            "artifacts": artifacts,
            "deterministic": self.settings.deterministic,
            "build_memo": str(self.settings.run_dir / BUILD_MEMO)
            if self.settings.share_cold
            else None,
            # the phases of a mechanism whose hot phase reads the cold directory in place
            # (fxgraph; the shared cold phase among them) build everything themselves: their
            # times are the speedups users read
            "build_memo_serves": not in_place,
        }

    def match_versions(self, combos: list[Combo], jobs: int) -> set[str]:
        """Which of `combos` a recorded reference still judges: for each combination with
        one, the worker computes the workload's identity now (one process per workload,
        device, dtype and training mode) and picks the newest version it matches. Returns the
        ids of those that match (their directory becomes that version's); each other one is
        `changed` (why) and gets a fresh directory for its new reference (`versions.fresh`)."""
        recorded = {c.id: versions.recorded(self.settings.cache_dir / c.id) for c in combos}
        groups: dict[tuple[Any, ...], list[Combo]] = {}
        for c in combos:
            if recorded[c.id]:
                groups.setdefault((c.workload, c.device, c.dtype, c.training), []).append(c)
        matched: set[str] = set()
        pool = ThreadPoolExecutor(max_workers=max(1, jobs))
        try:
            answers = list(pool.map(lambda g: self._identify(g, recorded), groups.values()))
        except BaseException:  # an interrupt: as in `run_groups`
            self.cancel()
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
        for group, answer in zip(groups.values(), answers, strict=True):
            for c in group:
                found = answer.get(c.id) or {}
                index = found.get("match")
                if isinstance(index, int) and 0 <= index < len(recorded[c.id]):
                    self._dirs[c.id] = recorded[c.id][index]
                    matched.add(c.id)
                    continue
                self.changed[c.id] = str(found.get("why") or "no answer")
                if found.get("unchecked") or not found.get("why"):
                    self.unchecked.add(c.id)
                self._dirs[c.id] = versions.fresh(self.settings.cache_dir / c.id)
        return matched

    def _identify(
        self, group: list[Combo], recorded: dict[str, list[Path]]
    ) -> dict[str, dict[str, Any]]:
        """One `identity` request for combinations of one workload, device, dtype and training
        mode: by combination id, the index of the version it matches, or why none."""
        first = group[0]
        spec = {
            "workload": first.workload,
            "device": first.device,
            "dtype": first.dtype,
            "training": first.training,
            "deterministic": self.settings.deterministic,
            "variants": [
                {
                    "key": c.id,
                    "dynamic": c.dynamic,
                    "mechanism": c.mechanism,
                    "candidates": [
                        {"dir": str(d), "identity": versions.identity(d)} for d in recorded[c.id]
                    ],
                }
                for c in group
            ],
        }
        name = f"identity-{first.device}-{first.dtype}-{'train' if first.training else 'infer'}"
        work = self.settings.run_dir / ".identity" / first.id
        env = self._child_env()
        slot = self._take_gpu(first, None) if first.device == "cuda" and self._gpus else None
        if slot is not None:
            env[self._visible_variable] = slot.visible
        try:
            outcome = self.server.run("identity", spec, work, name, self.settings.timeout, env)
        finally:
            if slot is not None:
                self._give_gpu(slot)
        answers = (outcome.result or {}).get("variants")
        if isinstance(answers, dict):
            return answers
        tail = outcome.log_tail.splitlines()[-1:] if outcome.log_tail else []
        why = "the identity check " + (
            f"timed out after {self.settings.timeout:g} s"
            if outcome.timed_out
            else f"ended with {outcome.signal or outcome.returncode}"
        )
        why = ": ".join([why, *tail])[:300]
        return {c.id: {"match": None, "why": why, "unchecked": True} for c in group}

    def run_combo(self, combo: Combo, hot_only: bool) -> dict[str, Any]:
        """Cold (unless hot-only) then hot, and the verdict; a hot-only run carries what
        `recheck.carried` allows (unless --recheck-all)."""
        if hot_only and combo.id in self.changed:
            return self._result(
                combo,
                verdicts.not_judged(
                    "not-run",
                    versions.changed_text(self.changed[combo.id], combo.id in self.unchecked)
                    + ": run --phase auto (or both) to verify it cold and hot again",
                ),
            )
        if hot_only:
            carried = None
            if not self.settings.recheck_all:
                carried = recheck.carried(
                    self.combo_dir(combo),
                    combo.mechanism,
                    self.settings.to_dict(),
                    self.torch_version,
                    recheck.context(self.settings.scope_key),
                )
            if carried is not None:
                return self._result(combo, carried)
            recorded = self._recorded(combo)
            if recorded is None:
                return self._result(
                    combo,
                    verdicts.not_judged(
                        "not-run",
                        f"no reference recorded in {self.combo_dir(combo)}: run "
                        "--phase cold (or both) first",
                    ),
                )
            return self._hot_and_judge(combo, recorded, cold_ran=False)
        return self._hot_and_judge(combo, self._cold(combo, ()), cold_ran=True)

    def run_group(
        self,
        group: list[Combo],
        hot_only: bool,
        submit: Callable[..., Future[dict[str, Any]]],
    ) -> tuple[dict[str, Any], list[tuple[Combo, Future[dict[str, Any]]]]]:
        """One cold phase for every combination of `group` (see `cold_groups`), then the hot
        phase of each in a fresh process: the first's here, the others' through `submit`
        (never waited on here, so a full pool cannot deadlock). Returns the first's result and
        the others' futures."""
        first, others = group[0], tuple(group[1:])
        if not others:
            return self.run_combo(first, hot_only), []
        cold = self._cold(first, others)
        for combo in others:
            self._copy_reference(first, combo, cold)
        pending = [(c, submit(self._hot_and_judge, c, cold, True)) for c in others]
        return self._hot_and_judge(first, cold, cold_ran=True), pending

    def _recorded(self, combo: Combo) -> ColdRecord | None:
        """The cold phase recorded for `combo` in its directory, or None."""
        try:
            recorded = json.loads((self.combo_dir(combo) / REFERENCE).read_text())
            return ColdRecord(
                recorded["cold"],
                recorded["cold_result"],
                recorded["cache_tag"],
                _recorded_gpu(recorded["cold"]),
            )
        except (OSError, json.JSONDecodeError, KeyError, TypeError):
            return None

    def _cold(self, combo: Combo, serves: tuple[Combo, ...]) -> ColdRecord:
        """Run the cold phase in `combo`'s fresh directory (also serving `serves`) and record
        its reference there when it succeeded.

        A combination directory that holds files a store committed is never emptied (the
        store's next save would find committed files gone and quarantine the whole scope):
        that combination compiles, and is judged, in a fresh directory of this run's scratch,
        and the store keeps the entries it committed."""
        for c in (combo, *serves):
            if holds_committed_files(self.combo_dir(c)):
                self._dirs[c.id] = self.settings.run_dir / c.id / "fresh"
            shutil.rmtree(self.combo_dir(c), ignore_errors=True)
            self.combo_dir(c).mkdir(parents=True)
        uses_redis = mechanisms.get(combo.mechanism).redis
        tag = f"fxcache-{uuid.uuid4().hex[:12]}" if uses_redis else ""
        cold, cold_result, cold_gpu = self._phase(
            combo, "cold", self.spec(combo, "cold", tag, serves)
        )
        if serves:
            cold["serves"] = [c.id for c in (combo, *serves)]
        record = ColdRecord(cold, cold_result, tag, cold_gpu)
        if cold["status"] == "ok":
            self._write_reference(combo, record)
        return record

    def _write_reference(self, combo: Combo, record: ColdRecord) -> None:
        (self.combo_dir(combo) / REFERENCE).write_text(
            json.dumps(
                {
                    "combo": combo.to_dict(),
                    "torch_version": record.result.get("torch_version"),
                    "cache_tag": record.tag,
                    "created_at": timestamps.utc_now(),
                    "cold": record.phase,
                    "cold_result": record.result,
                },
                indent=1,
            )
        )

    def _copy_reference(self, source: Combo, combo: Combo, record: ColdRecord) -> None:
        """Give `combo` the reference of the cold phase that ran in `source`'s directory (its
        mega-cache artifacts were written there by that phase)."""
        if record.phase["status"] != "ok":
            return
        shutil.copyfile(
            self.combo_dir(source) / "reference.pt",
            self.combo_dir(combo) / "reference.pt",
        )
        self._write_reference(combo, record)

    def _hot_and_judge(self, combo: Combo, recorded: ColdRecord, cold_ran: bool) -> dict[str, Any]:
        """The hot phase (unless --phase cold or the cold phase failed), and the verdict; a run
        that compiled cold records it for later hot-only runs (`recheck`)."""
        cold, cold_result = recorded.phase, recorded.result
        if self.settings.phase == "cold":
            hot: dict[str, Any] = verdicts.not_run("--phase cold: hot phase not requested")
            hot_result: dict[str, Any] = {}
        elif cold["status"] != "ok":
            hot, hot_result = verdicts.not_run("cold phase failed"), {}
        else:
            hot, hot_result, _ = self._phase(
                combo, "hot", self.spec(combo, "hot", recorded.tag), like=recorded.gpu
            )
        if (
            not cold_ran
            and combo.id not in self.changed
            and versions.graph_changed(cold_result, hot_result)
        ):
            self.changed[combo.id] = versions.GRAPH_WHY
            if self.settings.phase == "hot":
                return self.run_combo(combo, hot_only=True)
            self._dirs[combo.id] = versions.fresh(self.settings.cache_dir / combo.id)
            return self._hot_and_judge(combo, self._cold(combo, ()), cold_ran=True)
        judged = ranks.judge(  # verdicts.judge, per rank where there are several
            combo.to_dict(), cold, hot, cold_result, hot_result, self.settings.to_dict()
        )
        if cold_ran and combo.id in self.changed:
            why, unchecked = self.changed[combo.id], combo.id in self.unchecked
            text = versions.changed_note_text(why, unchecked)
            note = causes.note("workload-changed", text, why=why, unchecked=unchecked)
            judged["notes"] = [*judged["notes"], note]
        if cold_ran and cold_result.get("factory_deterministic") is False:
            # named by the run that recorded the reference, not by every run it judges
            note = causes.note("factory-nondeterministic", versions.FACTORY_TEXT)
            judged["notes"] = [*judged["notes"], note]
        # judge() calls a hot phase that never ran an error; here it was not asked for
        if self.settings.phase == "cold" and judged["cause"] == "not-run":
            judged.update(
                verdict="skipped",
                cause="unsupported",
                reason="cold phase only (--phase cold): reference recorded, hot not run",
            )
        elif cold_ran:
            recheck.record(
                self.combo_dir(combo),
                judged,
                self.settings.to_dict(),
                self.torch_version,
                recheck.context(self.settings.scope_key),
            )
        return self._result(combo, judged)

    def _result(self, combo: Combo, judged: dict[str, Any]) -> dict[str, Any]:
        result = {"id": combo.id, **combo.to_dict(), **judged}
        if not self._cancelled.is_set():
            self.progress(result)
        return result


def _recorded_gpu(cold: dict[str, Any]) -> GpuSlot | None:
    """The device a recorded cold phase ran on (None for CPU or an older reference)."""
    gpu = cold.get("gpu")
    if not isinstance(gpu, dict):
        return None
    try:
        major, minor = (int(p) for p in str(gpu["capability"]).split("."))
        return GpuSlot(str(gpu["visible"]), str(gpu["name"]), (major, minor))
    except (KeyError, ValueError):
        return None


def hot_only_ids(phase: str, cache_dir: Path, combos: list[Combo]) -> set[str]:
    """The combinations that run hot only: all with `--phase hot`; with `auto`, each one whose
    cold phase recorded a reference under `cache_dir` (decided per combination, so a
    combination added to the matrix, or one whose cold phase failed, is the only one that
    compiles cold again); none with `cold` or `both`."""
    if phase == "hot":
        return {c.id for c in combos}
    if phase == "auto":
        return {c.id for c in combos if has_reference(cache_dir, c)}
    return set()


def has_reference(cache_dir: Path, combo: Combo) -> bool:
    """Whether a cold phase recorded a reference for `combo` under `cache_dir` (in its
    directory or one of its versions)."""
    return bool(versions.recorded(cache_dir / combo.id))


def default_jobs(combos: list[Combo], info: dict[str, Any]) -> int:
    """Phases at once for one stage (`stages`): one per usable CPU for CPU combinations, one
    per GPU for CUDA ones."""
    if any(c.device == "cuda" for c in combos):
        return max(1, len(info.get("cuda_capabilities") or []))
    return max(1, cpus.usable_cpus())


def compile_threads(jobs: int) -> int:
    """Inductor compile threads per phase when `jobs` phases run at once (`cpus.compile_threads`:
    the usable CPUs shared, within Inductor's own `min(32, cpus)`).

    With one thread Inductor starts no pool at all (AsyncCompile.use_process_pool() is false)
    and compiles in the phase's own process. The setting cannot change a cache key:
    torch/_inductor/config.py lists `compile_threads` in `_cache_config_ignore_prefix`, which
    `save_config_portable()` (torch/utils/_config_module.py) leaves out of the config that
    FxGraphHashDetails hashes (torch/_inductor/codecache.py); checked in torch 2.13.0 and 2.14.1.
    """
    return cpus.compile_threads(jobs)


def stages(groups: list[list[Combo]]) -> list[list[list[Combo]]]:
    """The groups in the order they run, one stage after the other: CUDA first, then CPU.

    A phase of one stage never runs beside a phase of another, so a GPU phase is never timed
    while CPU phases load every core (its compile pool, its Python-side tracing and its kernel
    launches all run on the CPU). CUDA goes first: those are the results a GPU runner is there
    for, a job cut short by its own time limit still has them, and the CPU stage after it gets
    every core."""
    gpu = [g for g in groups if g[0].device == "cuda"]
    cpu = [g for g in groups if g[0].device != "cuda"]
    return [s for s in (gpu, cpu) if s]


def run(
    server: ForkServer,
    matrix: Matrix,
    settings: Settings,
    progress: Callable[[dict[str, Any]], None],
) -> tuple[list[dict[str, Any]], str]:
    """Run every combination; returns the combos (in matrix order) and the phase mode used
    (`auto` becomes `hot` when every combination ran hot only, else `both`). An interrupt
    while phases run kills them all before it propagates (`run_groups`)."""
    runner = Runner(server, settings, progress)
    expand_devices(matrix, server.info)
    runner.check_workloads(matrix)
    combos = matrix.combos()
    redis = (
        redis_problem(
            settings.redis_url,
            bool(server.info.get("redis_module")),
            server.info.get("python", "python"),
        )
        if any(mechanisms.get(m).redis for m in matrix.mechanisms)
        else None
    )
    torch_version = str(server.info.get("torch") or "")
    skips: dict[str, tuple[str, str]] = {}
    for c in combos:
        gate = torch_support.skip(torch_version, c.to_dict())
        found = (gate["cause"], gate["reason"]) if gate else skip_reason(c, server.info, redis)
        if found is not None:
            skips[c.id] = found
    runnable = [c for c in combos if c.id not in skips]
    hot = hot_only_ids(settings.phase, settings.cache_dir, runnable)
    if hot:
        jobs = settings.jobs or default_jobs([c for c in runnable if c.id in hot], server.info)
        matched = runner.match_versions([c for c in runnable if c.id in hot], jobs)
        if settings.phase == "auto":
            hot = matched
    phase = settings.phase
    if phase == "auto":
        phase = "hot" if runnable and len(hot) == len(runnable) else "both"
    results: dict[str, dict[str, Any]] = {}
    for c in combos:
        if c.id in skips:
            results[c.id] = runner._result(c, verdicts.not_judged(*skips[c.id]))
    cold = shared_first(cold_groups([c for c in runnable if c.id not in hot], settings.share_cold))
    groups = [[c] for c in runnable if c.id in hot] + cold
    for stage in stages(groups):
        combos_in_stage = [c for g in stage for c in g]
        jobs = settings.jobs or default_jobs(combos_in_stage, server.info)
        at_once = min(jobs, len(combos_in_stage))
        if combos_in_stage[0].device == "cuda":
            at_once = min(at_once, max(1, len(runner._gpus)))  # a phase holds its GPU
        runner.compile_threads = compile_threads(at_once)
        run_groups(runner, stage, hot, jobs, results)
    return [results[c.id] for c in combos], phase


def run_groups(
    runner: Runner,
    groups: list[list[Combo]],
    hot: set[str],
    jobs: int,
    results: dict[str, dict[str, Any]],
) -> None:
    """Run `groups` (hot only where their first id is in `hot`) on `jobs` threads into
    `results`. An exception while they run (an interrupt: errors.Interrupted) cancels the
    runner, killing every phase, before it propagates; not a `with` block, whose exit would
    wait for every running phase and start the queued ones."""
    pool = ThreadPoolExecutor(max_workers=jobs)
    try:
        started = [pool.submit(runner.run_group, g, g[0].id in hot, pool.submit) for g in groups]
        for group, fut in zip(groups, started, strict=True):
            first, others = fut.result()
            results[group[0].id] = first
            for combo, other in others:
                results[combo.id] = other.result()
    except BaseException:
        runner.cancel()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
