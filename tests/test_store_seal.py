"""Seals (store/seal.py) and the parallel stat batch (store/stat_batch.py), with real files.

A seal lets the integrity check stat a directory instead of listing it when its inode and
ctime are what a clean check recorded. Every test here tampers with a sealed scope and checks
that the seal hides nothing a full listing would have found.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ci_fxcache.store import forked, overlay, seal, stat_batch
from ci_fxcache.store import manifest as mf
from ci_fxcache.store import restore as store_restore
from ci_fxcache.store.layout import CACHE_DIRS, Layout
from tests.conftest import RunFxcache
from tests.store_helpers import SAMPLE, Store, write_files

KEY = "fxcache-v1-linux-x86_64-cp311-torch2.13.0+cpu-cpu-000000000000"
FILES = {
    **SAMPLE,
    "inductor/fxgraph/ef/entry3": b"graph-three" * 10,
    "inductor/fxgraph/ef/entry4": b"graph-four" * 10,
    "triton/OTHERHASH/kernel.json": b"{}",
}


def _manifest(scope: Path) -> tuple[dict[str, Any], str]:
    files, problems = mf.scan(scope)
    assert not problems
    entries = mf.file_entries(scope, files)
    manifest = {
        "schema": mf.SCHEMA, "scope_key": KEY, "fingerprint": {}, "torch_paths": [],
        "created_at": "", "updated_at": "", "last_used_at": "",
        "verification": {"references": []}, "files": entries,
        "total_bytes": sum(e["size"] for e in entries.values()),
    }  # fmt: skip
    return manifest, mf.write_atomic(scope / "manifest.json", manifest, scope.parent)


def _sealed_scope(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Layout, dict, seal.Seal]:
    """A scope, its manifest, and a seal of every directory written by a clean check. The
    ctime margin is 0 here (the directories were just made); test_margin_* covers it."""
    monkeypatch.setattr(seal, "MARGIN_NS", 0)
    layout = Layout(tmp_path / "root")
    scope = layout.scope(KEY)
    write_files(scope, FILES)
    for top in CACHE_DIRS:  # as restore leaves a scope
        (scope / top).mkdir(exist_ok=True)
    manifest, digest = _manifest(scope)
    found = mf.inspect(scope, manifest, False)
    assert found.problems == [] and found.listed_dirs == len(found.dir_stamps) > 5
    time.sleep(0.01)  # past the ctime tick of the last change
    listed = mf.listed(manifest)
    seal.refresh(layout, KEY, digest, found.dir_stamps, time.time_ns(), seal.NONE, listed, False)
    sealed = seal.load(layout, KEY, digest)
    assert sealed == seal.Seal(stat_batch.Dirs.of(found.dir_stamps), listed, False)
    return layout, manifest, sealed


def _kinds(layout: Layout, manifest: dict, sealed: seal.Seal) -> set[tuple[str, str]]:
    found = mf.inspect(layout.scope(KEY), manifest, False, sealed.dirs)
    return {(p.kind, p.path) for p in found.problems}


def _quick(layout: Layout, sealed: seal.Seal) -> mf.Inspection | None:
    """The check from the seal alone (what a restore tries before parsing the manifest)."""
    assert sealed.listed is not None
    return mf.inspect_listed(layout.scope(KEY), sealed.listed, sealed.dirs)


def _calls(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> list[str]:
    """The argument (as text) of every call of owner.name from now on (which still runs)."""
    calls: list[str] = []
    real = getattr(owner, name)
    monkeypatch.setattr(owner, name, lambda arg: calls.append(str(arg)) or real(arg))
    return calls


def test_a_sealed_scope_is_checked_without_listing_a_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout, manifest, sealed = _sealed_scope(tmp_path, monkeypatch)
    listed = _calls(monkeypatch, os, "scandir")
    found = mf.inspect(layout.scope(KEY), manifest, False, sealed.dirs)
    assert found.problems == [] and found.listed_dirs == 0
    assert listed == [str(layout.scope(KEY))]  # the scope's top level only
    listed.clear()
    quick = _quick(layout, sealed)
    assert quick is not None and quick.problems == [] and quick.listed_dirs == 0
    assert quick.dir_stamps == {} and listed == [str(layout.scope(KEY))]  # nothing listed
    # A full verification ignores the seal: every directory is listed and every file hashed.
    listed.clear()
    full = mf.inspect(layout.scope(KEY), manifest, True, sealed.dirs)
    assert full.problems == [] and full.listed_dirs == len(sealed.dirs.names)


def test_a_restore_of_a_clean_sealed_scope_does_not_parse_the_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout, manifest, _sealed = _sealed_scope(tmp_path, monkeypatch)
    parsed = _calls(monkeypatch, mf, "parse")
    reason, problems, contents, unsaved = store_restore._problem_of(
        layout, KEY, store_restore.Options()
    )
    assert (reason, problems, unsaved, len(parsed)) == (None, [], [], 0)
    sizes = [meta["size"] for meta in manifest["files"].values()]
    assert contents == store_restore._Contents(list(manifest["files"]), sum(sizes), False)
    # Full verification (what a signing key implies) never takes the seal's word.
    reason = store_restore._problem_of(layout, KEY, store_restore.Options(full_verify=True))[0]
    assert reason is None and len(parsed) == 1
    # A truncated file with its mtime put back: the seal hands over to the manifest.
    path = layout.scope(KEY) / "inductor/fxgraph/ef/entry4"
    before = path.stat()
    os.chmod(path, 0o644)
    path.write_bytes(b"short")
    _reset_times(path, before)
    reason, problems, contents, _ = store_restore._problem_of(layout, KEY, store_restore.Options())
    assert reason == "1 integrity problem(s): truncated" and contents is None
    assert len(parsed) == 2


def _reset_times(path: Path, before: os.stat_result) -> None:
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


@pytest.mark.parametrize(
    ("tamper", "expected"),
    [
        ("planted", {("unexpected", "inductor/fxgraph/ab/planted")}),
        ("planted-new-dir", {("unexpected", "inductor/fxgraph/ab/new/planted")}),
        ("planted-deep-new-dirs", {("unexpected", "triton/NEW/a/b/planted")}),
        ("deleted", {("missing", "inductor/fxgraph/ef/entry3")}),
        ("truncated", {("truncated", "inductor/fxgraph/ef/entry4")}),
        ("dir-to-symlink", {("symlink", "inductor/fxgraph/ef")}),
        ("top-to-symlink", {("symlink", "triton")}),
        ("file-to-symlink", {("symlink", "inductor/fxgraph/ef/entry3")}),
        ("fifo", {("unexpected", "inductor/aotautograd/cd/fifo")}),
    ],
)
def test_a_seal_hides_nothing_even_with_directory_mtimes_put_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tamper: str, expected: set
) -> None:
    """Each tamper puts every touched directory's mtime back; ctime still moves."""
    layout, manifest, sealed = _sealed_scope(tmp_path, monkeypatch)
    scope = layout.scope(KEY)
    touched = [scope / "inductor/fxgraph/ab", scope / "inductor/fxgraph/ef", scope / "triton"]
    touched += [scope / "inductor/fxgraph", scope / "inductor/aotautograd/cd"]
    before = {p: p.stat() for p in touched}
    elsewhere = tmp_path / "elsewhere"
    if tamper == "planted":
        write_files(scope, {"inductor/fxgraph/ab/planted": b"evil"})
    elif tamper == "planted-new-dir":
        write_files(scope, {"inductor/fxgraph/ab/new/planted": b"evil"})
    elif tamper == "planted-deep-new-dirs":
        write_files(scope, {"triton/NEW/a/b/planted": b"evil"})
    elif tamper == "deleted":
        (scope / "inductor/fxgraph/ef/entry3").unlink()
    elif tamper == "truncated":
        path = scope / "inductor/fxgraph/ef/entry4"
        st_before = path.stat()
        path.write_bytes(path.read_bytes()[:-3])
        _reset_times(path, st_before)
    elif tamper == "dir-to-symlink":
        os.rename(scope / "inductor/fxgraph/ef", elsewhere)
        (scope / "inductor/fxgraph/ef").symlink_to(elsewhere)
    elif tamper == "top-to-symlink":
        os.rename(scope / "triton", elsewhere)
        (scope / "triton").symlink_to(elsewhere)
    elif tamper == "file-to-symlink":
        os.rename(scope / "inductor/fxgraph/ef/entry3", elsewhere)
        (scope / "inductor/fxgraph/ef/entry3").symlink_to(elsewhere)
    elif tamper == "fifo":
        os.mkfifo(scope / "inductor/aotautograd/cd/fifo")
    for path, st_before in before.items():
        if path.exists() and not path.is_symlink():
            _reset_times(path, st_before)
            assert path.stat().st_mtime_ns == st_before.st_mtime_ns
    problems = _kinds(layout, manifest, sealed)
    assert expected <= problems, problems
    # The same answer as a check without the seal (kinds and paths, not order).
    assert problems == {(p.kind, p.path) for p in mf.check(scope, manifest, False)}
    # The check from the seal alone never calls a tampered scope clean: it hands over to the
    # manifest, which says what is wrong (above).
    assert _quick(layout, sealed) is None


