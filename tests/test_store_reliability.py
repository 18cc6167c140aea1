"""Fault injection on the local store: crashes, races, tampering, escapes, full disks, keys."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ci_fxcache.store import scopes
from ci_fxcache.store.layout import Layout
from tests.conftest import RunFxcache, _clean_env
from tests.store_helpers import (
    SAMPLE,
    Store,
    end_lease_holders,
    mount_tmpfs,
    tree_digest,
    write_files,
)


@pytest.fixture
def store(tmp_path: Path, run_fxcache: RunFxcache) -> Store:
    return Store(root=tmp_path / "root", run=run_fxcache, env={})


def saved(store: Store, files: dict[str, bytes] = SAMPLE, **kw: object) -> dict:
    state = store.restore(**kw)  # type: ignore[arg-type]
    write_files(Path(state["inductor_dir"]).parent, files)  # where the job's compiles write
    proc = store.save(**kw)  # type: ignore[arg-type]
    assert proc.returncode == 0 and json.loads(proc.stdout)["saved"], proc.stderr
    return state


def _fxcache(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "ci_fxcache", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_clean_env(env),
    )


def test_kill_9_during_save_leaves_old_or_new_never_mixed(store: Store) -> None:
    first = saved(store)
    old_manifest = (Path(first["scope_dir"]) / "manifest.json").read_bytes()
    state = store.restore(state="job2.json")
    write_files(state["scope_dir"], {"inductor/fxgraph/zz/entry3": b"job two's graph"})
    proc = _fxcache(
        "save", "--state-file", str(store.root.parent / "job2.json"),
        env={"FXCACHE_TEST_FAULT": "pause:60"},
    )  # fmt: skip
    assert proc.stdout is not None
    assert "pausing" in proc.stdout.readline()  # temp manifest written, rename not yet done
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert (Path(first["scope_dir"]) / "manifest.json").read_bytes() == old_manifest
    # The next job sees the old commit: its three files, verified, and nothing of job 2's
    # unsaved entry (its lease is still live, so the scope is not quarantined either).
    after = store.restore(state="job3.json")
    assert after["hit"] is True and after["files"] == 3 and after["quarantined"] == []
    # Job 2's owner (this test process) is alive: job 3 gets a private overlay it may save.
    assert after["read_only"] is False and after["mode"] != "in-place" and after["lease"]
    assert set(tree_digest(after["overlay_dir"])) == set(SAMPLE)
    # Saving again (a retried step) commits the new state: old plus new, all verified.
    assert json.loads(store.save(state="job2.json").stdout)["files"] == 4
    final = store.restore(state="job4.json")
    assert final["hit"] and final["files"] == 4 and not final["read_only"]


def test_eight_concurrent_saves_keep_every_file(store: Store) -> None:
    env = {"FXCACHE_SIGNING_KEY": "team-secret"}
    jobs = [store.restore(state=f"job{i}.json", env=env) for i in range(8)]
    assert len({j["scope_dir"] for j in jobs}) == 1 and not any(j["read_only"] for j in jobs)
    for i, job in enumerate(jobs):
        # Keyed jobs compile into private overlays (issue 26 §1), which their saves merge.
        base = Path(job["inductor_dir"]).parent
        write_files(base, {f"inductor/fxgraph/j{i}/entry": f"job {i}".encode() * 99})
    procs = [
        _fxcache("save", "--state-file", str(store.root.parent / f"job{i}.json"), env=env)
        for i in range(8)
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert "not saved" not in out
    manifest = json.loads((Path(jobs[0]["scope_dir"]) / "manifest.json").read_text())
    assert {f"inductor/fxgraph/j{i}/entry" for i in range(8)} == set(manifest["files"])
    assert not list((store.root / ".leases" / jobs[0]["scope_key"]).glob("*.json"))
    check = store.restore("--verify", "full", state="check.json", env=env)
    assert check["hit"] and check["files"] == 8 and check["quarantined"] == []
    assert check["signed"] and not check["read_only"]


def _tamper(kind: str, scope: Path) -> None:
    blob = scope / "triton/KERNELHASH/kernel.so"
    if kind in ("truncated", "flipped"):
        blob.chmod(0o644)
    if kind == "truncated":
        blob.write_bytes(blob.read_bytes()[:-100])
    elif kind == "flipped":
        data = bytearray(blob.read_bytes())
        data[1234] ^= 0x01
        blob.write_bytes(bytes(data))
    elif kind == "deleted":
        blob.unlink()
    elif kind == "planted":
        write_files(scope, {"inductor/fxgraph/ev/il": b"planted graph"})
    elif kind == "planted-top":
        (scope / "evil.py").write_text("print('hi')")
    elif kind == "symlink":
        (scope / "inductor/fxgraph/ab/link").symlink_to("/etc/passwd")
    elif kind == "symlink-dir":
        (scope / "inductor/escape").symlink_to(scope.parent.parent)
    elif kind == "manifest-escape":
        path = scope / "manifest.json"
        manifest = json.loads(path.read_text())
        manifest["files"]["inductor/../../outside"] = {"size": 1, "sha256": "0" * 64}
        manifest["total_bytes"] += 1  # consistent otherwise: only the escape is wrong
        path.write_text(json.dumps(manifest))
    elif kind == "manifest-other-scope":
        path = scope / "manifest.json"
        manifest = json.loads(path.read_text())
        manifest["scope_key"] = manifest["scope_key"].replace("torch2.13.0", "torch2.12.0")
        path.write_text(json.dumps(manifest))
    elif kind == "manifest-garbage":
        (scope / "manifest.json").write_text("{not json")


@pytest.mark.parametrize(
    ("kind", "problem"),
    [
        ("truncated", "truncated"),
        ("flipped", "altered"),
        ("deleted", "missing"),
        ("planted-top", "unexpected"),
        ("symlink", "symlink"),
        ("symlink-dir", "symlink"),
        ("manifest-escape", "escape"),
        ("manifest-other-scope", "manifest belongs to scope"),
        ("manifest-garbage", "unreadable manifest"),
    ],
)
def test_tampered_scope_is_quarantined_and_job_goes_cold(
    store: Store, kind: str, problem: str
) -> None:
    first = saved(store)
    scope = Path(first["scope_dir"])
    _tamper(kind, scope)
    state = store.restore(state="after.json", env={"GITHUB_ACTIONS": "true"})
    assert state["hit"] is False and state["files"] == 0
    [entry] = state["quarantined"]
    assert entry["scope"] == first["scope_key"]
    assert problem in entry["reason"] + " ".join(entry["problems"])
    assert (
        "::warning::fxcache: cache scope" in state["_stderr"] and "quarantined" in state["_stderr"]
    )
    # Cold fallback: a fresh empty scope, in place; the bad one is kept aside for inspection.
    assert tree_digest(state["inductor_dir"]) == {} and tree_digest(state["triton_dir"]) == {}
    [kept] = [p for p in (store.root / ".quarantine").iterdir() if p.is_dir()]
    note = json.loads(kept.with_name(kept.name + ".json").read_text())
    assert note["scope"] == first["scope_key"] and note["reason"] == entry["reason"]
    assert (kept / "manifest.json").exists()


def test_bit_flip_with_forged_mtime_needs_full_verify(store: Store) -> None:
    """Fast mode trusts size + mtime (documented); --verify full re-hashes and catches it."""
    first = saved(store)
    blob = Path(first["triton_dir"]) / "KERNELHASH/kernel.so"
    st = blob.stat()
    blob.chmod(0o644)
    data = bytearray(blob.read_bytes())
    data[7] ^= 0x80
    blob.write_bytes(bytes(data))
    os.utime(blob, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert store.restore(state="fast.json")["quarantined"] == []
    full = store.restore("--verify", "full", state="full.json")
    assert full["quarantined"] and "altered" in full["quarantined"][0]["reason"]


def test_save_never_commits_a_symlink(store: Store) -> None:
    state = store.restore()
    write_files(state["scope_dir"], SAMPLE)
    link = Path(state["inductor_dir"]) / "fxgraph/ab/link"
    link.symlink_to("/etc/passwd")
    proc = store.save()
    assert proc.returncode == 0 and "removed symlink" in proc.stderr
    assert not link.is_symlink()
    manifest = json.loads((Path(state["scope_dir"]) / "manifest.json").read_text())
    assert set(manifest["files"]) == set(SAMPLE)


@pytest.mark.parametrize("key", ["wrong", None])
def test_signed_store_never_uses_a_scope_with_a_bad_or_missing_signature(
    store: Store, key: str | None
) -> None:
    signer = {"FXCACHE_SIGNING_KEY": key} if key else {}
    saved(store, env=signer)
    state = store.restore(state="job.json", env={"FXCACHE_SIGNING_KEY": "right"})
    assert state["hit"] is False
    expected = "does not match" if key else "not signed"
    assert expected in state["quarantined"][0]["reason"]


def test_right_signing_key_is_a_hit_and_a_changed_manifest_is_not(store: Store) -> None:
    env = {"FXCACHE_SIGNING_KEY": "right"}
    first = saved(store, env=env)
    assert store.restore(state="a.json", env=env)["hit"] is True
    store.save(state="a.json", env=env)
    path = Path(first["scope_dir"]) / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["fingerprint"]["torch_version"] = "9.9.9"  # any edit breaks the HMAC
    path.write_text(json.dumps(manifest))
    state = store.restore(state="b.json", env=env)
    assert state["hit"] is False and "does not match" in state["quarantined"][0]["reason"]


def test_enospc_while_saving_is_a_warning(store: Store) -> None:
    """Simulated by the save's fault hook at the worst moment (temp manifest written, before
    the rename); the tmpfs test below exercises a real full filesystem where root may mount."""
    first = saved(store)
    old = (Path(first["scope_dir"]) / "manifest.json").read_bytes()
    state = store.restore(state="job.json", env={"GITHUB_ACTIONS": "true"})
    write_files(state["scope_dir"], {"inductor/fxgraph/new/x": b"new"})
    proc = store.save(state="job.json", env={"FXCACHE_TEST_FAULT": "enospc",
                                             "GITHUB_ACTIONS": "true"})  # fmt: skip
    assert proc.returncode == 0
    assert "::warning::fxcache: could not save cache scope" in proc.stderr
    assert "No space left on device" in proc.stderr
    assert (Path(first["scope_dir"]) / "manifest.json").read_bytes() == old
    assert not list((store.root / ".locks").glob("*.tmp"))  # no temp manifest left behind


def test_enospc_on_a_real_full_filesystem(tmp_path: Path, run_fxcache: RunFxcache) -> None:
    mnt = tmp_path / "tiny"
    if os.geteuid() != 0 or not mount_tmpfs(mnt, "256k"):
        pytest.skip("mounting a tiny tmpfs needs root with mount rights; the fault-hook test "
                    "above covers ENOSPC everywhere")  # fmt: skip
    try:
        store = Store(root=mnt / "root", run=run_fxcache, env={})
        state = store.restore(state="../job.json")
        n = 0
        try:  # the job's compiles fill the disk
            while True:
                write_files(state["inductor_dir"], {f"fill/{n:05d}": b"x" * 3000})
                n += 1
        except OSError:
            pass
        assert n > 10
        proc = store.save(state="../job.json", env={"GITHUB_ACTIONS": "true"})
        assert proc.returncode == 0, proc.stderr
        assert "::warning::fxcache: could not save" in proc.stderr
        assert "No space left on device" in proc.stderr
        assert not (Path(state["scope_dir"]) / "manifest.json").exists()
    finally:
        end_lease_holders(mnt / "root")
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_unusable_root_means_a_cold_job_not_a_failed_one(store: Store) -> None:
    store.root.parent.mkdir(parents=True, exist_ok=True)
    store.root.write_text("not a directory")
    temp = store.root.parent / "runner-temp"
    temp.mkdir()
    state = store.restore(env={"GITHUB_ACTIONS": "true", "RUNNER_TEMP": str(temp)})
    assert state["mode"] == "cold-fallback" and state["hit"] is False and state["read_only"]
    assert Path(state["inductor_dir"]).parent.parent == temp
    assert "::warning::fxcache: local store unusable" in state["_stderr"]
    assert Path(state["inductor_dir"]).is_dir()
    assert not str(state["inductor_dir"]).startswith(str(store.root))


def test_a_lock_held_too_long_is_a_warning_never_a_hang(store: Store) -> None:
    first = saved(store)
    (store.root.parent / "runner-temp").mkdir()
    env = {
        "FXCACHE_LOCK_TIMEOUT": "0.5",
        "GITHUB_ACTIONS": "true",
        "RUNNER_TEMP": str(store.root.parent / "runner-temp"),
    }
    job = store.restore(state="job.json")
    with scopes.lock(Layout(store.root), first["scope_key"]):
        blocked = store.restore(state="blocked.json", env=env)
        assert blocked["mode"] == "cold-fallback"
        proc = store.save(state="job.json", env=env)
    assert proc.returncode == 0 and "::warning::fxcache: could not save" in proc.stderr
    assert job["hit"] and store.save(state="job.json").returncode == 0
