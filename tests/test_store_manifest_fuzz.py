"""Issue 10 §2: whatever a manifest holds, restore never raises and never serves altered files.

A real manifest (written by `fxcache save` over real files) is mutated: values of other types,
deep nesting, other encodings, huge numbers and strings, byte-level damage. Each mutation is
restored in process on a fresh copy of the scope (the library entry point the CLI calls), and
the exact inputs from the issue run through the real CLI too.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ci_fxcache.env import fingerprint
from ci_fxcache.store import restore as store_restore
from ci_fxcache.store import scopes
from ci_fxcache.store.layout import CACHE_DIRS, Layout
from ci_fxcache.store.state_file import Restored
from tests.conftest import TORCH_PYTHON, RunFxcache, _clean_env
from tests.store_helpers import SAMPLE, Store, tree_digest, write_files

SIGNING_KEY = "team-secret"


def _saved_root(base: Path, signing_key: str | None) -> tuple[Path, str]:
    root = base / "root"
    env = _clean_env({"FXCACHE_SIGNING_KEY": signing_key} if signing_key else {})
    state_file = base / "state.json"
    common = [sys.executable, "-m", "ci_fxcache"]
    proc = subprocess.run(
        [*common, "restore", "--root", str(root), "--python", TORCH_PYTHON, "--json",
         "--state-file", str(state_file)],
        capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    state = json.loads(proc.stdout)
    write_files(state["scope_dir"], SAMPLE)
    subprocess.run(
        [*common, "save", "--state-file", str(state_file)],
        capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    return root, state["scope_key"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str | None, tuple[Path, str]]:
    return {key: _saved_root(tmp_path_factory.mktemp("saved"), key) for key in (None, SIGNING_KEY)}


@pytest.fixture(scope="module")
def fp() -> fingerprint.Fingerprint:
    return fingerprint.collect(TORCH_PYTHON)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path into a JSON document (the root excluded)."""
    found = []
    items: list[tuple[Any, Any]] = []
    if isinstance(node, dict):
        items = list(node.items())
    elif isinstance(node, list):
        items = list(enumerate(node))
    for key, child in items:
        found.append((*prefix, key))
        found.extend(_paths(child, (*prefix, key)))
    return found


def _parent(doc: Any, path: tuple[Any, ...]) -> Any:
    for key in path[:-1]:
        doc = doc[key]
    return doc


@st.composite
def mutated(draw: st.DrawFn, manifest: dict[str, Any]) -> bytes:
    """A damaged copy of `manifest`, as the bytes of a manifest file."""
    doc = json.loads(json.dumps(manifest))
    kind = draw(st.sampled_from(["replace", "delete", "nest", "huge", "bytes", "encoding"]))
    path = draw(st.sampled_from(_paths(doc)))
    parent = _parent(doc, path)
    if kind == "replace":
        parent[path[-1]] = draw(json_values)
    elif kind == "delete":
        del parent[path[-1]]
    elif kind == "nest":
        depth = draw(st.sampled_from([2, 50, 5000, 100_000]))
        text = json.dumps(doc)
        marker = json.dumps(parent[path[-1]])
        return text.replace(marker, "[" * depth + marker + "]" * depth, 1).encode()
    elif kind == "huge":
        huge = draw(st.sampled_from(["int", "str", "float"]))
        raw = {"int": "9" * 5000, "str": json.dumps("x" * 2_000_000), "float": "1e99999"}[huge]
        parent[path[-1]] = "@@HUGE@@"
        return json.dumps(doc).replace('"@@HUGE@@"', raw, 1).encode()
    elif kind == "encoding":
        parent[path[-1]] = draw(st.text(min_size=1, max_size=10))
        codec = draw(st.sampled_from(["utf-16", "latin-1", "utf-8-sig", "utf-32"]))
        return json.dumps(doc, ensure_ascii=False).encode(codec, "replace")
    data = bytearray(json.dumps(doc).encode())
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, len(data) - 1))
        data[pos] = draw(st.integers(0, 255))
    return bytes(data)


def _served(state: Restored) -> dict[str, str]:
    base = state.inductor_dir.parent
    return {
        f"{top}/{rel}": digest
        for top in CACHE_DIRS
        for rel, digest in tree_digest(base / top).items()
    }


