"""`fxcache verify` end to end: real torch 2.13.0 compiles on CPU, real fresh processes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, TORCH2_VERSION, TORCH_PYTHON, RunFxcache, free_port
from tests.faults import tamper_generated_code

pytestmark = pytest.mark.slow

ENV = {"TORCHINDUCTOR_COMPILE_THREADS": "1"}
F32_STATIC = "sin_matmul-cpu-float32-static-fxgraph-train"


def verify(
    run_fxcache: RunFxcache,
    *args: str,
    env: dict[str, str] | None = None,
    python: str = TORCH_PYTHON,
) -> Any:
    return run_fxcache(
        "verify", "--python", python, *args, env={**ENV, **(env or {})}, timeout=900, cwd=ROOT
    )


def verify_one(
    run_fxcache: RunFxcache,
    cache_dir: Path,
    *extra: str,
    workload: str = "sin_matmul",
    dynamic: str = "false",
    training: str = "true",
    phase: str = "hot",
    env: dict[str, str] | None = None,
    python: str = TORCH_PYTHON,
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """One float32 fxgraph combination (hot by default) in `cache_dir`: the process and its
    results combo (empty when verify wrote no results)."""
    out = cache_dir / f"{phase}-{len(list(cache_dir.glob('*.json')))}.json"
    proc = verify(
        run_fxcache,
        *("--workloads", workload, "--dtypes", "float32", "--dynamic", dynamic),
        *("--mechanisms", "fxgraph", "--training", training, "--phase", phase),
        *("--cache-dir", str(cache_dir), "--json", str(out), *extra),
        env=env,
        python=python,
    )
    combos = load(out)["combos"] if out.exists() else [{}]
    assert len(combos) == 1, combos
    return proc, combos[0]


def load(path: Path) -> dict[str, Any]:
    doc = json.loads(path.read_text())
    from tests.test_results_schema import validate

    validate(doc)
    return doc


def _shared(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """A directory shared by every pytest-xdist worker of this session (or this process)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    return base / name