def test_a_moved_mtime_sends_the_check_back_to_the_manifest_which_rehashes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file whose mtime moved but whose content did not is not a problem (the manifest's
    sha256 says so); the seal alone cannot tell, so it does not decide."""
    layout, manifest, sealed = _sealed_scope(tmp_path, monkeypatch)
    os.utime(layout.scope(KEY) / "inductor/fxgraph/ef/entry3", ns=(0, 0))
    assert _quick(layout, sealed) is None
    assert _kinds(layout, manifest, sealed) == set()


def test_margin_a_directory_changed_just_before_a_check_is_not_sealed_nor_its_ancestors(
    tmp_path: Path,
) -> None:
    """ctime has a coarse clock: a directory changed in the same tick as the check may change
    again unseen, so it is listed next time, and so are its ancestors (a directory that is not
    sealed is only found by listing its parent)."""
    layout = Layout(tmp_path / "root")
    scope = layout.scope(KEY)
    write_files(scope, FILES)
    manifest, digest = _manifest(scope)
    time.sleep(0.05)
    write_files(scope, {"inductor/fxgraph/ab/late": b"x"})  # ab changes, fxgraph does not
    manifest, digest = _manifest(scope)
    found = mf.inspect(scope, manifest, False)
    assert found.problems == []
    young = found.dir_stamps["inductor/fxgraph/ab"][1]
    assert found.dir_stamps["inductor/fxgraph"][1] < young  # the parent is older
    # The check began within the margin of ab's change.
    seal.refresh(
        layout, KEY, digest, found.dir_stamps, young + seal.MARGIN_NS - 1, seal.NONE,
        mf.listed(manifest), False,
    )  # fmt: skip
    sealed = seal.load(layout, KEY, digest)
    names = sealed.dirs.names
    assert "inductor/fxgraph/ab" not in names
    assert "inductor/fxgraph" not in names and "inductor" not in names
    assert "inductor/aotautograd/cd" in names and "triton" in names
    # ab changes again in the same tick (simulated: its ctime is not compared at all): the
    # next check still lists it, through its unsealed ancestors.
    write_files(scope, {"inductor/fxgraph/ab/later": b"y"})
    assert ("unexpected", "inductor/fxgraph/ab/later") in _kinds(layout, manifest, sealed)
    assert _quick(layout, sealed) is None


def test_a_seal_belongs_to_one_manifest_and_one_scope_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = _sealed_scope(tmp_path, monkeypatch)[0]
    digest = json.loads(layout.seal(KEY).read_text())["manifest_sha256"]
    assert seal.load(layout, KEY, "0" * 64) == seal.NONE
    # The same files copied to a new scope directory (a restore from an archive, a quarantine
    # and a new scope): another inode, so the seal no longer applies.
    scope = layout.scope(KEY)
    os.rename(scope, tmp_path / "moved")
    write_files(scope, FILES)
    assert seal.load(layout, KEY, digest) == seal.NONE


_SEAL_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=12,
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    field=st.sampled_from(
        ["schema", "scope", "dirs", "inodes", "ctimes", "files", "sizes", "mtimes", "signed", None]
    ),
    value=_SEAL_VALUE,
)
def test_any_seal_content_is_ignored_or_valid_never_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, field: str | None, value: object
) -> None:
    layout, manifest, _sealed = _sealed_scope(tmp_path / str(time.monotonic_ns()), monkeypatch)
    path = layout.seal(KEY)
    data = json.loads(path.read_text())
    digest = data["manifest_sha256"]
    if field is None:
        path.write_text(json.dumps(value))
    else:
        data[field] = value
        path.write_text(json.dumps(data))
    loaded = seal.load(layout, KEY, digest)
    assert isinstance(loaded, seal.Seal)
    names, inodes, ctimes = loaded.dirs
    assert len(names) == len(inodes) == len(ctimes) and all(isinstance(n, str) for n in names)
    assert all(isinstance(i, int) for i in inodes + ctimes)
    write_files(layout.scope(KEY), {"inductor/fxgraph/ab/planted": b"evil"})
    assert ("unexpected", "inductor/fxgraph/ab/planted") in _kinds(layout, manifest, loaded)
    if loaded.listed is not None:
        assert _quick(layout, loaded) is None


def test_a_seal_naming_directories_outside_the_scope_lists_none_of_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout, manifest, sealed = _sealed_scope(tmp_path, monkeypatch)
    outside = tmp_path / "outside"
    write_files(outside, {"secret": b"s"})
    names, inodes, ctimes = sealed.dirs
    hostile = stat_batch.Dirs(
        [*names, "../../outside", "inductor/../../../outside"], [*inodes, 0, 0], [*ctimes, 0, 0]
    )
    assert _kinds(layout, manifest, seal.Seal(hostile)) == set()


def test_a_seal_whose_file_list_leaves_the_scope_never_places_a_file_outside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forged seal naming a file outside the scope, with that file's true size and mtime
    (every stat matches): the in-place check only stats it, and an overlay built from the
    restore's contents skips it (store.overlay.build), so nothing lands outside."""
    layout, manifest, sealed = _sealed_scope(tmp_path, monkeypatch)
    outside = tmp_path / "outside"
    outside.write_bytes(b"not ours")
    st_ = outside.stat()
    assert sealed.listed is not None
    names, sizes, mtimes = sealed.listed
    hostile = seal.Seal(
        sealed.dirs,
        mf.Listed([*names, "inductor/../../../outside"], [*sizes, st_.st_size],
                  [*mtimes, st_.st_mtime_ns]),
        False,
    )  # fmt: skip
    digest = json.loads(layout.seal(KEY).read_text())["manifest_sha256"]
    seal.write(layout, KEY, digest, hostile)
    contents = store_restore._problem_of(layout, KEY, store_restore.Options())[2]
    assert contents is not None and "inductor/../../../outside" in contents.files
    target = tmp_path / "a" / "b" / "overlay"
    overlay.build(layout.scope(KEY), sorted(contents.files), target, "hardlink")
    assert not (tmp_path / "a" / "outside").exists()  # where the name leads from the overlay
    assert outside.read_bytes() == b"not ours"
    assert sorted(
        os.path.relpath(os.path.join(top, name), target)
        for top, _dirs, found in os.walk(target)
        for name in found
    ) == sorted(manifest["files"])


