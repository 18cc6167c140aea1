"""Matrix planning, flags and matrix files: fast, no torch."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from ci_fxcache.errors import UsageError
from ci_fxcache.store.remote import redis_cache
from ci_fxcache.verify import forkserver, matrix, runner
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
        (["--min-speedup", "nan"], "--min-speedup: 'nan' is not a finite number"),
        (["--min-speedup", "inf"], "--min-speedup: 'inf' is not a finite number"),
        (["--min-speedup", "fast"], "--min-speedup: 'fast' is not a number"),
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
        ("version: 2\nmatrix:\n  dtypes: [float32]\n", "version 2 is not supported"),
        (b"dtypes: [float32]\n\xff\xfe\x00\n", "not UTF-8 text"),
        ("dtypes: " + "[" * 100_000 + "]" * 100_000 + "\n", "nested too deeply"),
    ],
)
def test_bad_matrix_files_exit_2(
    run_fxcache: RunFxcache, tmp_path: Path, text: str | bytes, needle: str
) -> None:
    path = tmp_path / "fxcache.yml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    proc = run_fxcache("verify", "--python", TORCH_PYTHON, "--matrix-file", str(path))
    _one_line_usage_error(proc, needle)
    assert str(path) in proc.stderr


def test_missing_matrix_file_exit_2(run_fxcache: RunFxcache, tmp_path: Path) -> None:
    proc = run_fxcache("verify", "--matrix-file", str(tmp_path / "nope.yml"))
    _one_line_usage_error(proc, "no such file")
    proc = run_fxcache("verify", "--matrix-file", str(tmp_path))
    _one_line_usage_error(proc, "is a directory, not a file")


def test_cache_dir_on_a_file_exit_2(run_fxcache: RunFxcache, tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    proc = run_fxcache("verify", "--python", TORCH_PYTHON, "--cache-dir", str(afile))
    _one_line_usage_error(proc, "--cache-dir: ")
    assert "exists and is not a directory" in proc.stderr
    assert afile.read_text() == "not a directory"


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b'{"scope": ', "not valid JSON"),
        (b"\xff\xfe", "not UTF-8 text"),
        (b"[" * 100_000, "nested too deeply"),
    ],
)
def test_bad_cache_state_exit_2(
    run_fxcache: RunFxcache, tmp_path: Path, content: bytes, needle: str
) -> None:
    state = tmp_path / "state.json"
    state.write_bytes(content)
    proc = run_fxcache("verify", "--python", TORCH_PYTHON, "--cache-state", str(state))
    _one_line_usage_error(proc, needle)


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


def test_default_matrix_is_the_twenty_combo_cpu_matrix() -> None:
    plan = matrix.build(dict.fromkeys(matrix.FLAGS), None)
    runner.expand_devices(plan, {"cuda_capabilities": []})
    combos = plan.combos()
    assert len(combos) == 20
    assert {c.mechanism for c in combos} == {
        "fxgraph",
        "mega",
        "precompile",
        "aot",
        "precompile-api",
    }
    assert {c.device for c in combos} == {"cpu"}
    runner.expand_devices(plan, {"cuda_capabilities": [[9, 0]]})  # idempotent on cpu
    assert plan.devices == ["cpu"]


def test_skip_reasons() -> None:
    combo = matrix.Combo("sin_matmul", "cuda", "bfloat16", "false", "fxgraph", True)
    assert runner.skip_reason(combo, {"cuda_capabilities": []}, None) == (
        "no-device",
        "no CUDA device",
    )
    cause, reason = runner.skip_reason(combo, {"cuda_capabilities": [[7, 5]]}, None) or ("", "")
    assert cause == "gpu-too-old" and "compute capability 8.0" in reason
    assert runner.skip_reason(combo, {"cuda_capabilities": [[9, 0]]}, None) is None


def test_redis_problem_is_bounded_and_says_why() -> None:
    assert str(runner.redis_problem(None, True, "py")).startswith("Redis not configured")
    started = time.monotonic()
    why = runner.redis_problem(f"redis://127.0.0.1:{free_port()}/0", True, "py")
    assert "unreachable" in str(why)
    # a server that accepts the connection and never answers: the timeout bounds the wait
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        port = silent.getsockname()[1]
        why = runner.redis_problem(f"redis://127.0.0.1:{port}/0", True, "py")
    assert "unreachable" in str(why) and "timed out" in str(why)
    assert time.monotonic() - started < 2 * redis_cache.CONNECT_TIMEOUT_S + 2
    with pytest.raises(UsageError):
        runner.redis_problem("http://x", True, "py")


def test_redis_problem_reports_missing_redis_package(redis_url: str) -> None:
    assert runner.redis_problem(redis_url, True, "py") is None
    assert "redis package is not installed" in str(runner.redis_problem(redis_url, False, "py"))


def test_worker_env_exposes_only_the_worker_package() -> None:
    env, private = forkserver.worker_env({"PYTHONPATH": "/user/path"})
    try:
        first, rest = env["PYTHONPATH"].split(os.pathsep, 1)
        assert first == private and rest == "/user/path"
        assert os.listdir(private) == [forkserver.WORKER_NAME]
        link = Path(private) / forkserver.WORKER_NAME
        assert link.resolve() == forkserver.WORKER_DIR
    finally:
        import shutil

        shutil.rmtree(private)


def test_worker_imports_only_stdlib_torch_and_itself() -> None:
    import ast
    import sys

    # triton: torch's own GPU compiler, imported only where the user's torch has it
    allowed = set(sys.stdlib_module_names) | {"torch", "triton"}
    for path in forkserver.WORKER_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] in allowed, f"{path.name} imports {name}"


def test_report_id_is_validated(run_fxcache: RunFxcache) -> None:
    proc = run_fxcache("verify", "--report-id", "a/b", "--device", "cpu")
    assert proc.returncode == 2
    assert "invalid report id" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