def _run_once(
    root: Path, *args: str, python: str = TORCH_PYTHON
) -> subprocess.CompletedProcess[str]:
    """Run `fxcache verify ARGS` once per session, whichever xdist worker asks first; the others
    wait on the lock and reuse its output (the cache dir is only ever copied by the tests)."""
    import fcntl

    from tests.conftest import run_fxcache as fixture

    with open(str(root) + ".lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # no timeout: the first run may compile for minutes
        done = root / "proc.json"
        if not done.exists():
            root.mkdir(parents=True, exist_ok=True)
            proc = verify(fixture.__wrapped__(), *args, python=python)  # type: ignore[attr-defined]
            done.write_text(json.dumps([proc.returncode, proc.stdout, proc.stderr]))
        code, stdout, stderr = json.loads(done.read_text())
    return subprocess.CompletedProcess([], code, stdout, stderr)


FxgraphRun = tuple[subprocess.CompletedProcess[str], dict[str, Any], Path, str]


def _fxgraph_run(tmp_path_factory: pytest.TempPathFactory, python: str) -> FxgraphRun:
    """One cold+hot matrix per torch, shared by several tests: sin_matmul fp32/bf16 x
    static/dynamic."""
    root = _shared(tmp_path_factory, "verify-fxgraph" + ("" if python == TORCH_PYTHON else "-2"))
    out = root / "results.json"
    proc = _run_once(
        root,
        "--dtypes",
        "float32,bfloat16",
        "--dynamic",
        "false,true",
        "--mechanisms",
        "fxgraph",
        "--training",
        "true",
        "--cache-dir",
        str(root / "cache"),
        "--json",
        str(out),
        python=python,
    )
    return proc, load(out) if out.exists() else {}, root / "cache", python


@pytest.fixture(scope="module")
def fxgraph_run(tmp_path_factory: pytest.TempPathFactory, torch_python: str) -> FxgraphRun:
    """The fxgraph matrix on each real torch (2.13.0 and 2.15.0)."""
    return _fxgraph_run(tmp_path_factory, torch_python)


@pytest.fixture(scope="module")
def fxgraph_run_main(tmp_path_factory: pytest.TempPathFactory) -> FxgraphRun:
    """The fxgraph matrix on the main torch (2.13.0) only."""
    return _fxgraph_run(tmp_path_factory, TORCH_PYTHON)


def test_fxgraph_float32_bfloat16_static_dynamic_are_safe(fxgraph_run: FxgraphRun) -> None:
    proc, doc, _, python = fxgraph_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    torch_version = "2.13.0" if python == TORCH_PYTHON else TORCH2_VERSION
    assert doc["fingerprint"]["torch_version"].split("+")[0] == torch_version
    assert len(doc["combos"]) == 4
    assert doc["summary"]["safe"] == 4, [c["reason"] for c in doc["combos"]]
    for combo in doc["combos"]:
        hot = combo["hot"]
        assert hot["counters"].get("fxgraph_cache_hit", 0) >= 1, combo["id"]
        assert hot["counters"].get("aot_autograd_cache_hit", 0) >= 1, combo["id"]
        assert combo["misses"] == 0 and combo["hits"] >= 2
        assert combo["cold"]["counters"].get("fxgraph_cache_miss", 0) >= 1
        assert combo["max_abs_err"]["hot_vs_cold"] == 0.0
        assert combo["speedup"] is not None  # information, not judged: it moves with the load
        if combo["dynamic"] == "true":
            assert hot["recompiles"] == 0
    # one progress line per combination, then the table
    assert sum(line.startswith("[") for line in proc.stdout.splitlines()) == 4
    assert doc["scope_key"].startswith("fxcache-v1-")


def test_no_phase_checks_the_cpus_vector_instructions_again(fxgraph_run: FxgraphRun) -> None:
    """Inductor checks which vector instruction sets the CPU and compiler build by compiling
    a probe into the cache dir and loading it in a child interpreter, in every process that
    compiles for the CPU (about 0.2 s of CPU a set, 3-6 sets). The fork server does it once,
    in a private dir, before its first CPU phase: no phase's cache holds a probe, though the
    phases compiled C++ there."""
    _, _, cache, python = fxgraph_run
    sources = list(cache.rglob("*.cpp"))
    probes = [p for p in sources if "__avx_chk_kernel" in p.read_text(errors="replace")]
    assert sources and not probes, (python, probes)


def test_phase_auto_is_hot_only_when_references_exist(
    fxgraph_run: FxgraphRun, run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    _, _, cache, python = fxgraph_run
    shutil.copytree(cache / F32_STATIC, tmp_path / F32_STATIC)
    proc, combo = verify_one(run_fxcache, tmp_path, phase="auto", python=python)
    assert proc.returncode == 0, proc.stderr
    assert load(next(tmp_path.glob("auto-*.json")))["settings"]["phase"] == "hot"
    assert combo["verdict"] == "safe", combo["reason"]
    # the cold evidence is the one recorded when the cache was built
    assert combo["cold"]["counters"].get("fxgraph_cache_miss", 0) >= 1


def test_tampered_generated_code_is_unsafe(
    fxgraph_run: FxgraphRun, run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    _, _, cache, python = fxgraph_run
    shutil.copytree(cache / F32_STATIC, tmp_path / F32_STATIC)
    assert tamper_generated_code(tmp_path / F32_STATIC / "inductor") >= 1
    proc, combo = verify_one(run_fxcache, tmp_path, python=python)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (combo["verdict"], combo["cause"]) == ("unsafe", "hot-mismatch")
    assert "hot outputs differ from the cold compile" in combo["reason"]
    assert combo["hits"] >= 1  # the counters said "hit": only the values give it away
    assert combo["max_abs_err"]["hot_vs_cold"] > 0.5
    assert "failed the --fail-on unsafe policy" in proc.stderr


def test_emptied_cache_is_no_gain(
    fxgraph_run_main: FxgraphRun, run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    _, _, cache, _ = fxgraph_run_main
    shutil.copytree(cache / F32_STATIC, tmp_path / F32_STATIC)
    shutil.rmtree(tmp_path / F32_STATIC / "inductor")
    proc, combo = verify_one(run_fxcache, tmp_path)
    assert proc.returncode == 0, proc.stderr  # --fail-on unsafe: no-gain does not fail
    assert (combo["verdict"], combo["cause"]) == ("no-gain", "miss")
    assert combo["reason"].startswith("hot load missed")
    assert combo["misses"] >= 1 and combo["hot"]["counters"]["fxgraph_cache_miss"] >= 1
    # the hot phase wrote what it compiled: empty the cache again for the exit-status check
    shutil.rmtree(tmp_path / F32_STATIC / "inductor")
    proc, _ = verify_one(run_fxcache, tmp_path, "--fail-on", "no-gain")
    assert proc.returncode == 1, proc.stderr


class CpuHogs:
    """Busy-loop processes, `count` of them, while the block runs: a loaded runner, for real."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> CpuHogs:
        code = "while True: pass"
        self.procs = [subprocess.Popen([TORCH_PYTHON, "-c", code]) for _ in range(self.count)]
        return self

    def cpu_ticks(self) -> list[int]:
        """User + system clock ticks each hog has used so far (from /proc)."""
        ticks = []
        for proc in self.procs:
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks.append(int(fields[11]) + int(fields[12]))  # utime, stime
        return ticks

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()


def test_a_complete_hot_load_is_safe_on_an_idle_and_on_a_loaded_runner_alike(
    fxgraph_run_main: FxgraphRun, run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    """The verdict rests on what the hot process did (hits, nothing rebuilt, equal outputs),
    not on its compile time, which a busy runner stretches (with the 2.0 floor verify had by
    default, these hot loads came out no-gain / slow under this load)."""
    proc, doc, cache, _ = fxgraph_run_main
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # float32 static and dynamic: the verdicts of the run that built the cache, no extra load
    idle = {c["id"]: (c["verdict"], c["cause"]) for c in doc["combos"] if c["dtype"] == "float32"}
    assert len(idle) == 2 and set(idle.values()) == {("safe", "hit")}, idle
    shutil.copytree(cache, tmp_path / "cache")
    out = tmp_path / "loaded.json"
    cores = os.cpu_count() or 1
    with CpuHogs(3 * cores) as hogs:  # three busy loops per core, beside verify's own phases
        before = hogs.cpu_ticks()
        loaded_proc = verify(
            run_fxcache,
            *("--dtypes", "float32", "--dynamic", "false,true"),
            *("--mechanisms", "fxgraph", "--training", "true", "--phase", "hot"),
            *("--cache-dir", str(tmp_path / "cache"), "--json", str(out)),
        )
        used = [b - a for a, b in zip(before, hogs.cpu_ticks(), strict=True)]
        alive = [p.poll() is None for p in hogs.procs]
    assert loaded_proc.returncode == 0, loaded_proc.stdout + loaded_proc.stderr
    assert all(alive) and all(t > 0 for t in used), (alive, used)  # the load was real
    loaded = load(out)
    assert loaded["settings"]["phase"] == "hot" and loaded["settings"]["min_speedup"] is None
    assert {c["id"]: (c["verdict"], c["cause"]) for c in loaded["combos"]} == idle, [
        c["reason"] for c in loaded["combos"]
    ]
    for combo in loaded["combos"]:
        assert combo["speedup"] is not None and f"{combo['speedup']}x" in combo["reason"]


@pytest.fixture(scope="module")
def faulty_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Cold phase only, for a user workload that can be told to abort or hang later."""
    cache = _shared(tmp_path_factory, "verify-faulty")
    out = cache / "cold.json"
    proc = _run_once(
        cache,
        "--workloads",
        "tests.workloads.faulty:sin_matmul",
        "--dtypes",
        "float32",
        "--dynamic",
        "false",
        "--mechanisms",
        "fxgraph",
        "--training",
        "false",
        "--phase",
        "cold",
        "--cache-dir",
        str(cache),
        "--json",
        str(out),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (combo,) = load(out)["combos"]
    assert combo["verdict"] == "skipped" and combo["cold"]["status"] == "ok", combo
    assert combo["hot"]["status"] == "not-run"
    return cache


def _hot_fault(run_fxcache: RunFxcache, shared: Path, fault: str, *extra: str) -> Any:
    cache = shared.with_name(f"{shared.name}-{fault}")
    shutil.rmtree(cache, ignore_errors=True)
    shutil.copytree(shared, cache)
    proc, combo = verify_one(
        run_fxcache,
        cache,
        *extra,
        workload="tests.workloads.faulty:sin_matmul",
        training="false",
        env={"FXCACHE_TEST_FAULT": fault},
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    return combo


def test_hot_process_abort_is_unsafe_with_the_signal(
    faulty_cache: Path, run_fxcache: RunFxcache
) -> None:
    combo = _hot_fault(run_fxcache, faulty_cache, "abort")
    assert (combo["verdict"], combo["cause"]) == ("unsafe", "crash")
    assert combo["hot"]["status"] == "crash"
    assert combo["hot"]["signal"] == "SIGABRT"
    assert "SIGABRT" in combo["reason"]


def test_hot_process_hang_becomes_a_timeout_verdict(
    faulty_cache: Path, run_fxcache: RunFxcache
) -> None:
    combo = _hot_fault(run_fxcache, faulty_cache, "hang", "--timeout", "20")
    assert (combo["verdict"], combo["cause"]) == ("unsafe", "timeout")
    assert combo["hot"]["status"] == "timeout"
    assert "timed out after 20 s" in combo["reason"]


def test_mega_cache_on_cpu_rebuilds_kernels_and_is_no_gain(
    run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    out = tmp_path / "r.json"
    proc = verify(
        run_fxcache,
        "--dtypes",
        "float32",
        "--dynamic",
        "false",
        "--mechanisms",
        "mega",
        "--cache-dir",
        str(tmp_path / "c"),
        "--json",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    (combo,) = load(out)["combos"]
    assert combo["hot"]["artifacts_loaded"] is True
    assert combo["hot"]["counters"].get("fxgraph_cache_hit", 0) >= 1
    assert combo["hot"]["kernels_built"] >= 1
    assert (combo["verdict"], combo["cause"]) == ("no-gain", "rebuilt")
    assert "C++ kernels" in combo["reason"]


def test_remote_cache_hits_through_redis_with_an_empty_local_dir(
    run_fxcache: RunFxcache, tmp_path: Path, redis_url: str
) -> None:
    out = tmp_path / "r.json"
    proc = verify(
        run_fxcache,
        "--dtypes",
        "float32",
        "--dynamic",
        "false",
        "--mechanisms",
        "remote",
        "--redis-url",
        redis_url,
        "--cache-dir",
        str(tmp_path / "c"),
        "--json",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    (combo,) = load(out)["combos"]
    assert combo["verdict"] in ("safe", "no-gain"), combo["reason"]
    assert combo["cold"]["counters"].get("fxgraph_cache_miss", 0) >= 1
    assert combo["hot"]["counters"].get("fxgraph_cache_hit", 0) >= 1
    assert combo["misses"] == 0
    assert combo["max_abs_err"]["hot_vs_cold"] == 0.0
    # the hot phase started from an empty local dir in the run's scratch, not in the cache dir
    assert not (tmp_path / "c" / combo["id"] / "hot").exists()


def test_remote_without_or_with_unreachable_redis_is_skipped(
    run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    args = ("--dtypes", "float32", "--dynamic", "false", "--mechanisms", "remote")
    proc = verify(run_fxcache, *args, "--json", str(tmp_path / "a.json"))
    assert proc.returncode == 0, proc.stderr
    (combo,) = load(tmp_path / "a.json")["combos"]
    assert combo["verdict"] == "skipped" and combo["reason"].startswith("Redis not configured")
    url = f"redis://127.0.0.1:{free_port()}/0"
    proc = verify(
        run_fxcache, *args, "--json", str(tmp_path / "b.json"), env={"FXCACHE_REDIS_URL": url}
    )
    assert proc.returncode == 0, proc.stderr
    (combo,) = load(tmp_path / "b.json")["combos"]
    assert combo["verdict"] == "skipped" and "unreachable" in combo["reason"]
    assert combo["cold"] is None and combo["hot"] is None


@pytest.mark.parametrize(
    ("workload", "message"),
    [
        ("nosuch_pkg.jobs:factory", "cannot import nosuch_pkg.jobs"),
        ("tests.workloads.faulty:wrong_shape", "must return a dict with 'model' and 'inputs'"),
        ("tests.workloads.faulty:no_tensors", "inputs holds no tensor"),
        ("tests.workloads.faulty:not_callable", "has no callable 'not_callable'"),
    ],
)
def test_bad_user_workloads_exit_2(run_fxcache: RunFxcache, workload: str, message: str) -> None:
    proc = verify(run_fxcache, "--workloads", workload, "--mechanisms", "fxgraph")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_a_non_reproducible_eager_reference_is_rechecked_not_blamed_on_the_cache(
    run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    out = tmp_path / "r.json"
    proc = verify(
        run_fxcache,
        *("--workloads", "tests.workloads.faulty:flaky_eager", "--dtypes", "float32"),
        *("--dynamic", "false", "--mechanisms", "fxgraph", "--training", "false"),
        *("--phase", "cold", "--cache-dir", str(tmp_path / "c"), "--json", str(out)),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (combo,) = load(out)["combos"]
    assert combo["verdict"] == "skipped", combo["reason"]  # cold only, and not "unsafe"
    assert combo["cold"]["eager_reproducible"] is False
    assert "eager reference changed between two runs" in combo["cold"]["eager_note"][0]
    assert combo["max_abs_err"]["cold_vs_eager"] < 1e-4


MODELS = "tests.workloads.models"
FAST = ("--min-speedup", "0")  # these tests are about values, not speed (no "slow" under load)


@pytest.mark.parametrize("training", ["true", "false"])
def test_dropout_models_are_safe_hot_equals_cold_from_the_same_seed(
    run_fxcache: RunFxcache, tmp_path: Path, training: str
) -> None:
    proc, combo = verify_one(
        run_fxcache,
        tmp_path,
        *FAST,
        workload=f"{MODELS}:dropout_mlp",
        dynamic="true",
        training=training,
        phase="both",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # dynamic=True on a module gives an AOTAutograd miss for a graph the cold phase did not
    # save either: the cold phase's own outcome, so a partial hit, not a miss
    assert combo["verdict"] == "safe", combo["reason"]
    assert combo["cause"] in ("hit", "partial-hit"), combo["reason"]
    # bitwise equal although every call draws a new dropout mask: both phases seed each call
    assert combo["max_abs_err"]["hot_vs_cold"] == 0.0
    assert "random-ops" in [n["kind"] for n in combo["notes"]]


@pytest.fixture(scope="module")
def switching_cold(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Cold phase only of a dynamic workload that recompiles when told to (no fault here)."""
    cache = _shared(tmp_path_factory, "verify-switching")
    proc = _run_once(
        cache,
        *("--workloads", f"{MODELS}:recompiles_when_faulted", "--dtypes", "float32"),
        *("--dynamic", "true", "--mechanisms", "fxgraph", "--training", "false"),
        *("--phase", "cold", "--cache-dir", str(cache), "--json", str(cache / "cold.json")),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (combo,) = load(cache / "cold.json")["combos"]
    assert combo["cold"]["recompiles"] == 0, combo
    return cache


def test_a_recompile_only_the_hot_process_needs_is_unsafe(
    switching_cold: Path, run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    shutil.copytree(switching_cold, tmp_path / "c")
    proc, combo = verify_one(
        run_fxcache,
        tmp_path / "c",
        workload=f"{MODELS}:recompiles_when_faulted",
        dynamic="true",
        training="false",
        env={"FXCACHE_TEST_FAULT": "recompile"},
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (combo["verdict"], combo["cause"]) == ("unsafe", "recompile"), combo["reason"]
    assert "_FLAGS" in combo["hot"]["recompile_guard"]  # torch's guard failure, named


def test_a_recompile_in_cold_and_hot_alike_is_a_note_not_unsafe(
    run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    proc, combo = verify_one(
        run_fxcache,
        tmp_path,
        workload=f"{MODELS}:recompiles_when_faulted",
        dynamic="true",
        training="false",
        phase="both",
        env={"FXCACHE_TEST_FAULT": "recompile"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert combo["verdict"] in ("safe", "no-gain") and combo["cause"] != "recompile", combo
    (note,) = [n for n in combo["notes"] if n["kind"] == "model-recompiles"]
    assert "_FLAGS" in note["guard"]
    assert combo["max_abs_err"]["hot_vs_cold"] == 0.0


def test_a_compiled_model_unstable_against_itself_is_compared_within_tolerance(
    run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    cache = tmp_path / "c"

    def jittery(phase: str, fault: str) -> tuple[Any, dict[str, Any]]:
        env = {"FXCACHE_TEST_FAULT": fault}
        return verify_one(
            run_fxcache,
            cache,
            *FAST,
            workload=f"{MODELS}:jittery",
            training="false",
            phase=phase,
            env=env,
        )

    proc, combo = jittery("cold", "")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc, combo = jittery("hot", "jitter")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert combo["hot"]["self_stable"] is False
    assert 0.0 < combo["max_abs_err"]["hot_vs_cold"] < 1e-5
    assert (combo["verdict"], combo["cause"]) == ("safe", "hit"), combo["reason"]
    assert "within tolerance" in combo["reason"]
    assert [n["kind"] for n in combo["notes"]] == ["nondeterministic"]
    # a wrong cache is still caught although the model is nondeterministic
    assert tamper_generated_code(cache) >= 1
    proc, combo = jittery("hot", "jitter")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (combo["verdict"], combo["cause"]) == ("unsafe", "hot-mismatch")


@pytest.mark.parametrize(
    "sample",
    [
        # the false alarms: fp16 accuracy vs eager (now judged against float64) and
        # a mark_dynamic recompile in training (the marks were lost on the gradient leaves)
        ("transformer_block", "float16", "false", "true"),
        ("sin_matmul", "bfloat16-autocast", "mark", "true"),
        # a model ending in LayerNorm: with a plain sum as the loss every gradient was rounding
        # noise, and the noise of the compiled backward was called a compiler error
        ("mlp", "bfloat16-autocast", "false", "true"),
    ],
)
def test_builtin_combos_sample_is_neither_unsafe_nor_error(
    sample: tuple[str, str, str, str], tmp_path: Path
) -> None:
    workload, dtype, dynamic, training = sample
    script = ROOT / "benchmarks" / "check_builtin_combos.py"
    proc = subprocess.run(
        [
            *(TORCH_PYTHON, str(script), "--python", TORCH_PYTHON),
            *("--workloads", workload, "--dtypes", dtype, "--dynamic", dynamic),
            *("--training", training, "--json", str(tmp_path / "r.json")),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **ENV, "PYTHONPATH": str(ROOT)},
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK: no built-in combination is unsafe or error" in proc.stdout
    (combo,) = load(tmp_path / "r.json")["combos"]
    assert combo["verdict"] in ("safe", "no-gain"), combo["reason"]
    assert combo["hot"].get("recompiles") == (None if dynamic == "false" else 0)
