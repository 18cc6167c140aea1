"""Writing a file so that readers see the old content or the new, never a part of it."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def write_text(
    path: Path,
    text: str,
    tmp_dir: Path | None = None,
    before_rename: Callable[[], None] | None = None,
    mode: int | None = None,
) -> None:
    """Write `text` to a temporary file in `tmp_dir` (default: beside `path`; it must be on the
    same filesystem), fsync it, rename it over `path` and fsync the directory. The file gets
    `mode` (default: the temporary file's 0600).

    `before_rename` runs between the write and the rename (tests use it to crash there)."""
    tmp_dir = path.parent if tmp_dir is None else tmp_dir
    tmp_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(
        prefix=f"{path.parent.name}.{path.name}.", suffix=".tmp", dir=tmp_dir
    )
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        if before_rename is not None:
            before_rename()
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
