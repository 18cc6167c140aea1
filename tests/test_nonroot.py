"""The store, its jobs and verify as an unprivileged user, as a self-hosted runner runs them.

Root ignores file modes, so every scenario here runs as `nobody` (tests/nonroot.py) when the
suite runs as root: a read-only file, a directory another user owns, a umask, all count.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.nonroot import NonRoot

JOB = str(ROOT / "tests" / "store_job.py")


def _job(user: NonRoot, root: Path, fns: str, *flags: str) -> dict[str, Any]:
    """tests/store_job.py as the user: restore, compile `fns` with real torch, save."""
    proc = user.run(
        ["python", JOB, "--root", str(root), "--fns", fns, "--python", user.python, *flags],
        env={"TORCHINDUCTOR_COMPILE_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return report


def _committed(scope: Path) -> dict[str, str]:
    """sha256 of every file the scope's manifest lists."""
    files = json.loads((scope / "manifest.json").read_text())["files"]
    return {rel: hashlib.sha256((scope / rel).read_bytes()).hexdigest() for rel in files}


@pytest.mark.slow
def test_a_non_root_job_compiles_again_after_a_save(nonroot: NonRoot) -> None:
    """Restore, compile, save; restore, compile again (in place, then a hardlink overlay):
    Inductor reopens its lock files for writing on every compile, so no save may make them
    read-only (issue 23 §1: `PermissionError` on `inductor/locks/*.lock` from the 2nd job)."""
    root = nonroot.mkdir("store") / "root"
    first = _job(nonroot, root, "f0")
    assert first["functions"]["f0"]["close"] and first["save"]["saved"], first
    scope = Path(first["state"]["scope_dir"])
    before = _committed(scope)

    again = _job(nonroot, root, "f0")
    assert again["state"]["mode"] == "in-place" and again["state"]["hit"], again["state"]
    assert again["functions"]["f0"] == {"hit": 1, "miss": 0, "close": True}, again
    assert again["save"]["saved"], again
    locks = sorted(p for p in (scope / "inductor").rglob("*.lock"))
    assert locks, "Inductor wrote no lock file: the scenario no longer covers them"
    manifest = json.loads((scope / "manifest.json").read_text())
    assert not [rel for rel in manifest["files"] if rel.endswith(".lock")]
    assert all(p.stat().st_mode & stat.S_IWUSR for p in locks)

    fork = _job(nonroot, root, "f0", "--read-only")
    assert fork["state"]["mode"] == ("hardlink" if nonroot.uid else "copy"), fork["state"]
    assert fork["functions"]["f0"] == {"hit": 1, "miss": 0, "close": True}, fork
    assert fork["save"]["saved"] is False
    assert _committed(scope) == before
    assert not (root / ".quarantine").exists()


def _fake_job_files(user: NonRoot, directory: str, umask: int, name: str = "ab") -> None:
    """What a compile leaves in a cache dir, written by the user under `umask`: entries by
    rename (0600, as Inductor's mkstemp makes them), directories, an empty lock file."""
    script = (
        "import os, sys, tempfile\n"
        "d, n = sys.argv[1:]\n"
        "for rel, body in ((n + '/entry', b'graph'), (n + '/cd/kernel.so', b'so')):\n"
        "    rel = 'inductor/' + rel\n"
        "    path = os.path.join(d, rel)\n"
        "    os.makedirs(os.path.dirname(path), exist_ok=True)\n"
        "    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path))\n"
        "    os.write(fd, body); os.close(fd); os.replace(tmp, path)\n"
        "os.makedirs(os.path.join(d, 'inductor/locks'), exist_ok=True)\n"
        "open(os.path.join(d, 'inductor/locks/' + n + '.lock'), 'a').close()\n"
    )
    proc = user.run(["python", "-c", script, directory, name], umask=umask)
    assert proc.returncode == 0, proc.stderr


