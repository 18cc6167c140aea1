"""`fxcache save` says the job's line only when the job's trace held something: a job whose
steps compiled nothing (the README's flow: the matrix, then the save) gets no "no trace" line;
`fxcache stats` (text and JSON) still says it."""

from __future__ import annotations

from pathlib import Path

from tests.test_job_stats import Job


def test_a_job_that_compiled_nothing_saves_without_a_job_line(tmp_path: Path) -> None:
    job = Job(tmp_path, "quiet")
    assert "TORCH_TRACE" in job.restore()
    saved = job.save()
    assert "fxcache: saved" in saved or "not saved" in saved, saved
    assert "your job" not in saved, saved
    figures = job.stats()
    assert sum(t["files"] for t in figures["trace"]) == 0 and figures["graphs"] == 0
    text = job.fxcache("stats", "--state-file", str(job.state)).stdout
    assert "your job: no trace of its compiles" in text, text
