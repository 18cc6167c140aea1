"""The action's restore step (`fxcache action restore`), apart from the other steps.

It runs on every job's critical path, and most of it waits on the job's interpreter reporting
its versions: so it starts that report as soon as setup's settings name the interpreter, and
imports the rest while the report runs (steps.py with the inputs' table took ~45 ms to import,
and the report started after it). commands/action.py runs it without importing steps.py.
"""

from __future__ import annotations

import time
from pathlib import Path


def restore() -> int:
    """The restore into the settings' root with setup's store choice (the typed call
    `fxcache restore` makes), read-only when setup decided so; the signing key, the Redis URL
    and setup's nonce as arguments."""
    from ci_fxcache.action.settings import load
    from ci_fxcache.env.pending_fingerprint import Pending

    s = load()
    taking = Pending(s.python, None)  # first: the interpreter reports while the rest imports
    started = time.monotonic()
    from ci_fxcache.action import inputs as inp
    from ci_fxcache.action import job_record
    from ci_fxcache.commands import restore as restore_command
    from ci_fxcache.store import trust

    values = inp.from_env(inp.MAIN)
    redis = s.choice.kind == "redis"
    restore_command.restore(
        taking=taking, root=Path(s.root),
        read_only_reason="--read-only" if s.read_only else trust.untrusted_reason(),
        invalidate_on_upgrade=bool(values["invalidate-on-upgrade"]), verify=None,
        overlay_strategy=None, as_json=False, state_file=s.state_file, choice=s.choice,
        redis_url=values["redis-url"] if redis else None,
        redis_writers_run_code=bool(redis and values["redis-writers-run-code"]),
        signing_key=values["signing-key"] or None, nonce=s.nonce,
        job_trace=bool(values["job-stats"]),
    )  # fmt: skip
    # restore and save run in different processes: the time goes through the job record
    job_record.update(Path(s.work), restore_s=round(time.monotonic() - started, 3))
    return 0
