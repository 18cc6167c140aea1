"""Presence checks for the torch options the worker uses, on whatever torch the user has.

Which release has which option is decided in one place, `ci_fxcache/env/torch_support.py`;
the orchestrator skips what the installed version lacks. The worker checks presence as well,
so a build that differs from its release fails with a clear message (a required option) or
carries on without it and says so in a note (an optional one) instead of crashing.
"""

from __future__ import annotations

from typing import Any

NOTE_KIND = "torch-option-missing"


class MissingOption(RuntimeError):
    """A torch option this combination cannot run without is missing."""


def set_option(module: Any, name: str, value: Any) -> None:
    """Set a torch config option; a missing one is fine only when `value` switches it off."""
    if hasattr(module, name):
        setattr(module, name, value)
    elif value:
        raise MissingOption(f"this torch has no {module.__name__}.{name}")


def require(owner: Any, name: str) -> Any:
    """`owner.name`, or a clear MissingOption."""
    value = getattr(owner, name, None)
    if value is None:
        raise MissingOption(f"this torch has no {getattr(owner, '__name__', owner)}.{name}")
    return value


def note(result: dict[str, Any], text: str) -> None:
    """Record an option the phase did without (the results' `notes`)."""
    result.setdefault("notes", []).append({"kind": NOTE_KIND, "text": text})
