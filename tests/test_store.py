"""`fxcache restore` / `save` / `invalidate` on a tiny local store, through the real CLI."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TORCH_PYTHON, RunFxcache
from tests.store_helpers import SAMPLE, Store, tree_digest, write_files


@pytest.fixture
def store(tmp_path: Path, run_fxcache: RunFxcache) -> Store:
    return Store(root=tmp_path / "root", run=run_fxcache, env={})


def saved_scope(store: Store, files: dict[str, bytes] = SAMPLE) -> dict:
    state = store.restore()
    write_files(state["scope_dir"], files)
    proc = store.save()
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["saved"] is True
    return state


def test_cold_then_hit_in_place(store: Store) -> None:
    cold = store.restore()
    assert cold["hit"] is False and cold["read_only"] is False and cold["mode"] == "in-place"
    assert cold["inductor_dir"] == str(Path(cold["scope_dir"]) / "inductor")
    assert Path(cold["scope_dir"]).parent == store.root
    write_files(cold["scope_dir"], SAMPLE)
    saved = json.loads(store.save().stdout)
    assert saved == {
        "saved": True,
        "scope_key": cold["scope_key"],
        "files": 3,
        "added": 3,
        "bytes": sum(len(v) for v in SAMPLE.values()),
        "signed": False,
    }
    manifest = json.loads((Path(cold["scope_dir"]) / "manifest.json").read_text())
    assert set(manifest["files"]) == set(SAMPLE)
    assert manifest["fingerprint"]["torch_version"].startswith("2.13.0")
    hot = store.restore()
    assert hot["hit"] is True and hot["files"] == 3 and hot["quarantined"] == []
    assert hot["inductor_dir"] == cold["inductor_dir"]  # in place: nothing copied
    # Lease of the in-place restore was released by save; the new restore holds one.
    leases = list((store.root / ".leases" / cold["scope_key"]).glob("*.json"))
    assert [str(p) for p in leases] == [hot["lease"]]


def test_export_lines_and_actions_files(store: Store, tmp_path: Path) -> None:
    proc = store.run(
        "restore", "--root", str(store.root), "--python", TORCH_PYTHON,
        "--state-file", str(tmp_path / "s.json"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    script = proc.stdout + 'echo "$TORCHINDUCTOR_CACHE_DIR|$TRITON_CACHE_DIR"\n'
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    inductor, triton = out.stdout.strip().split("|")
    assert inductor.endswith("/inductor") and triton.endswith("/triton")
    assert store.save(state="s.json").returncode == 0  # the first job ends
    env_file, out_file = tmp_path / "env", tmp_path / "out"
    env_file.touch()
    out_file.touch()
    proc = store.run(
        "restore", "--root", str(store.root), "--python", TORCH_PYTHON,
        "--state-file", str(tmp_path / "s2.json"),
        env={"GITHUB_ACTIONS": "true", "GITHUB_ENV": str(env_file),
             "GITHUB_OUTPUT": str(out_file), "GITHUB_EVENT_NAME": "push"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "export " not in proc.stdout
    env_text, out_text = env_file.read_text(), out_file.read_text()
    assert "TORCHINDUCTOR_CACHE_DIR<<" in env_text and inductor in env_text
    assert "TRITON_CACHE_DIR<<" in env_text
    for name in ("cache-key", "cache-hit", "scope-dir", "verify-dir", "state-file"):
        assert f"{name}<<" in out_text
    assert str(tmp_path / "s2.json") in out_text


def test_read_only_overlay_never_reaches_the_scope(store: Store) -> None:
    state = saved_scope(store)
    before = tree_digest(state["scope_dir"])
    ro = store.restore("--read-only", state="ro.json")
    assert ro["read_only"] is True and ro["hit"] is True
    assert not ro["inductor_dir"].startswith(state["scope_dir"])
    assert tree_digest(Path(ro["inductor_dir"]).parent) == {
        k: v for k, v in before.items() if "/" in k
    }
    # The job writes into its overlay: new files, a replaced file, an in-place overwrite.
    overlay = Path(ro["overlay_dir"])
    write_files(overlay, {"inductor/new/entry": b"new", "inductor/fxgraph/ab/entry1": b"x"})
    target = overlay / "triton/KERNELHASH/kernel.so"
    try:  # root writes through the 0444 mode: `auto` gave root a copy
        with target.open("r+b") as fh:
            fh.write(b"CORRUPTED")
        assert ro["mode"] in ("copy", "reflink")
    except PermissionError:  # an unprivileged user got a hardlink and is refused
        assert ro["mode"] == "hardlink" and os.geteuid() != 0
    assert tree_digest(state["scope_dir"]) == before
    proc = store.save(state="ro.json")
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["saved"] is False
    assert store.restore(state="again.json")["quarantined"] == []


def test_hardlink_overlay_refuses_in_place_writes(store: Store, run_fxcache: RunFxcache) -> None:
    """Hardlinks share the inode: committed files are read-only, so an unprivileged writer
    gets EACCES instead of altering the scope (root would bypass modes: `auto` copies then)."""
    base = Path(tempfile.mkdtemp(prefix="fxcache-hl-"))
    try:
        base.chmod(0o755)
        s = Store(root=base / "root", run=run_fxcache, env={})
        state = saved_scope(s)
        before = tree_digest(state["scope_dir"])
        ro = s.restore("--read-only", "--overlay", "hardlink", state="ro.json")
        assert ro["mode"] == "hardlink"
        target = Path(ro["triton_dir"]) / "KERNELHASH/kernel.so"
        assert (
            target.stat().st_ino
            == (Path(state["triton_dir"]) / "KERNELHASH/kernel.so").stat().st_ino
        )
        # `1<>` opens the file for writing without truncating it: a true in-place write.
        extra = {"user": 65534} if os.geteuid() == 0 else {}
        readable = subprocess.run(["cat", str(target)], capture_output=True, check=False, **extra)
        assert readable.returncode == 0  # the writer reaches the file: only its mode stops it
        proc = subprocess.run(
            ["sh", "-c", 'printf CORRUPTED 1<> "$0"', str(target)],
            capture_output=True, text=True, check=False, **extra,
        )  # fmt: skip
        assert proc.returncode != 0 and "Permission denied" in proc.stderr
        assert tree_digest(state["scope_dir"]) == before
    finally:
        shutil.rmtree(base, onerror=lambda f, p, e: (os.chmod(os.path.dirname(p), 0o755), f(p)))


def _event(tmp_path: Path, head: str, base: str, fork: bool) -> str:
    path = tmp_path / "event.json"
    path.write_text(json.dumps({"pull_request": {
        "head": {"repo": {"full_name": head, "fork": fork}},
        "base": {"repo": {"full_name": base, "fork": False}},
    }}))  # fmt: skip
    return str(path)


@pytest.mark.parametrize(
    ("event", "head", "fork", "read_only"),
    [
        ("push", None, False, False),
        ("pull_request", "org/repo", False, False),
        ("pull_request", "someone/repo", True, True),
        ("pull_request_target", "org/repo", False, True),
        ("issue_comment", None, False, True),
        ("workflow_run", None, False, True),
    ],
)
def test_untrusted_events_are_read_only(
    store: Store, tmp_path: Path, event: str, head: str | None, fork: bool, read_only: bool
) -> None:
    env = {"GITHUB_ACTIONS": "true", "GITHUB_EVENT_NAME": event}
    if head:
        env["GITHUB_EVENT_PATH"] = _event(tmp_path, head, "org/repo", fork)
    state = store.restore(env=env)
    assert state["read_only"] is read_only
    if read_only:
        assert state["overlay_dir"] and state["lease"] is None


def _plant_scope(
    root: Path,
    key: str,
    torch_version: str,
    size: int,
    torch_path: str = "/elsewhere/torch",
    like: dict[str, Any] | None = None,
) -> Path:
    """A scope saved by `torch_version`; its CUDA / HIP / Triton those of the fingerprint
    `like` (the current environment's: only torch changed), else none (a CPU build's)."""
    builds = {name: (like or {}).get(name) for name in ("cuda_version", "hip_version",
                                                        "triton_version")}  # fmt: skip
    scope = root / key
    write_files(scope, {"inductor/x/blob": b"z" * size})
    (scope / "manifest.json").write_text(json.dumps({
        "schema": "fxcache-manifest/1", "scope_key": key, "files": {}, "total_bytes": 0,
        "torch_paths": [], "created_at": "", "updated_at": "", "last_used_at": "",
        "verification": {"references": []},
        "fingerprint": {"torch_version": torch_version, **builds, "python_abi": "cp311",
                        "torch_path": torch_path},
    }))  # fmt: skip
    return scope


def _older(version: str, older: str) -> str:
    """The current torch version with its release replaced by `older`, its build kept:
    `2.13.0+cpu` -> `2.12.0+cpu`, `2.13.0+cu130` -> `2.12.0+cu130`."""
    _release, plus, build = version.partition("+")
    return older + plus + build


def test_upgrade_removes_stale_scopes_of_this_environment(store: Store) -> None:
    current = store.restore()
    key, fp = current["scope_key"], current["fingerprint"]
    here, now = fp["torch_path"], fp["torch_version"]  # `2.13.0+cpu`, `2.13.0+cu130`, ...
    old = key.replace("torch2.13.0", "torch2.12.0").rsplit("-", 1)[0] + "-0123456789ab"
    other_env = key.replace("torch2.13.0", "torch2.11.0").rsplit("-", 1)[0] + "-0123456789cd"
    other_arch = key.replace("x86_64", "aarch64").replace("torch2.13.0", "torch2.12.0")
    was = _older(now, "2.12.0")
    size = sum(
        f.stat().st_size
        for f in _plant_scope(store.root, old, was, 5000, here, like=fp).rglob("*")
        if f.is_file()
    )
    _plant_scope(store.root, other_env, _older(now, "2.11.0"), 10)  # another interpreter's torch
    _plant_scope(store.root, other_arch, was, 10, here, like=fp)
    kept = store.restore("--no-invalidate-on-upgrade", state="k.json")
    assert kept["invalidated"] == [] and (store.root / old).exists()
    state = store.restore(state="u.json")
    assert state["invalidated"] == [
        {"scope": old, "reason": "upgrade", "versions": f"torch {was} -> {now}", "bytes": size}
    ]
    assert f"torch {was} -> {now}: removed 1 scope, 5." in state["_stderr"]
    assert not (store.root / old).exists()
    assert (store.root / other_env).exists()  # another environment: left to invalidate
    assert (store.root / other_arch).exists()  # another runner architecture: not ours to judge


def test_upgrade_of_triton_only_is_seen_through_the_manifest(store: Store) -> None:
    current = store.restore()
    fp = current["fingerprint"]
    same_readable = current["scope_key"].rsplit("-", 1)[0] + "-fedcba987654"
    scope = _plant_scope(
        store.root, same_readable, fp["torch_version"], 10, fp["torch_path"], like=fp
    )
    manifest = json.loads((scope / "manifest.json").read_text())
    manifest["fingerprint"]["triton_version"] = "3.1.0"  # none here, or 3.x with a CUDA build
    (scope / "manifest.json").write_text(json.dumps(manifest))
    state = store.restore(state="u.json")
    now = fp["triton_version"] or "none"
    assert [i["versions"] for i in state["invalidated"]] == [f"triton 3.1.0 -> {now}"]


def test_invalidate_policies(store: Store) -> None:
    current = store.restore()
    key, version = current["scope_key"], current["fingerprint"]["torch_version"]
    now = time.time()
    prefix = key.rsplit("-", 1)[0]
    ages = {"0123456789a0": 30, "0123456789a1": 20, "0123456789a2": 1}
    for digits, days in ages.items():
        scope = _plant_scope(store.root, f"{prefix}-{digits}", version, 1000)
        for name in ("manifest.json",):
            os.utime(scope / name, (now - days * 86400, now - days * 86400))
    old_torch = _plant_scope(store.root, key.replace("torch2.13.0", "torch2.11.0"), "2.11.0", 10)
    base = ["invalidate", "--root", str(store.root), "--json"]
    proc = store.run(*base, "--max-age", "14d", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["rows"]
    assert {r["scope"].rsplit("-", 1)[1] for r in rows} >= {"0123456789a0", "0123456789a1"}
    assert all(r["action"] == "would remove" for r in rows)
    assert (store.root / f"{prefix}-0123456789a0").exists()
    proc = store.run(*base, "--older-torch-than", "2.12", "--keep-latest", "10")
    rows = json.loads(proc.stdout)["rows"]
    assert [r["scope"] for r in rows] == [old_torch.name]
    assert rows[0]["reasons"] == [f"torch {_older(version, '2.11.0')} < 2.12"]  # from the key
    assert not old_torch.exists()
    table = store.run("invalidate", "--root", str(store.root), "--max-age", "14d")
    assert table.returncode == 0 and re.search(r"^removed +local +", table.stdout, re.M)
    assert not (store.root / f"{prefix}-0123456789a0").exists()
    assert (store.root / f"{prefix}-0123456789a2").exists()
    assert (store.root / key).exists()  # live lease and fresh: kept


def test_invalidate_needs_a_policy(store: Store) -> None:
    proc = store.run("invalidate", "--root", str(store.root))
    assert proc.returncode == 2 and "give at least one policy" in proc.stderr
    proc = store.run("invalidate", "--root", str(store.root), "--max-age", "fortnight")
    assert proc.returncode == 2 and "bad duration" in proc.stderr


def test_save_without_restore_is_a_usage_error(store: Store) -> None:
    proc = store.save(state="nothing.json")
    assert proc.returncode == 2 and "run 'fxcache restore' first" in proc.stderr


def _wait_for_spare(root: Path) -> Path:
    for _ in range(600):
        found = list((root / ".spares").glob("*")) if (root / ".spares").is_dir() else []
        if found:
            return found[0]
        time.sleep(0.1)
    raise AssertionError("no spare overlay was built")


def test_a_spare_overlay_is_taken_by_rename_and_checked_first(store: Store) -> None:
    state = saved_scope(store)
    expected = {k: v for k, v in tree_digest(state["scope_dir"]).items() if "/" in k}
    first = store.restore("--read-only", state="ro1.json")
    assert first["spare"] is False  # built the slow way; a spare is built behind it
    _wait_for_spare(store.root)
    second = store.restore("--read-only", state="ro2.json")
    assert second["spare"] is True  # (a refill may already stand in the spare's place)
    assert tree_digest(second["overlay_dir"]) == expected
    # A spare that differs from the manifest is never served: discarded, overlay built anew.
    write_files(_wait_for_spare(store.root), {"inductor/fxgraph/ev/il": b"planted"})
    third = store.restore("--read-only", state="ro3.json")
    assert third["spare"] is False and third["hit"]
    assert tree_digest(third["overlay_dir"]) == expected
