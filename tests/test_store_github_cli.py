"""`fxcache restore --store github` works like `--store s3` (issue 39): the GitHub cache as the
remote tier of the command line, against the strict cache-service stand-in
(tests/fake_cache_service.py), the real CLI, store roots on this machine as runners."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.conftest import RunFxcache
from tests.fake_cache_service import FakeCacheService
from tests.store_helpers import SAMPLE, Store, tree_digest, write_files


def _runner(tmp_path: Path, name: str, run: RunFxcache, env: dict[str, str]) -> Store:
    root = tmp_path / name / "root"
    root.parent.mkdir(parents=True, exist_ok=True)
    return Store(root, run, env)


def _saved(store: Store) -> dict[str, Any]:
    proc = store.save()
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def test_restore_and_save_with_store_github_go_through_the_github_cache(
    tmp_path: Path, run_fxcache: RunFxcache
) -> None:
    with FakeCacheService() as fake:
        env = {**fake.env(), "GITHUB_RUN_ID": "1", "GITHUB_RUN_ATTEMPT": "1"}
        a = _runner(tmp_path, "a", run_fxcache, env)
        first = a.restore("--store", "github", "--key-suffix", "llama")
        assert first["remote"]["store"] == "github" and first["remote"]["found"] is False, first
        write_files(Path(first["inductor_dir"]).parent, SAMPLE)
        saved = _saved(a)
        assert saved["saved"] and saved["remote"]["published"], saved
        (entry,) = fake.committed()
        assert entry.key == f"{first['scope_key']}-llama-run1.1"

        # A fresh runner of a later run restores that entry and, adding nothing, saves none.
        b = _runner(tmp_path, "b", run_fxcache, {**env, "GITHUB_RUN_ID": "2"})
        got = b.restore("--store", "github", "--key-suffix", "llama")
        assert got["hit"] and got["files"] == len(SAMPLE) and got["remote"]["fetched"], got
        assert set(SAMPLE) <= set(tree_digest(got["scope_dir"]))
        again = _saved(b)
        assert again["remote"] == {"store": "github", "url": "the GitHub cache",
                                   "published": False,
                                   "reason": "this run added nothing to the cache"}  # fmt: skip
        # A run that may not write the remote reads it and uploads nothing.
        c = _runner(tmp_path, "c", run_fxcache, {**env, "GITHUB_RUN_ID": "3"})
        pr = c.restore("--store", "github", "--key-suffix", "llama", "--remote-read-only")
        assert pr["hit"] and pr["remote"]["read_only"], pr
        write_files(Path(pr["inductor_dir"]).parent, {"inductor/fxgraph/pr/new": b"x" * 50})
        assert "remote" not in _saved(c)
        assert len(fake.committed()) == 1 and fake.violations == []


def test_store_github_without_the_cache_service_is_one_warning_and_local_only(
    tmp_path: Path, run_fxcache: RunFxcache
) -> None:
    a = _runner(tmp_path, "a", run_fxcache, {"GITHUB_ACTIONS": "true"})
    got = a.restore("--store", "github")
    assert got["remote"]["error"] and not got["remote"]["fetched"], got
    (warning,) = [line for line in got["_stderr"].splitlines() if "warning" in line]
    assert "GitHub cache" in warning and "local store only" in warning, warning
    write_files(Path(got["inductor_dir"]).parent, SAMPLE)
    saved = _saved(a)
    assert saved["saved"] and saved["files"] == len(SAMPLE), saved
