"""The target interpreter: the user's Python, whose torch fxcache serves but never imports."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from ci_fxcache.env import snippets
from ci_fxcache.errors import UsageError

PYTHON_ENV = "FXCACHE_PYTHON"  # the interpreter every command serves by default


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


def run_snippet(
    python: str, name: str, timeout: float = 60.0, args: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Run snippet `name` (with `args` as sys.argv[1:]) in the target interpreter and return
    the JSON object it prints."""
    try:
        proc = subprocess.run(
            [python, "-c", snippets.source(name), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise UsageError(f"--python {python}: no answer within {timeout:.0f} s") from exc
    except OSError as exc:
        raise UsageError(f"--python {python}: cannot run it ({exc.strerror})") from exc
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise UsageError(f"--python {python}: {name} failed (exit {proc.returncode}): {last}")
    try:
        data = json.loads(lines[-1])
    except json.JSONDecodeError as exc:
        raise UsageError(f"--python {python}: is this a Python interpreter? ({exc})") from exc
    if not isinstance(data, dict):
        raise UsageError(f"--python {python}: unexpected answer from {name}")
    return data
