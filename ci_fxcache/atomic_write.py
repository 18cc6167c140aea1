"""Writing a file so that readers see the old content or the new, never a part of it; and
writing a command's output where the user pointed it, as a shell redirection would."""

from __future__ import annotations

import os
import re
import socket
import stat
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

    `before_rename` runs between the write and the rename (tests use it to crash there);
    `mode` (default: mkstemp's 0600) is set on the temporary file before the rename."""
    tmp_dir = path.parent if tmp_dir is None else tmp_dir
    tmp_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(
        prefix=f"{path.parent.name}.{path.name}.", suffix=".tmp", dir=tmp_dir
    )
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            if mode is not None:
                os.fchmod(fh.fileno(), mode)
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


def write_output(path: Path, text: str) -> None:
    """Write a command's output (`-o`, `--json`) into `path` as a shell redirection would
    place it, atomically wherever a rename can do that.

    - A new path or a regular file: a temporary file beside it, renamed over it (readers see
      the old document or the new one). A symlink is kept and its target replaced, the way a
      redirection writes through it; the file keeps its mode (a new one gets 0666 less the
      umask). Hard links to the old file keep the old content.
    - This process's own descriptor (`/dev/stdout`, `/dev/stderr`, `/dev/fd/N`,
      `/proc/self/fd/N`): written to that descriptor, whatever it is (pipe, terminal, socket,
      a file opened for appending).
    - Anything else that exists (a character or block device such as `/dev/null`, a FIFO, a
      Unix socket): written into, never replaced. A FIFO waits for its reader, as `>` does.

    Raises OSError (e.g. ENOSPC from `/dev/full`) when the bytes cannot all be written."""
    data = text.encode("utf-8")
    own = _own_descriptor(path)
    if own is not None:
        fd = os.dup(own)
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
        return
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    if st is None or stat.S_ISREG(st.st_mode):
        mode = _new_file_mode() if st is None else stat.S_IMODE(st.st_mode)
        write_text(Path(os.path.realpath(path)), text, mode=mode)
    elif stat.S_ISSOCK(st.st_mode):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(os.fspath(path))
            sock.sendall(data)
    else:
        fd = os.open(path, os.O_WRONLY | os.O_NOCTTY | os.O_CLOEXEC)
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)


_FD_DIR = re.compile(r"/proc/(\d+)(?:/task/\d+)?/fd")


def _own_descriptor(path: Path) -> int | None:
    """The descriptor N when `path` leads (through symlinks) to /proc/<this pid>/fd/N."""
    current = os.path.abspath(path)
    for _ in range(40):  # the kernel's limit on symlinks followed in one lookup
        head, tail = os.path.split(current)
        real_head = os.path.realpath(head)
        match = _FD_DIR.fullmatch(real_head)
        if match and int(match[1]) == os.getpid() and tail.isdigit():
            return int(tail)
        if not os.path.islink(current):
            return None
        current = os.path.normpath(os.path.join(real_head, os.readlink(current)))
    return None


def _new_file_mode() -> int:
    """0666 less the umask: what open(2) gives a file a redirection creates."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    umask = os.umask(0o022)  # no /proc: read it by setting it (not thread-safe, rare)
    os.umask(umask)
    return 0o666 & ~umask


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
