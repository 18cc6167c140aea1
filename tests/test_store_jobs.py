"""The local store under real CI jobs: real processes compiling with real torch.

Each job is `tests/store_job.py` (restore, compile, save) in its own process, so leases have a
real owner that lives and dies like a runner's job.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ci_fxcache.store import in_place
from tests.conftest import ROOT, TORCH_PYTHON, RunFxcache, _clean_env
from tests.store_helpers import Store

JOB = str(ROOT / "tests" / "store_job.py")


@pytest.fixture
def store(tmp_path: Path, run_fxcache: RunFxcache) -> Store:
    return Store(root=tmp_path / "root", run=run_fxcache, env={})


def _job_cmd(root: Path, fns: str, *flags: str) -> list[str]:
    return [TORCH_PYTHON, JOB, "--root", str(root), "--fns", fns, *flags]


def job(
    root: Path, fns: str, *flags: str, env: dict[str, str] | None = None, rc: int = 0
) -> dict[str, Any]:
    """Run one job to its end; its JSON report."""
    proc = subprocess.run(
        _job_cmd(root, fns, *flags),
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=_clean_env({"TORCHINDUCTOR_COMPILE_THREADS": "1", **(env or {})}),
        timeout=900,
        check=False,
    )
    assert proc.returncode == rc, proc.stderr[-3000:]
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return report


def _manifest(scope: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((scope / "manifest.json").read_text())
    return data


@pytest.mark.slow
@pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "signed"])
def test_a_changed_committed_so_is_never_rerecorded(store: Store, signed: bool) -> None:
    """Issue 10 §1: restore, compile, save; flip one byte of a committed .so keeping its size
    and mtime; let a later job restore and save; the next checked restore must not be a hit."""
    env = {"FXCACHE_SIGNING_KEY": "team-secret"} if signed else {}
    first = job(store.root, "f0", env=env)
    assert first["save"]["saved"] and first["save"]["added"] > 0
    scope = Path(first["state"]["scope_dir"])
    before = _manifest(scope)
    [so, *_] = sorted(scope.rglob("*.so"))
    rel = so.relative_to(scope).as_posix()
    st = so.stat()
    so.chmod(0o644)
    data = bytearray(so.read_bytes())
    data[len(data) // 2] ^= 0x01
    so.write_bytes(bytes(data))
    os.utime(so, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert so.stat().st_size == st.st_size
    later = store.restore(state="later.json", env=env)
    if later["hit"]:  # fast verification cannot see it (unsigned): the save must not launder it
        proc = store.save(state="later.json", env=env)
        assert proc.returncode == 0, proc.stderr
        assert _manifest(scope)["files"][rel] == before["files"][rel]
    check = store.restore(*(() if signed else ("--verify", "full")), state="check.json", env=env)
    assert check["hit"] is False
    assert [q["scope"] for q in check["quarantined"] + later["quarantined"]] == [
        first["state"]["scope_key"]
    ]
    reasons = " ".join(" ".join(q["problems"]) for q in check["quarantined"] + later["quarantined"])
    assert f"altered: {rel}" in reasons


@pytest.mark.slow
def test_a_job_that_dies_before_save_costs_nothing(store: Store) -> None:
    """Issue 10 §3: a job compiles in place and fails before `save`; the next job must get the
    verified scope in place (not read-only, not quarantined), the dead job's files set aside."""
    first = job(store.root, "f0")
    assert first["save"]["saved"]
    scope = Path(first["state"]["scope_dir"])
    committed = set(_manifest(scope)["files"])
    failed = job(store.root, "f1", "--fail", rc=1)
    assert failed["state"]["mode"] == "in-place"
    unsaved = (
        {
            rel
            for rel in {p.relative_to(scope).as_posix() for p in scope.rglob("*") if p.is_file()}
            if not in_place.is_lock(rel)  # never cache content: left where they are
        }
        - committed
        - {"manifest.json", ".last-used"}
    )
    assert unsaved, "the failed job compiled nothing new in place"
    nxt = job(store.root, "f0")
    state = nxt["state"]
    assert state["hit"] and state["mode"] == "in-place" and not state["read_only"]
    assert state["quarantined"] == []
    assert state["set_aside"]["files"] == len(unsaved)
    assert "unsaved file(s) of a job that ended without saving" in nxt["restore_stderr"]
    aside = Path(state["set_aside"]["to"])
    assert {p.relative_to(aside).as_posix() for p in aside.rglob("*") if p.is_file()} == unsaved
    assert nxt["functions"]["f0"]["hit"] >= 1 and nxt["functions"]["f0"]["miss"] == 0
    assert nxt["save"]["saved"] and set(_manifest(scope)["files"]) == committed


@pytest.mark.slow
def test_four_parallel_jobs_leave_one_valid_scope_with_every_entry(store: Store) -> None:
    """Issue 10 §4: four concurrent jobs restore, compile different functions and save."""
    env = _clean_env({"TORCHINDUCTOR_COMPILE_THREADS": "1"})
    procs = [
        subprocess.Popen(
            _job_cmd(store.root, f"f{i}"),
            cwd=ROOT,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i in range(4)
    ]
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=1200)
        assert proc.returncode == 0, err[-3000:]
        reports.append(json.loads(out.strip().splitlines()[-1]))
    for report in reports:
        assert report["save"]["saved"], report["save_stderr"]
        assert not report["state"]["read_only"]
    assert [r["state"]["mode"] for r in reports].count("in-place") >= 1
    final = job(store.root, "f0,f1,f2,f3", "--no-save")
    assert final["state"]["hit"] and final["state"]["quarantined"] == []
    assert final["state"]["set_aside"] is None
    for name, result in final["functions"].items():
        assert result["hit"] >= 1 and result["miss"] == 0 and result["close"], (name, result)


