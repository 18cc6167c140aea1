"""Timeouts and signals in `fxcache verify`, with real processes: a cancelled job is not a
success. SIGINT / SIGTERM, sent to the process group (Ctrl-C, a job cancel) or to the verify
process alone, stop every child (fork server, phase, Inductor's compile workers) at once, print
one line and exit 130 / 143, and leave no results document. A hung workload factory is reported
as a timeout; a timeout that is not a number of seconds > 0 is a usage error.

The phases here hang for an hour (`FXCACHE_TEST_FAULT=hang`) under `--timeout 3000`: a signal
that is not acted on shows as a subprocess timeout of the test, never as a slow pass.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, TORCH_PYTHON, RunFxcache, torch2_python

pytestmark = pytest.mark.slow

HANGING = ("--dtypes", "float32", "--dynamic", "false", "--mechanisms", "fxgraph",
           "--training", "false", "--device", "cpu")  # fmt: skip
GUARD_S = 600  # generous bound on every wait, so that a regression cannot hang the suite


def _stat(pid: int) -> tuple[str, str] | None:
    """(state, start time) of a process, None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], fields[19]


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            tree.setdefault(int(fields[1]), []).append(int(entry))
    return tree


def descendants(pid: int) -> list[int]:
    tree, found, todo = _children(), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _living(pids: dict[int, str]) -> list[int]:
    """Those of `pids` (pid -> start time) still running (a zombie has ended)."""
    alive = []
    for pid, started in pids.items():
        now = _stat(pid)
        if now is not None and now[1] == started and now[0] != "Z":
            alive.append(pid)
    return alive


def _wait_for(condition: object, what: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + GUARD_S
    while not condition():  # type: ignore[operator]
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"verify ended (rc {proc.returncode}) before {what}: {out}{err}")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"never saw {what}")
        time.sleep(0.2)


def _interrupt(
    tmp_path: Path, target: str, signum: int, python: str, workload: str, workers: bool = False
) -> None:
    out = tmp_path / "results.json"
    cache = tmp_path / "cache"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "FXCACHE_"))}
    env.update(FXCACHE_TEST_FAULT="hang", TMPDIR=str(scratch),
               TORCHINDUCTOR_COMPILE_THREADS="2" if workers else "1")  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "ci_fxcache", "verify", "--python", python,
         "--workloads", workload, *HANGING, "--timeout", "3000", "--json", str(out),
         "--cache-dir", str(cache)],
        cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group, as a job's shell gives it
    )  # fmt: skip
    try:
        combo = "tests.workloads.faulty_" + workload.split(":")[1]
        logs = lambda: list(scratch.glob(f"fxcache-run-*/*{combo}*/cold.log"))  # noqa: E731

        def phase_running() -> bool:
            if not logs():
                return False
            # the phase: a descendant in a process group of its own (the fork server's child)
            phases = [p for p in descendants(proc.pid) if os.getpgid(p) == p]
            return bool(phases) and (not workers or any(descendants(p) for p in phases))

        _wait_for(phase_running, "the hanging cold phase" + (" and its workers" * workers), proc)
        children = {p: s[1] for p in descendants(proc.pid) if (s := _stat(p)) is not None}
        assert len(children) >= 2 + workers, children  # fork server, phase (+ compile workers)
        (os.killpg if target == "group" else os.kill)(proc.pid, signum)
        stdout, stderr = proc.communicate(timeout=GUARD_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    name = signal.Signals(signum).name
    assert proc.returncode == 128 + signum, stdout + stderr
    assert stderr.splitlines() == [f"fxcache: error: interrupted ({name})"], stderr
    assert "error" not in stdout and "[1/1]" not in stdout, stdout  # no verdict for a kill
    assert not out.exists()
    deadline = time.monotonic() + GUARD_S
    while _living(children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _living(children) == [], f"children left running: {_living(children)}"
    assert list(scratch.glob("fxcache-*")) == []  # the run's scratch removed
    # a killed phase is not judged: no verdict or reference recorded for later hot-only runs
    assert [p.name for p in cache.rglob("*.json")] == []


@pytest.mark.parametrize(
    ("target", "signum"),
    [
        ("group", signal.SIGINT),
        ("alone", signal.SIGINT),
        ("group", signal.SIGTERM),
        ("alone", signal.SIGTERM),
    ],
)
def test_a_signal_stops_every_child_and_is_not_a_success(
    tmp_path: Path, target: str, signum: int
) -> None:
    _interrupt(tmp_path, target, signum, TORCH_PYTHON, "tests.workloads.faulty:sin_matmul")


def test_a_signal_stops_inductors_compile_workers_too(tmp_path: Path) -> None:
    """torch 2.14.1 ships Triton: with two compile threads the phase starts the worker pool."""
    _interrupt(tmp_path, "alone", signal.SIGINT, torch2_python(),
               "tests.workloads.faulty:pool_sin_matmul", workers=True)  # fmt: skip


def test_a_hung_workload_factory_is_a_timeout(run_fxcache: RunFxcache) -> None:
    proc = run_fxcache(
        "verify", "--python", TORCH_PYTHON, "--workloads", "tests.workloads.faulty:hanging_factory",
        *HANGING, "--timeout", "5", timeout=GUARD_S, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [
        "fxcache: error: workload tests.workloads.faulty:hanging_factory: the check timed out "
        "after 5 s (--timeout); does its factory hang?"
    ]


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1", "0", "1e300", "ten"])
def test_a_timeout_that_is_not_seconds_is_a_usage_error(
    run_fxcache: RunFxcache, value: str
) -> None:
    proc = run_fxcache(
        "verify", "--python", TORCH_PYTHON, "--device", "cuda", "--dtypes", "float32",
        "--dynamic", "false", "--mechanisms", "fxgraph", "--training", "false",
        f"--timeout={value}", timeout=GUARD_S, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"fxcache: error: argument --timeout: '{value}' "), line
    assert proc.stdout == ""