def _restore(user: NonRoot, root: Path, *flags: str, umask: int = 0o022) -> dict[str, Any]:
    state = user.mkdir("state", 0o777) / "state.json"
    proc = user.fxcache(
        "restore", "--root", str(root), "--python", user.python, "--json",
        "--state-file", str(state), *flags, umask=umask,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    data["_stderr"] = proc.stderr
    return data


def _save(user: NonRoot, state: dict[str, Any], umask: int = 0o022) -> dict[str, Any]:
    proc = user.fxcache("save", "--json", "--state-file", state["state_file"], umask=umask)
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    data["_stderr"] = proc.stderr
    return data


def test_locks_an_older_save_made_read_only_are_opened_up(nonroot: NonRoot) -> None:
    """A scope saved before this fix lists its lock files, 0444: an in-place restore makes
    them writable again, an overlay leaves them out (torch makes its own), the next save
    drops them from the manifest."""
    root = nonroot.mkdir("store") / "root"
    first = _restore(nonroot, root)
    _fake_job_files(nonroot, first["scope_dir"], 0o022)
    assert _save(nonroot, first)["saved"]
    scope = Path(first["scope_dir"])
    lock = scope / "inductor/locks/ab.lock"
    # As an older save left it: listed, read-only, no seal.
    manifest = json.loads((scope / "manifest.json").read_text())
    st = lock.stat()
    manifest["files"]["inductor/locks/ab.lock"] = {
        "size": 0, "mtime_ns": st.st_mtime_ns, "sha256": hashlib.sha256(b"").hexdigest(),
    }  # fmt: skip
    (scope / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
    for seal in (root / ".seals").glob("*.json"):
        seal.unlink()
    lock.chmod(0o444)

    ro = _restore(nonroot, root, "--read-only", "--overlay", "hardlink")
    assert ro["hit"] and ro["mode"] == "hardlink", ro
    assert not (Path(ro["inductor_dir"]) / "locks/ab.lock").exists()
    again = _restore(nonroot, root)
    assert again["mode"] == "in-place" and again["hit"], again
    assert lock.stat().st_mode & stat.S_IWUSR
    assert _save(nonroot, again)["saved"]
    assert (
        "inductor/locks/ab.lock" not in json.loads((scope / "manifest.json").read_text())["files"]
    )


def _world_writable(root: Path) -> list[str]:
    found = []
    for dirpath, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & stat.S_IWOTH:
                found.append(os.path.relpath(path, root))
    if os.lstat(root).st_mode & stat.S_IWOTH:
        found.append(".")
    return found


def test_umask_000_leaves_nothing_world_writable(nonroot: NonRoot) -> None:
    """Whatever the umask, the store creates nothing any local user could write (root,
    scopes, .leases, .locks, manifests, seals; a save takes others' write permission from the
    directories and files it commits)."""
    root = nonroot.mkdir("store") / "root"
    first = _restore(nonroot, root, umask=0)
    _fake_job_files(nonroot, first["scope_dir"], 0)
    assert _save(nonroot, first, umask=0)["saved"]
    assert _restore(nonroot, root, "--read-only", "--overlay", "copy", umask=0)["hit"]
    held = _restore(nonroot, root, umask=0)  # a lease of a job that has not saved yet
    assert held["lease"]
    assert _world_writable(root) == []


def _shared_scope(alice: NonRoot) -> tuple[Path, Path]:
    """A store root in a group-writable directory and a scope alice saved with umask 002."""
    root = alice.mkdir("shared", 0o775) / "root"
    first = _restore(alice, root, umask=0o002)
    _fake_job_files(alice, first["scope_dir"], 0o002)
    assert _save(alice, first, umask=0o002)["saved"]
    return root, Path(first["scope_dir"])


def test_a_group_shared_store_works_with_umask_002(nonroot: NonRoot) -> None:
    """Two runner users in one group, umask 002: what one saves the other restores (in place
    and read-only), compiles into and saves; manifests and seals are group-readable; nothing
    is quarantined."""
    alice, bob = nonroot, nonroot.other_user()
    root, scope = _shared_scope(alice)
    assert stat.S_IMODE((scope / "manifest.json").stat().st_mode) == 0o664
    assert stat.S_IMODE(scope.stat().st_mode) == 0o775
    assert stat.S_IMODE((scope / "inductor/ab/entry").stat().st_mode) == 0o444
    assert stat.S_IMODE((scope / "inductor/ab/cd").stat().st_mode) == 0o775
    assert stat.S_IMODE((scope / "inductor/locks/ab.lock").stat().st_mode) == 0o664

    ro = _restore(bob, root, "--read-only", umask=0o002)
    assert ro["hit"] and ro["quarantined"] == [], ro["_stderr"]
    mine = _restore(bob, root, umask=0o002)
    assert mine["hit"] and mine["mode"] == "in-place", mine["_stderr"]
    lock = Path(mine["inductor_dir"]) / "locks/ab.lock"
    opened = bob.run(["python", "-c", "import sys; open(sys.argv[1], 'r+b')", str(lock)])
    assert opened.returncode == 0, opened.stderr  # as filelock opens it: bob locks alice's
    _fake_job_files(bob, mine["scope_dir"], 0o002, "ef")
    saved = _save(bob, mine, umask=0o002)
    assert saved["saved"], saved
    assert not (root / ".quarantine").exists()


def test_a_manifest_the_user_cannot_read_is_not_tampering(nonroot: NonRoot) -> None:
    """Another user's restore that may not read the manifest warns, naming the permission,
    and runs cold; the valid scope is not quarantined."""
    if nonroot.reads_bypassed:
        pytest.skip("the checkout is not readable by other users: the test user may read anything")
    alice, bob = nonroot, nonroot.other_user()
    root, scope = _shared_scope(alice)
    (scope / "manifest.json").chmod(0o600)  # e.g. saved by an older fxcache
    ro = _restore(bob, root, "--read-only", umask=0o002)
    assert ro["mode"] == "cold-fallback" and not ro["hit"], ro
    assert "permission denied" in ro["_stderr"].lower(), ro["_stderr"]
    assert "manifest.json" in ro["_stderr"]
    assert scope.is_dir() and not (root / ".quarantine").exists()
    assert _restore(alice, root, "--read-only", umask=0o002)["hit"]


def _verify(user: NonRoot, state: dict[str, Any], out: Path) -> dict[str, Any]:
    """`fxcache verify --phase auto` (as the action runs it) into the scope's verify dir."""
    proc = user.fxcache(
        "verify",
        *("--python", user.python, "--phase", "auto", "--cache-dir", state["verify_dir"]),
        *("--workloads", "sin_matmul", "--device", "cpu", "--dtypes", "float32"),
        *("--dynamic", "false", "--training", "false", "--mechanisms", "fxgraph"),
        *("--json", str(out)),
        env={"TORCHINDUCTOR_COMPILE_THREADS": "1"},
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc


@pytest.mark.slow
def test_verify_runs_as_a_non_root_user_over_a_saved_scope(nonroot: NonRoot) -> None:
    """restore -> verify (cold and hot) -> save, then a second job's hot-only verify over the
    committed scope, as an unprivileged user: safe, nothing quarantined."""
    root = nonroot.mkdir("store") / "root"
    out = nonroot.mkdir("results")
    first = _restore(nonroot, root)
    made = _verify(nonroot, first, out / "first.json")
    assert [c["verdict"] for c in made["combos"]] == ["safe"], made["combos"]
    assert _save(nonroot, first)["saved"]
    second = _restore(nonroot, root)
    assert second["hit"] and second["mode"] == "in-place", second["_stderr"]
    hot = _verify(nonroot, second, out / "second.json")
    assert hot["settings"]["phase"] == "hot"
    assert [c["verdict"] for c in hot["combos"]] == ["safe"], hot["combos"]
    assert _save(nonroot, second)["saved"]
    assert not (root / ".quarantine").exists()