def _verify_into(
    store: Store,
    state: dict[str, Any],
    out: Path,
    phase: str = "auto",
    mechanisms: str = "fxgraph,mega",
) -> dict[str, Any]:
    """`fxcache verify` (`--phase auto` as the action runs it) into the restored scope's verify
    dir; its results document."""
    proc = store.run(
        "verify",
        *("--python", TORCH_PYTHON, "--phase", phase, "--cache-dir", state["verify_dir"]),
        *("--workloads", "sin_matmul", "--device", "cpu", "--dtypes", "float32"),
        *("--dynamic", "false", "--training", "false", "--mechanisms", mechanisms),
        *("--json", str(out)),
        env={"TORCHINDUCTOR_COMPILE_THREADS": "1"},
        timeout=900,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc


def _committed_files(scope: Path) -> dict[str, tuple[bytes, int]]:
    """Every file the scope's manifest lists: its bytes and mtime."""
    return {
        rel: ((scope / rel).read_bytes(), (scope / rel).stat().st_mtime_ns)
        for rel in _manifest(scope)["files"]
    }


@pytest.mark.slow
def test_a_hot_only_verify_never_touches_committed_files(store: Store, tmp_path: Path) -> None:
    """A second job's hot-only verify over a committed scope writes its logs and results
    elsewhere: every committed file stays byte-identical and its save does not quarantine."""
    first = store.restore(state="first.json")
    cold = _verify_into(store, first, tmp_path / "results-first.json")
    assert cold["settings"]["phase"] == "both"
    saved = store.save(state="first.json")
    assert json.loads(saved.stdout)["saved"], saved.stderr
    scope = Path(first["scope_dir"])
    assert any(rel.startswith("verify/") for rel in _manifest(scope)["files"])
    before = _committed_files(scope)

    second = store.restore(state="second.json")
    assert second["hit"] and second["mode"] == "in-place", second
    hot = _verify_into(store, second, tmp_path / "results-second.json")
    assert hot["settings"]["phase"] == "hot"
    assert [c["verdict"] for c in hot["combos"]].count("unsafe") == 0, hot["combos"]
    assert _committed_files(scope) == before
    proc = store.save(state="second.json")
    assert json.loads(proc.stdout)["saved"], proc.stdout + proc.stderr
    assert not (store.root / ".quarantine").exists()
    check = store.restore("--verify", "full", state="check.json")
    assert check["hit"] and check["quarantined"] == [], check


@pytest.mark.slow
def test_a_verify_that_compiles_again_never_empties_committed_combinations(
    store: Store, tmp_path: Path
) -> None:
    """`--phase both` over a committed scope, then `auto` once a mechanism joined the matrix:
    committed combinations are neither emptied nor rebuilt in place (the next save would find
    committed files gone and quarantine the scope); only the new combination compiles into the
    scope, and the save adds it."""
    first = store.restore(state="first.json")
    made = _verify_into(store, first, tmp_path / "results-1.json", mechanisms="fxgraph")
    assert json.loads(store.save(state="first.json").stdout)["saved"]
    scope = Path(first["scope_dir"])
    before = _committed_files(scope)

    second = store.restore(state="second.json")
    assert second["hit"] and second["mode"] == "in-place", second
    again = _verify_into(store, second, tmp_path / "results-2.json", "both", "fxgraph")
    assert again["settings"]["phase"] == "both"
    assert [c["verdict"] for c in again["combos"]] == ["safe"], again["combos"]
    assert again["combos"][0]["cold"]["pid"] != made["combos"][0]["cold"]["pid"]
    assert _committed_files(scope) == before
    proc = store.save(state="second.json")
    assert json.loads(proc.stdout)["saved"], proc.stdout + proc.stderr
    assert not (store.root / ".quarantine").exists()

    third = store.restore(state="third.json")
    grown = _verify_into(store, third, tmp_path / "results-3.json", "auto", "fxgraph,mega")
    by_mechanism = {c["mechanism"]: c for c in grown["combos"]}
    assert grown["settings"]["phase"] == "both"
    # fxgraph ran hot only on the first job's reference; mega alone compiled cold
    assert by_mechanism["fxgraph"]["cold"]["pid"] == made["combos"][0]["cold"]["pid"]
    assert by_mechanism["mega"]["cold"]["pid"] != made["combos"][0]["cold"]["pid"]
    assert _committed_files(scope) == before
    proc = store.save(state="third.json")
    assert json.loads(proc.stdout)["saved"], proc.stdout + proc.stderr
    mega_dir = f"verify/{by_mechanism['mega']['id']}/"
    assert any(rel.startswith(mega_dir) for rel in _manifest(scope)["files"])
    check = store.restore("--verify", "full", state="check.json")
    assert check["hit"] and check["quarantined"] == [], check
