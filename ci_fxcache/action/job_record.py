"""What the action's steps hand each other about the job, in one typed, versioned record.

The steps run in separate processes (restore and verify in the main step, the save in a save
sub-action or the post step), so what one learns and a later one needs goes through the job's
work directory. It used to be a file per fact (`timings.json`, `verify-rc`, `saved.json`),
each with its own reader; now it is one record, `<work>/job.json`, written and read only here
(as the restore state is by store/state_file.py). A step changes it with `update`, which reads
it, replaces the fields it names and writes it back atomically.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ci_fxcache.errors import UsageError

SCHEMA = "fxcache-action-job/1"
FILE = "job.json"


@dataclass(frozen=True, kw_only=True)
class JobRecord:
    """The job as the action's steps know it so far."""

    restore_s: float | None = None  # the restore step's time
    save_s: float | None = None  # the save's time
    verify_rc: int | None = None  # verify's deferred fail-on status (the conclude step fails)
    saved: bool | None = None  # None: not saved yet in this job (the job is saved once)
    schema: str = SCHEMA

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> JobRecord:
        """The record in `text`; ValueError when it is not one (another schema, a field of the
        wrong type, a field this version does not know)."""
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise ValueError(f"not an {SCHEMA} record")
        known = {f.name for f in dataclasses.fields(cls)}
        if set(data) - known:
            raise ValueError(f"unknown fields {sorted(set(data) - known)}")
        record = cls(**data)
        record._check()
        return record

    def _check(self) -> None:
        for name in ("restore_s", "save_s"):
            if not _optional(getattr(self, name), (int, float)):
                raise ValueError(f"{name} is not a number")
        if not _optional(self.verify_rc, (int,)):
            raise ValueError("verify_rc is not a whole number")
        if not _optional(self.saved, (bool,)):
            raise ValueError("saved is not true or false")

    @classmethod
    def read(cls, work: Path) -> JobRecord:
        """The record in the work directory `work`; an empty one when there is none yet;
        UsageError (one line, exit 2) when the file is not such a record."""
        try:
            return cls.from_json((work / FILE).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return cls()
        except (ValueError, TypeError, RecursionError) as exc:
            raise UsageError(f"{work / FILE}: not the job's record ({exc})") from None

    def write(self, work: Path) -> None:
        """Write the record atomically (the post step may read it while a step writes)."""
        tmp = work / f".{FILE}.{os.getpid()}.tmp"
        tmp.write_text(self.to_json(), encoding="utf-8")
        os.replace(tmp, work / FILE)

    @property
    def timings(self) -> dict[str, float]:
        """The steps' times known so far, for the job's cache stats."""
        found = {"restore_s": self.restore_s, "save_s": self.save_s}
        return {k: float(v) for k, v in found.items() if v is not None}


def update(work: Path, **changes: Any) -> JobRecord:
    """The record with `changes`, written back; the new record."""
    record = dataclasses.replace(JobRecord.read(work), **changes)
    record._check()
    record.write(work)
    return record


def _optional(value: Any, types: tuple[type, ...]) -> bool:
    if value is None:
        return True
    if isinstance(value, bool) and bool not in types:
        return False
    return isinstance(value, types)