@pytest.mark.parametrize("signing_key", [None, SIGNING_KEY], ids=["unsigned", "signed"])
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_any_manifest_content_is_a_hit_with_the_saved_files_or_a_quarantine(
    saved: dict[str | None, tuple[Path, str]],
    fp: fingerprint.Fingerprint,
    signing_key: str | None,
    data: st.DataObject,
) -> None:
    root, key = saved[signing_key]
    original = json.loads((root / key / "manifest.json").read_text())
    damaged = data.draw(mutated(original))
    expected = {
        rel: digest
        for top in CACHE_DIRS
        for rel, digest in tree_digest(root / key).items()
        if rel.startswith(top + "/")
    }
    work = Path(tempfile.mkdtemp(prefix="fxcache-fuzz-"))
    try:
        copy = work / "root"
        shutil.copytree(root / key, copy / key, symlinks=True)
        (copy / key / "manifest.json").chmod(0o644)
        (copy / key / "manifest.json").write_bytes(damaged)
        # A signing key means full verification (store.restore.full_verification).
        options = store_restore.Options(signing_key=signing_key, full_verify=bool(signing_key))
        state = store_restore.restore(Layout(copy), key, fp, options)  # must not raise
        if state.hit:
            served = _served(state)
            assert served, "a hit that serves nothing"
            for rel, digest in served.items():
                assert expected.get(rel) == digest, f"served {rel} differs from what was saved"
        else:
            assert _served(state) == {}
    finally:
        scopes.remove_tree(work)


@pytest.fixture
def store(tmp_path: Path, run_fxcache: RunFxcache) -> Store:
    return Store(root=tmp_path / "root", run=run_fxcache, env={})


def _deep(_manifest: dict[str, Any]) -> str:
    return "[" * 100_000 + "]" * 100_000


def _size_text(manifest: dict[str, Any]) -> str:
    next(iter(manifest["files"].values()))["size"] = "abc"
    return json.dumps(manifest)


def _size_null(manifest: dict[str, Any]) -> str:
    next(iter(manifest["files"].values()))["size"] = None
    return json.dumps(manifest)


def _signature_non_ascii(manifest: dict[str, Any]) -> str:
    manifest["signature"] = {"alg": "hmac-sha256", "value": "ünïcödé-✓"}
    return json.dumps(manifest, ensure_ascii=False)


@pytest.mark.parametrize("damage", [_deep, _size_text, _size_null, _signature_non_ascii])
def test_the_reported_manifests_are_quarantined_by_the_cli(store: Store, damage: Any) -> None:
    env = {"FXCACHE_SIGNING_KEY": SIGNING_KEY} if damage is _signature_non_ascii else {}
    state = store.restore(env=env)
    write_files(state["scope_dir"], SAMPLE)
    assert store.save(env=env).returncode == 0
    path = Path(state["scope_dir"]) / "manifest.json"
    path.write_text(damage(json.loads(path.read_text())), encoding="utf-8")
    after = store.restore(state="after.json", env=env)  # asserts exit 0
    assert after["hit"] is False and len(after["quarantined"]) == 1
    assert "Traceback" not in after["_stderr"]


def _fingerprint_null(manifest: dict[str, Any]) -> str:
    manifest["fingerprint"] = None
    return json.dumps(manifest)


def _unknown_field(manifest: dict[str, Any]) -> str:
    manifest["served_by"] = "someone else"
    return json.dumps(manifest)


def _duplicate_key(manifest: dict[str, Any]) -> str:
    text = json.dumps(manifest)
    assert text.endswith("}")
    return text[:-1] + ', "files": {}}'  # json keeps the last: an empty scope would be a hit


def _total_bytes_text(manifest: dict[str, Any]) -> str:
    manifest["total_bytes"] = "x"
    return json.dumps(manifest)


def _hmac_number(manifest: dict[str, Any]) -> str:
    manifest["hmac"] = 7
    return json.dumps(manifest)


def _entry_extra_field(manifest: dict[str, Any]) -> str:
    next(iter(manifest["files"].values()))["mode"] = 0o777
    return json.dumps(manifest)


@pytest.mark.parametrize(
    "damage",
    [_fingerprint_null, _unknown_field, _duplicate_key, _total_bytes_text, _hmac_number,
     _entry_extra_field],
)  # fmt: skip
def test_a_manifest_save_could_not_have_written_is_quarantined(store: Store, damage: Any) -> None:
    """Issue 23 §6: each of these was served as a hit; a manifest holds exactly the fields
    save writes, with their types, and no key twice."""
    state = store.restore()
    write_files(state["scope_dir"], SAMPLE)
    assert store.save().returncode == 0
    path = Path(state["scope_dir"]) / "manifest.json"
    path.write_text(damage(json.loads(path.read_text())), encoding="utf-8")
    after = store.restore(state="after.json")
    assert after["hit"] is False and len(after["quarantined"]) == 1, after["_stderr"]
    assert "Traceback" not in after["_stderr"]
