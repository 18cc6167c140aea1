"""The job's history where the scope persists in GitHub's cache (issue 41, item 5): a runner
with an empty store root restores the scope from the GitHub tier (the strict cache-service
stand-in, tests/fake_cache_service.py) and shows the rows the first runner's job recorded."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fake_cache_service import FakeCacheService
from tests.test_job_stats import Job


@pytest.mark.slow
def test_the_history_survives_a_restore_on_an_empty_runner_from_the_github_cache(
    tmp_path: Path,
) -> None:
    with FakeCacheService() as fake:
        env = {**fake.env(), "GITHUB_RUN_ID": "1", "GITHUB_RUN_ATTEMPT": "1"}
        first = Job(tmp_path / "a", "first", env)
        first.restore("--store", "github")
        first.step()
        first.save()
        assert len(fake.committed()) == 1  # the scope, with the history in its entry records
        row = first.stats()["history"][-1]
        assert row["graphs"] == 2 and row["id"] != "current"

        # Another runner of a later run: its own, empty store root.
        empty = Job(tmp_path / "b", "second", {**env, "GITHUB_RUN_ID": "2"})
        assert not (tmp_path / "b" / "root").exists()
        empty.restore("--store", "github")
        # a job that compiled nothing adds no row (issue 47): the history is the first job's
        assert [r["id"] for r in empty.stats()["history"]] == [row["id"]]
        empty.step()
        history = empty.stats()["history"]
        assert [r["id"] for r in history] == [row["id"], "current"]
        assert history[0]["misses"]["new graph"] == 2
        assert fake.violations == []
