"""Stdlib-only scripts run inside the target interpreter (`--python`), never imported here."""

from __future__ import annotations

from importlib import resources


def source(name: str) -> str:
    """The source text of snippet `name` (without .py), for `python -c`."""
    return resources.files(__package__).joinpath(f"{name}.py").read_text(encoding="utf-8")
