"""Release notes for one version: its section of CHANGELOG.md (Keep a Changelog form).

    release_notes.py VERSION [CHANGELOG]   (VERSION as 1.0.0; a leading v is dropped)

Prints the body under the heading `## [VERSION] - YYYY-MM-DD` up to the next `## ` heading,
without the link definitions (`[1.0.0]: https://...`) Keep a Changelog puts at the end. A
version with no section, or an empty one, is one line on stderr and exit 2: the release
workflow stops before anything is published.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HEADING = re.compile(r"^## \[(?P<version>[^\]]+)\](?: - (?P<date>\d{4}-\d{2}-\d{2}))?\s*$")
LINK_DEFINITION = re.compile(r"^\[[^\]]+\]: \S+\s*$")


def section(changelog: str, version: str) -> str:
    """The notes of `version` (stripped); ValueError when it has no dated, non-empty section."""
    version = version.removeprefix("v")
    lines: list[str] | None = None
    for line in changelog.splitlines():
        match = HEADING.match(line)
        if lines is not None and (match or line.startswith("## ")):
            break
        if match and match["version"] == version:
            if not match["date"]:
                raise ValueError(f"CHANGELOG.md: [{version}] has no release date")
            lines = []
        elif lines is not None and not LINK_DEFINITION.match(line):
            lines.append(line)
    body = "\n".join(lines or []).strip()
    if not body:
        raise ValueError(f"CHANGELOG.md has no notes for version {version}")
    return body


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print("usage: release_notes.py VERSION [CHANGELOG]", file=sys.stderr)
        return 2
    path = Path(argv[1] if len(argv) == 2 else "CHANGELOG.md")
    try:
        print(section(path.read_text(encoding="utf-8"), argv[0]))
    except (OSError, ValueError) as exc:
        print(f"release notes: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
