"""A fingerprint being taken, started before almost anything is imported.

`fxcache restore` runs on every job's critical path: it starts the target interpreter reading
its versions first, and imports the rest of the toolkit (the fingerprint's dataclasses, the
store) while that process answers. So this module imports only what starting it needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ci_fxcache.env import interpreter

if TYPE_CHECKING:
    from ci_fxcache.env.fingerprint import Fingerprint


class Pending:
    """The target interpreter reads its versions in a process of its own while this one
    detects GPUs (nvidia-smi can take longer than the interpreter) and whatever else the
    caller does before `result()`."""

    def __init__(self, python: str, salt: str | None = None) -> None:
        self._python, self._salt = python, salt
        self._versions = interpreter.Snippet(interpreter.resolve(python), "read_versions")

    def result(self) -> Fingerprint:
        """The fingerprint (UsageError when the interpreter or its torch is unusable)."""
        from ci_fxcache.env import fingerprint, gpus

        inventory = gpus.detect()
        salt = fingerprint.default_salt() if self._salt is None else self._salt
        report = self._versions.result()
        return fingerprint.from_interpreter_report(report, self._python, inventory, salt)
