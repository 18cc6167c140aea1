"""`-o` and `--json` write where they are pointed, as a shell redirection would: a new path or
a regular file is replaced atomically (a symlink is written through), anything else — a
device, a FIFO, a socket, the process's own stdout — is written into, never replaced.

Tests whose regression would replace a node of the machine's real /dev (/dev/null, /dev/full,
/dev/stdout) run the command as `nobody`, who cannot create files in /dev: a regression then
fails the test instead of breaking the machine.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, RunFxcache

RESULTS = ROOT / "tests" / "data" / "results_cpu.json"
SHARDS = [ROOT / "tests" / "data" / n for n in ("shard_a100.json", "shard_h200.json")]
AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]


def _report_text() -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "ci_fxcache", "report", str(RESULTS), "--format", "text"],
        capture_output=True, text=True, timeout=120, check=True, cwd=ROOT,
    )  # fmt: skip
    return proc.stdout


class FifoReader:
    """A thread that reads a FIFO until its writer closes it."""

    def __init__(self, path: Path) -> None:
        self.data = b""
        self._thread = threading.Thread(target=self._read, args=(path,), daemon=True)
        self._thread.start()

    def _read(self, path: Path) -> None:
        with open(path, "rb") as fh:
            self.data = fh.read()

    def result(self) -> str:
        self._thread.join(timeout=120)
        assert not self._thread.is_alive(), "the FIFO was never closed by its writer"
        return self.data.decode()


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "out.fifo"
    os.mkfifo(path)
    yield path
    if stat.S_ISFIFO(os.lstat(path).st_mode):
        # unblock a reader thread still waiting for a writer (the test failed before writing)
        with open(os.open(path, os.O_RDWR | os.O_NONBLOCK), "wb"):
            pass


def _as_nobody(args: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    if os.geteuid() != 0:
        pytest.skip("needs root to run the command as nobody")
    probe = subprocess.run([*AS_NOBODY, sys.executable, "-c", "import ci_fxcache"],
                           capture_output=True, timeout=120, cwd=ROOT, check=False)  # fmt: skip
    if probe.returncode != 0:
        pytest.skip(f"nobody cannot run {sys.executable} with ci_fxcache: {probe.stderr[-200:]!r}")
    return subprocess.run(
        [*AS_NOBODY, sys.executable, "-m", "ci_fxcache", *args],
        text=True, timeout=120, cwd=ROOT, check=False, **kw,  # type: ignore[call-overload]
    )  # fmt: skip


def test_report_into_a_fifo_writes_into_it(run_fxcache: RunFxcache, fifo: Path) -> None:
    reader = FifoReader(fifo)
    proc = run_fxcache("report", str(RESULTS), "--format", "text", "-o", str(fifo))
    assert proc.returncode == 0, proc.stderr
    assert reader.result() == _report_text()
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_merge_into_a_fifo_writes_into_it(run_fxcache: RunFxcache, fifo: Path) -> None:
    reader = FifoReader(fifo)
    proc = run_fxcache("merge", *map(str, SHARDS), "-o", str(fifo))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(reader.result())["schema"] == "fxcache-merged/2"
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_verify_json_into_a_fifo_writes_into_it(run_fxcache: RunFxcache, fifo: Path) -> None:
    """A real verify run (CUDA only: every combination is skipped on this CPU machine)."""
    reader = FifoReader(fifo)
    proc = run_fxcache(
        "verify", "--python", sys.executable, "--device", "cuda", "--dtypes", "float32",
        "--dynamic", "false", "--mechanisms", "fxgraph", "--training", "false",
        "--json", str(fifo), timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(reader.result())
    assert doc["schema"] == "fxcache-results/2"
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
def test_report_into_a_device_node_stays_a_device(run_fxcache: RunFxcache, tmp_path: Path) -> None:
    device = tmp_path / "null"
    os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # the null device's numbers
    for args in (["report", str(RESULTS), "-o", str(device)],
                 ["merge", *map(str, SHARDS), "-o", str(device)]):  # fmt: skip
        proc = run_fxcache(*args)
        assert proc.returncode == 0, proc.stderr
        st = os.lstat(device)
        assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3)


def test_report_into_dev_null_leaves_it_a_device() -> None:
    proc = _as_nobody(["report", str(RESULTS), "-o", "/dev/null"], capture_output=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == proc.stderr == ""
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this machine")
def test_report_into_dev_full_is_one_line_and_exit_2() -> None:
    proc = _as_nobody(["report", str(RESULTS), "-o", "/dev/full"], capture_output=True)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        "fxcache: error: -o: cannot write /dev/full (No space left on device)"
    ]
    assert stat.S_ISCHR(os.lstat("/dev/full").st_mode)


def test_report_into_dev_stdout_goes_down_the_pipe() -> None:
    proc = _as_nobody(
        ["report", str(RESULTS), "--format", "text", "-o", "/dev/stdout"], capture_output=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == _report_text()
    assert os.path.islink("/dev/stdout")


def test_report_into_dev_stdout_appends_to_a_file_opened_for_appending(tmp_path: Path) -> None:
    """`>> log` then `-o /dev/stdout`: the report lands after what the log held, like `cat`."""
    log = tmp_path / "log"
    log.write_text("earlier line\n")
    with open(log, "a") as out:  # nobody writes through the descriptor it inherits
        proc = _as_nobody(
            ["report", str(RESULTS), "--format", "text", "-o", "/dev/stdout"],
            stdout=out, stderr=subprocess.PIPE,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert log.read_text() == "earlier line\n" + _report_text()


def test_report_into_a_unix_socket_sends_it(run_fxcache: RunFxcache, tmp_path: Path) -> None:
    path = tmp_path / "out.sock"
    received: list[bytes] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
        server.listen(1)
        server.settimeout(120)

        def accept() -> None:
            conn, _ = server.accept()
            with conn:
                chunks = []
                while chunk := conn.recv(65536):
                    chunks.append(chunk)
                received.append(b"".join(chunks))

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        proc = run_fxcache("report", str(RESULTS), "--format", "text", "-o", str(path))
        thread.join(timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert received == [_report_text().encode()]
    assert stat.S_ISSOCK(os.lstat(path).st_mode)


def test_report_through_a_symlink_replaces_its_target_and_keeps_the_link(
    run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    """A shell redirection writes through a symlink; so does -o (atomically, at the target)."""
    target = tmp_path / "real" / "report.txt"
    target.parent.mkdir()
    target.write_text("old report\n")
    target.chmod(0o640)
    link = tmp_path / "report-link.txt"
    link.symlink_to(target)
    proc = run_fxcache("report", str(RESULTS), "--format", "text", "-o", str(link))
    assert proc.returncode == 0, proc.stderr
    assert link.is_symlink() and link.resolve() == target
    assert target.read_text() == _report_text()
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert sorted(p.name for p in target.parent.iterdir()) == ["report.txt"]  # no temp file left


def test_a_new_output_file_follows_the_umask(tmp_path: Path) -> None:
    out = tmp_path / "report.md"
    proc = subprocess.run(
        [sys.executable, "-m", "ci_fxcache", "report", str(RESULTS), "-o", str(out)],
        capture_output=True, text=True, timeout=120, cwd=ROOT, check=False, umask=0o027,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o640
