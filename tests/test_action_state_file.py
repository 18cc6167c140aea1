"""Restore's state file is data, never a path oracle (issue 25 §2, issue 23 §6 item 4): a bad
one is refused with one line and exit 2, and nothing it names outside the store root is
written, chmod-ed or deleted."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import RunFxcache
from tests.store_helpers import SAMPLE, Store, write_files


@pytest.fixture
def store(tmp_path: Path, run_fxcache: RunFxcache) -> Store:
    return Store(root=tmp_path / "root", run=run_fxcache, env={})


def _one_line_usage_error(proc: Any) -> str:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    return str(lines[0])


def _restored(store: Store, state: str = "state.json", **env: str) -> tuple[Path, dict[str, Any]]:
    restored = store.restore(state=state, env=env or None)
    write_files(restored["scope_dir"], SAMPLE)
    path = store.root.parent / state
    return path, json.loads(path.read_text())


def test_a_directory_as_state_file_is_one_line(store: Store, tmp_path: Path) -> None:
    folder = tmp_path / "a-folder"
    folder.mkdir()
    line = _one_line_usage_error(store.run("save", "--state-file", str(folder)))
    assert "is a directory" in line
    restore = store.run("restore", "--root", str(store.root), "--state-file", str(folder))
    assert "is a directory" in _one_line_usage_error(restore)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"scope_key": 5, "root": 7}, "scope_key is not a string"),
        ({"lease": 3}, "lease is neither a string nor null"),
        ({"files": "many"}, "files is not a count"),
        ({"read_only": "no"}, "read_only is not true or false"),
        ({"scope_key": "../victim"}, "is not a scope key"),
    ],
)
def test_malformed_fields_are_one_line(store: Store, edit: dict[str, Any], message: str) -> None:
    path, state = _restored(store)
    path.write_text(json.dumps({**state, **edit}))
    line = _one_line_usage_error(store.run("save", "--state-file", str(path)))
    assert message in line, line


def test_deep_nesting_is_one_line(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    line = _one_line_usage_error(store.run("save", "--state-file", str(path)))
    assert "nested too deeply" in line


def test_a_scope_key_outside_the_root_writes_nothing_there(store: Store, tmp_path: Path) -> None:
    path, state = _restored(store)
    victim = tmp_path / "victim"
    write_files(victim, {"inductor/fxgraph/x/y": b"not ours"})
    state["scope_key"] = "../victim"
    path.write_text(json.dumps(state))
    _one_line_usage_error(store.run("save", "--state-file", str(path)))
    assert not (victim / "manifest.json").exists()
    assert os.access(victim / "inductor/fxgraph/x/y", os.W_OK)


@pytest.mark.parametrize("field", ["lease", "overlay_dir"])
def test_lease_and_overlay_paths_outside_the_root_are_never_deleted(
    store: Store, tmp_path: Path, field: str
) -> None:
    path, state = _restored(store)
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "data").write_text("keep me")
    target = precious / "data" if field == "lease" else precious
    state[field] = str(target)
    path.write_text(json.dumps(state))
    line = _one_line_usage_error(store.run("save", "--state-file", str(path)))
    assert "is not a" in line and ("lease" in line or "overlay" in line), line
    assert (precious / "data").read_text() == "keep me"
    # The same paths spelled with `..` from inside the root are refused as well.
    inside = store.root / ".leases" / state["scope_key"] / ".." / ".." / ".." / "precious"
    state[field] = str(inside / "data") if field == "lease" else str(inside)
    path.write_text(json.dumps(state))
    _one_line_usage_error(store.run("save", "--state-file", str(path)))
    assert (precious / "data").read_text() == "keep me"


def test_with_the_signing_key_save_takes_only_what_a_keyed_restore_wrote(store: Store) -> None:
    key = {"FXCACHE_SIGNING_KEY": "team-secret"}
    path, state = _restored(store, **key)
    assert state.get("mac"), "a keyed restore writes a MAC"
    edited = {**state, "mode": "overlay"}
    path.write_text(json.dumps(edited))
    line = _one_line_usage_error(store.save(env=key))
    assert "MAC does not match" in line
    path.write_text(json.dumps({k: v for k, v in state.items() if k != "mac"}))
    assert "carries no MAC" in _one_line_usage_error(store.save(env=key))
    path.write_text(json.dumps(state))
    saved = store.save(env=key)
    assert saved.returncode == 0 and json.loads(saved.stdout)["saved"] is True, saved.stderr


def test_the_state_is_one_frozen_type_read_back_as_written(store: Store) -> None:
    """Issue 39: restore writes the state through its type and every reader gets the same
    value back (`read_state`), MAC and nonce included; the value cannot be edited."""
    import dataclasses

    from ci_fxcache.store import state_file

    path, raw = _restored(store, "keyed.json", FXCACHE_SIGNING_KEY="k" * 32)
    assert raw["schema"] == state_file.SCHEMA and raw["mac"] and raw["nonce"] is None
    state = state_file.read_state(path, store.root, "k" * 32)
    assert state.to_json() == {k: v for k, v in raw.items() if k != "mac"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.hit = True  # type: ignore[misc]
    # A writer with the nonce: the reader gets it back, under the same MAC.
    again = dataclasses.replace(state, nonce="setup-nonce", state_file=path.with_name("n.json"))
    state_file.write_state(again, "k" * 32)
    assert state_file.read_state(path.with_name("n.json"), store.root, "k" * 32) == again


def test_a_state_of_another_schema_version_is_refused_in_one_line(store: Store) -> None:
    path, state = _restored(store)
    path.write_text(json.dumps({**state, "schema": "fxcache-cache-state/2"}))
    line = _one_line_usage_error(store.run("save", "--state-file", str(path)))
    assert "fxcache-cache-state/2" in line and "restore again" in line, line


def test_a_state_as_the_previous_release_wrote_it_is_still_read(tmp_path: Path) -> None:
    """The on-disk version is unchanged (fxcache-cache-state/1): a cold fallback's state as
    the previous release wrote it (without the fields it never had) reads as a type."""
    from ci_fxcache.store import state_file

    root, base = tmp_path / "root", tmp_path / "cold"
    key = "fxcache-v1-linux-x86_64-cp311-torch2.13.0-cpu-abc123def456"
    old = {
        "schema": "fxcache-cache-state/1", "store": "local", "root": str(root),
        "scope_key": key, "hit": False, "read_only": True,
        "read_only_reason": "store unusable: disk full", "mode": "cold-fallback",
        "scope_dir": str(root / key), "inductor_dir": str(base / "inductor"),
        "triton_dir": str(base / "triton"), "verify_dir": str(base / "verify"),
        "overlay_dir": str(base), "spare": False, "files": 0, "bytes": 0, "invalidated": [],
        "set_aside": None, "quarantined": [], "lease": None, "fingerprint": {},
        "redis": None, "state_file": str(tmp_path / "s.json"), "nonce": None,
    }  # fmt: skip
    (tmp_path / "s.json").write_text(json.dumps(old))
    state = state_file.read_state(tmp_path / "s.json", root)
    assert (
        state.read_only
        and state.mode == "cold-fallback"
        and state.inductor_dir == base / "inductor"
    )
    assert state.remote_use is None and state.verify_mode is None
