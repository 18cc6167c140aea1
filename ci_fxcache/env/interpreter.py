"""The target interpreter: the user's Python, whose torch fxcache serves but never imports."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from ci_fxcache import names
from ci_fxcache.env import snippets
from ci_fxcache.errors import UsageError


def resolve(python: str) -> str:
    """Absolute path of `python` (a path or a name on PATH); UsageError when there is none."""
    if os.sep in python:
        path = Path(python).expanduser()
        if not path.exists():
            raise UsageError(
                f"--python {python}: no such file; pass the interpreter that runs your "
                "torch.compile job (--python or FXCACHE_PYTHON)"
            )
        if not os.access(path, os.X_OK) or path.is_dir():
            raise UsageError(f"--python {python}: not an executable interpreter")
        return str(path.absolute())
    found = shutil.which(python)
    if found is None:
        raise UsageError(
            f"--python {python}: not found on PATH; pass the interpreter that runs your "
            "torch.compile job (--python or FXCACHE_PYTHON)"
        )
    return found


# Snippets run isolated (-I: no working directory or script directory on sys.path, no user
# site, no PYTHON* variables), so that nothing planted in the job's working directory (a
# json.py) runs inside fxcache; PYTHONPATH is put back as the job's own processes see it.
_ISOLATED_PREFIX = (
    "import os as _o, sys as _s; "
    "_s.path[0:0] = [p for p in _o.environ.get('PYTHONPATH', '').split(_o.pathsep) if p]; "
    "del _o, _s\n"
)


class Snippet:
    """Snippet `name` (with `args` as sys.argv[1:]) started in the target interpreter;
    `result()` waits for the JSON object it prints. The caller works meanwhile."""

    def __init__(
        self, python: str, name: str, timeout: float = 60.0, args: tuple[str, ...] = ()
    ) -> None:
        self._python, self._name, self._timeout = python, name, timeout
        try:
            self._proc = subprocess.Popen(
                [python, "-I", "-c", _ISOLATED_PREFIX + snippets.source(name), *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=names.without_secrets(),
            )
        except OSError as exc:
            raise UsageError(f"--python {python}: cannot run it ({exc.strerror})") from exc

    def result(self) -> dict[str, Any]:
        """The snippet's answer; UsageError when it fails, hangs or answers nonsense."""
        python, name = self._python, self._name
        try:
            stdout, stderr = self._proc.communicate(timeout=self._timeout)
        except subprocess.TimeoutExpired as exc:
            self._proc.kill()
            self._proc.communicate()
            raise UsageError(f"--python {python}: no answer within {self._timeout:.0f} s") from exc
        lines = stdout.strip().splitlines()
        if self._proc.returncode != 0 or not lines:
            last = (stderr.strip().splitlines() or ["no output"])[-1]
            code = self._proc.returncode
            raise UsageError(f"--python {python}: {name} failed (exit {code}): {last}")
        try:
            data = json.loads(lines[-1])
        except json.JSONDecodeError as exc:
            raise UsageError(f"--python {python}: is this a Python interpreter? ({exc})") from exc
        if not isinstance(data, dict):
            raise UsageError(f"--python {python}: unexpected answer from {name}")
        return data


def run_snippet(
    python: str, name: str, timeout: float = 60.0, args: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Run snippet `name` (with `args` as sys.argv[1:]) in the target interpreter and return
    the JSON object it prints."""
    return Snippet(python, name, timeout, args).result()
