"""The one timestamp format of documents and notes: ISO 8601 in UTC, to the second, with a Z."""

from __future__ import annotations

from datetime import UTC, datetime

FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def utc_now() -> str:
    """Now, e.g. `2026-05-04T12:00:00Z`."""
    return datetime.now(UTC).strftime(FORMAT)


def age_s(stamp: str) -> float | None:
    """Seconds from `stamp` (this format) to now; None for a stamp of another form."""
    try:
        then = datetime.strptime(stamp, FORMAT).replace(tzinfo=UTC)
    except ValueError:
        return None
    return max(0.0, (datetime.now(UTC) - then).total_seconds())