class _Tree(NamedTuple):
    """50 directories (first), then `count` files spread over them, and their stamps."""

    paths: list[str]
    dirs: int
    firsts: list[int]
    seconds: list[int]

    def mismatches(self) -> list[int]:
        return stat_batch.mismatches(self.paths, self.dirs, self.firsts, self.seconds)


def _tree(tmp_path: Path, count: int) -> _Tree:
    files = []
    for i in range(count):
        path = tmp_path / f"d{i % 50}" / f"f{i}"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"x" * (i % 7))
        files.append(path)
    dirs = [tmp_path / f"d{i}" for i in range(50)]
    stats = [p.lstat() for p in dirs] + [p.lstat() for p in files]
    return _Tree(
        [str(p) for p in dirs + files],
        len(dirs),
        [st.st_ino for st in stats[:50]] + [st.st_size for st in stats[50:]],
        [st.st_ctime_ns for st in stats[:50]] + [st.st_mtime_ns for st in stats[50:]],
    )


def _allow_forks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fork for small batches too; and although pytest-xdist's worker runs an I/O thread
    (the batch then stays in one process), the children here only stat and write a pipe."""
    monkeypatch.setattr(stat_batch, "_MIN_PER_WORKER", 1)
    monkeypatch.setattr(forked.threading, "active_count", lambda: 1)


def test_the_stat_batch_finds_the_same_mismatches_in_any_number_of_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = _tree(tmp_path, 600)
    time.sleep(0.02)  # past the ctime tick of the tree's last change
    paths = tree.paths
    Path(paths[50 + 3]).write_bytes(b"longer than before")  # size
    os.utime(paths[50 + 100], ns=(0, 0))  # mtime
    Path(paths[50 + 200]).unlink()  # gone (and its directory d0, index 0, changed)
    Path(paths[50 + 300]).unlink()  # a file replaced by a directory (in d0 too)
    Path(paths[50 + 300]).mkdir()
    tree.firsts[7] += 1  # a directory that is another inode than the one sealed
    (Path(paths[49]) / "new").write_bytes(b"")  # a directory's ctime moves
    # A file replaced by a symlink of the same size and mtime (the type alone gives it away;
    # its directory d10's ctime too).
    assert tree.firsts[50 + 10] == 3
    Path(paths[50 + 10]).unlink()
    os.symlink("xyz", paths[50 + 10])
    os.utime(paths[50 + 10], ns=(0, tree.seconds[50 + 10]), follow_symlinks=False)
    expected = [0, 7, 10, 49, 53, 60, 150, 250, 350]
    assert tree.mismatches() == expected  # one process: below the minimum
    _allow_forks(monkeypatch)
    monkeypatch.setattr(forked, "MAX_WORKERS", 4)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(4)), raising=False)
    forks = []
    real_fork = os.fork
    monkeypatch.setattr(os, "fork", lambda: forks.append(1) or real_fork())
    assert tree.mismatches() == expected
    assert len(forks) == 3


@pytest.mark.parametrize("failure", ["crash", "garbage", "out-of-share"])
def test_a_failed_stat_child_is_made_up_for_by_the_parent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    tree = _tree(tmp_path, 200)
    for i in (1, 2, 150):
        os.utime(tree.paths[50 + i], ns=(0, 0))
    _allow_forks(monkeypatch)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1}, raising=False)
    parent = os.getpid()
    real_dumps = json.dumps

    def dumps(found: object) -> str:
        if os.getpid() == parent:
            return real_dumps(found)
        if failure == "crash":
            raise RuntimeError("child dies")
        return "not json" if failure == "garbage" else real_dumps([0])

    monkeypatch.setattr(forked.json, "dumps", dumps)
    assert tree.mismatches() == [51, 52, 200]


def test_in_place_restores_seal_the_scope_and_still_set_aside_a_planted_file(
    store: Store,
) -> None:
    """End to end with real restores and saves: the seal is written once directories are
    older than the margin, used by the next restore, and a file planted in a sealed
    directory whose mtime is put back is found (unsaved: set aside, never served)."""
    write_files(store.restore()["scope_dir"], SAMPLE)
    assert store.save().returncode == 0
    time.sleep(seal.MARGIN_NS / 1e9 + 0.1)
    state = store.restore()
    key = state["scope_key"]
    assert store.save().returncode == 0
    sealed_dirs = json.loads(Layout(store.root).seal(key).read_text())["dirs"]
    assert "inductor/fxgraph/ab" in sealed_dirs
    leaf = store.root / key / "inductor/fxgraph/ab"
    before = leaf.stat()
    write_files(leaf, {"planted": b"evil"})
    _reset_times(leaf, before)
    state = store.restore()
    assert state["hit"] and state["set_aside"] and state["set_aside"]["files"] == 1
    assert not (leaf / "planted").exists()
    assert "unsaved file(s)" in state["_stderr"]


def test_a_restore_from_the_seal_reports_what_the_manifest_would(store: Store) -> None:
    """The state a restore reports (hit, files, bytes, signed, mode) is the same whether the
    seal vouched for the scope or the manifest was parsed (seal removed)."""
    write_files(store.restore()["scope_dir"], SAMPLE)
    assert store.save().returncode == 0
    time.sleep(seal.MARGIN_NS / 1e9 + 0.1)
    key = store.restore()["scope_key"]
    assert store.save().returncode == 0
    layout = Layout(store.root)
    assert json.loads(layout.seal(key).read_text())["files"] == sorted(SAMPLE)
    fields = ("hit", "files", "bytes", "signed", "mode", "set_aside", "quarantined")
    from_seal = store.restore()
    assert store.save().returncode == 0
    layout.seal(key).unlink()
    from_manifest = store.restore()
    assert [from_seal[k] for k in fields] == [from_manifest[k] for k in fields]
    assert from_seal["files"] == len(SAMPLE) and from_seal["bytes"] == sum(
        len(body) for body in SAMPLE.values()
    )


@pytest.fixture
def store(tmp_path: Path, run_fxcache: RunFxcache) -> Store:
    return Store(root=tmp_path / "root", run=run_fxcache, env={})


def test_invalidate_prunes_the_seals_of_scopes_removed_by_hand(store: Store) -> None:
    key = store.restore()["scope_key"]
    assert store.save().returncode == 0
    layout = Layout(store.root)
    gone = key.replace("037d", "0000") if "037d" in key else key + "0"
    for name in (key, gone):
        layout.seal(name).parent.mkdir(parents=True, exist_ok=True)
        layout.seal(name).write_text("{}")
    proc = store.run("invalidate", "--root", str(store.root), "--max-age", "3650d", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["seals_removed"] == 1
    assert layout.seal(key).exists() and not layout.seal(gone).exists()
