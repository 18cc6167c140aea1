"""The job's own compiles at the action's save (ci_fxcache.jobstats): counted from the trace
restore set up, recorded in the scope only by a run that may write it, shown in the job
summary (the line, the detail collapsed, the scope's history)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ci_fxcache import gha
from ci_fxcache.action.settings import Settings
from ci_fxcache.jobstats.finish import at_save as _at_save
from ci_fxcache.jobstats.job import stats_file
from ci_fxcache.store.state_file import RestoreState


def figures_file(s: Settings) -> Path:
    """Where the save kept the job's figures."""
    return stats_file(s.state_file)


def at_save(
    s: Settings, state: RestoreState | None, may_write: bool, signing_key: str | None
) -> dict[str, Any] | None:
    """Finish the job's figures before the save commits the scope (None: no restore state);
    the history it records comes only from what was signed with the save's `signing_key`."""
    if state is None:
        return None
    return _at_save(state, s.state_file, may_record=may_write, signing_key=signing_key)


def verified_by(results: Path) -> frozenset[str]:
    """The mechanisms this job's matrix found safe (its results, read and checked as a report
    reads them); none when the job ran no matrix or its results cannot be read."""
    if not results.is_file():
        return frozenset()
    from ci_fxcache import report
    from ci_fxcache.errors import UsageError

    try:
        return report.safe_mechanisms(report.build(str(results))[1])
    except (UsageError, OSError, ValueError) as exc:
        gha.warn(f"the job summary gives no advice: {results} not read ({exc})")
        return frozenset()


def publish(doc: dict[str, Any] | None, results: Path) -> None:
    """The job summary's section (advice only for what the job's matrix in `results`
    verified) and the log line."""
    if doc is None:
        return
    from ci_fxcache.report import job_line
    from ci_fxcache.report.render import plain

    gha.append_summary(job_line.summary(doc, verified_by(results)))
    gha.print_untrusted(f"fxcache: {plain(job_line.headline(doc))}\n")
