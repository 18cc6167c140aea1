"""Matrix planning, flags and matrix files: fast, no torch."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from ci_fxcache import matrix, matrixrun, verdicts, workerpool
from ci_fxcache.errors import UsageError
from tests.conftest import TORCH_PYTHON, RunFxcache, free_port


def _one_line_usage_error(proc: object, needle: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr  # type: ignore[attr-defined]
    lines = proc.stderr.strip().splitlines()  # type: ignore[attr-defined]
    assert len(lines) == 1 and needle in lines[0], lines
    assert "Traceback" not in proc.stderr  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (
            ["--dtypes", "float32,float64"],
            "--dtypes float32,float64: unknown dtype value 'float64'",
        ),
        (["--mechanisms", "magic"], "unknown mechanism value 'magic'"),
        (["--dynamic", "maybe"], "unknown dynamic value 'maybe'"),
        (["--device", "tpu"], "unknown device value 'tpu'"),
        (["--training", "sometimes"], "'sometimes' is not true or false"),
        (["--workloads", "resnet"], "unknown workload 'resnet'"),
        (["--dtypes", ","], "--dtypes ,: needs at least one value"),
        (["--phase", "hot"], "--phase hot needs --cache-dir"),
        (["--compare", "fuzzy"], "invalid choice: 'fuzzy'"),
    ],
)
def test_bad_flags_exit_2(run_fxcache: RunFxcache, args: list[str], needle: str) -> None:
    _one_line_usage_error(run_fxcache("verify", "--python", TORCH_PYTHON, *args), needle)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("dtypes: [float32\nmechanisms: fxgraph\n", "malformed YAML at line"),
        ("dtypes: [float32, int8]\n", "dtypes: unknown dtype value 'int8'"),
        ("mechanisms: [fxgraph, cloud]\n", "unknown mechanism value 'cloud'"),
        ("dtype: float32\nbatch: 3\n", "unknown key 'batch'"),
        ("- float32\n", "expected a mapping of axes, got list"),
        ("dtypes: {a: 1}\n", "dtypes must be a list or a comma-separated string"),
    ],
)
def test_bad_matrix_files_exit_2(
    run_fxcache: RunFxcache, tmp_path: Path, text: str, needle: str
) -> None:
    path = tmp_path / "fxcache.yml"
    path.write_text(text)
    proc = run_fxcache("verify", "--python", TORCH_PYTHON, "--matrix-file", str(path))
    _one_line_usage_error(proc, needle)
    assert str(path) in proc.stderr


def test_missing_matrix_file_exit_2(run_fxcache: RunFxcache, tmp_path: Path) -> None:
    proc = run_fxcache("verify", "--matrix-file", str(tmp_path / "nope.yml"))
    _one_line_usage_error(proc, "cannot read it")


def test_matrix_file_then_flags_override(tmp_path: Path) -> None:
    path = tmp_path / "m.yml"
    path.write_text(
        "matrix:\n  dtypes: [bfloat16-autocast, float16]\n  dynamic: [mark, true]\n"
        "  training: [false]\n  workloads: 'mlp, pkg.mod:make'\n"
    )
    plan = matrix.build({"mechanisms": "mega", "dtypes": None}, str(path))
    assert plan.dtypes == ["bfloat16-autocast", "float16"]
    assert plan.dynamic == ["mark", "true"]
    assert plan.training == [False]
    assert plan.mechanisms == ["mega"]
    assert plan.workloads == ["mlp", "pkg.mod:make"]
    ids = [c.id for c in plan.combos()]
    assert len(ids) == len(set(ids)) == 2 * 2 * 2 * 1
    assert "mlp-auto-float16-mark-mega-infer" in ids


def test_default_matrix_is_the_twelve_combo_cpu_matrix() -> None:
    plan = matrix.build(dict.fromkeys(matrix.FLAGS), None)
    matrixrun.expand_devices(plan, {"cuda_capabilities": []})
    combos = plan.combos()
    assert len(combos) == 12
    assert {c.device for c in combos} == {"cpu"}
    matrixrun.expand_devices(plan, {"cuda_capabilities": [[9, 0]]})  # idempotent on cpu
    assert plan.devices == ["cpu"]


def test_skip_reasons() -> None:
    combo = matrix.Combo("sin_matmul", "cuda", "bfloat16", "false", "fxgraph", True)
    assert matrixrun.skip_reason(combo, {"cuda_capabilities": []}, None) == (
        "no-device",
        "no CUDA device",
    )
    assert "compute capability 8.0" in str(
        matrixrun.skip_reason(combo, {"cuda_capabilities": [[7, 5]]}, None)
    )
    assert matrixrun.skip_reason(combo, {"cuda_capabilities": [[9, 0]]}, None) is None


def test_redis_problem_is_bounded_and_says_why() -> None:
    assert str(matrixrun.redis_problem(None, True, "py")).startswith("Redis not configured")
    started = time.monotonic()
    why = matrixrun.redis_problem(f"redis://127.0.0.1:{free_port()}/0", True, "py")
    assert "unreachable" in str(why)
    # a server that accepts the connection and never answers: the timeout bounds the wait
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        port = silent.getsockname()[1]
        why = matrixrun.redis_problem(f"redis://127.0.0.1:{port}/0", True, "py")
    assert "unreachable" in str(why) and "timed out" in str(why)
    assert time.monotonic() - started < 2 * matrixrun.REDIS_CONNECT_TIMEOUT_S + 2
    with pytest.raises(UsageError):
        matrixrun.redis_problem("http://x", True, "py")


def test_redis_problem_reports_missing_redis_package(redis_url: str) -> None:
    assert matrixrun.redis_problem(redis_url, True, "py") is None
    assert "redis package is not installed" in str(matrixrun.redis_problem(redis_url, False, "py"))


def test_worker_env_exposes_only_the_worker_package() -> None:
    env, private = workerpool.worker_env({"PYTHONPATH": "/user/path"})
    try:
        first, rest = env["PYTHONPATH"].split(os.pathsep, 1)
        assert first == private and rest == "/user/path"
        assert os.listdir(private) == [workerpool.WORKER_NAME]
        link = Path(private) / workerpool.WORKER_NAME
        assert link.resolve() == workerpool.WORKER_DIR
    finally:
        import shutil

        shutil.rmtree(private)


def test_worker_imports_only_stdlib_torch_and_itself() -> None:
    import ast
    import sys

    allowed = set(sys.stdlib_module_names) | {"torch"}
    for path in workerpool.WORKER_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] in allowed, f"{path.name} imports {name}"


def _phase(**kw: object) -> dict[str, object]:
    base: dict[str, object] = {
        "status": "ok",
        "compile_s": 10.0,
        "wall_s": 12.0,
        "counters": {},
        "returncode": 0,
        "signal": None,
        "log_tail": "",
    }
    base.update(kw)
    return base


COMBO = {"dtype": "float32", "mechanism": "fxgraph", "device": "cpu"}
SETTINGS = {"compare": "bitwise", "min_speedup": 2.0}
SAME = {"vs_cold": {"max_abs_err": 0.0, "bitwise": True, "close": True, "detail": ""}}
HIT = {"fxgraph_cache_hit": 2, "aot_autograd_cache_hit": 1}


def test_judge_speedup_threshold_and_close_mode() -> None:
    slow = verdicts.judge(COMBO, _phase(), _phase(compile_s=6.0, counters=HIT), {}, SAME, SETTINGS)
    assert slow["verdict"] == "no-gain" and "1.67x < 2x" in slow["reason"]
    off = {"vs_cold": {"max_abs_err": 1e-7, "bitwise": False, "close": True, "detail": ""}}
    hot = _phase(compile_s=1.0, counters=HIT)
    assert verdicts.judge(COMBO, _phase(), hot, {}, off, SETTINGS)["verdict"] == "unsafe"
    close = {**SETTINGS, "compare": "close"}
    judged = verdicts.judge(COMBO, _phase(), hot, {}, off, close)
    assert judged["verdict"] == "safe" and "within tolerance" in judged["reason"]
    failed = verdicts.judge(COMBO, _phase(status="error", error="boom"), hot, {}, {}, SETTINGS)
    assert failed["verdict"] == "error" and "not a cache problem" in failed["reason"]


def test_report_id_is_validated(run_fxcache: RunFxcache) -> None:
    proc = run_fxcache("verify", "--report-id", "a/b", "--device", "cpu")
    assert proc.returncode == 2
    assert "invalid report id" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
