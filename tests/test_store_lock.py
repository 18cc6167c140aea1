"""The per-scope lock (store/scopes.lock): exclusive across processes, bounded wait, released
when its holder dies, never fooled by a planted symlink."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ci_fxcache.store import scopes
from ci_fxcache.store.layout import Layout

KEY = "fxcache-v1-linux-x86_64-cp311-torch2.13.0+cpu-cpu-000000000000"
_HOLD = """
import sys, time
from pathlib import Path
from ci_fxcache.store import scopes
from ci_fxcache.store.layout import Layout
with scopes.lock(Layout(Path(sys.argv[1])), sys.argv[2]):
    print("held", flush=True)
    time.sleep(600)
"""


def _holder(root: Path) -> subprocess.Popen[str]:
    """Another process that takes the lock and keeps it (until killed)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(root), KEY], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_held_lock_times_out_and_is_free_once_its_holder_is_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = Layout(tmp_path / "root")
    holder = _holder(layout.root)
    try:
        monkeypatch.setenv(scopes.LOCK_TIMEOUT_ENV, "0.3")
        with (
            pytest.raises(TimeoutError, match=r"still held by another job after 0\.3 s"),
            scopes.lock(layout, KEY),
        ):
            pytest.fail("the lock was taken while another process held it")
    finally:
        holder.send_signal(signal.SIGKILL)  # no cleanup runs: the kernel releases it
        holder.wait()
    monkeypatch.setenv(scopes.LOCK_TIMEOUT_ENV, "30")
    with scopes.lock(layout, KEY):
        pass


def test_a_waiting_job_gets_the_lock_when_it_is_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = Layout(tmp_path / "root")
    holder = _holder(layout.root)
    monkeypatch.setenv(scopes.LOCK_TIMEOUT_ENV, "60")
    released_at = time.monotonic() + 0.5
    killer = subprocess.Popen(
        [sys.executable, "-c", f"import os, time; time.sleep(0.5); os.kill({holder.pid}, 9)"]
    )
    with scopes.lock(layout, KEY):
        assert time.monotonic() >= released_at - 0.05  # it waited for the holder
    killer.wait()
    holder.wait()


def test_a_symlink_planted_as_the_lock_file_is_refused_and_its_target_untouched(
    tmp_path: Path,
) -> None:
    layout = Layout(tmp_path / "root")
    victim = tmp_path / "victim"
    victim.write_text("precious")
    layout.lock(KEY).parent.mkdir(parents=True)
    layout.lock(KEY).symlink_to(victim)
    with pytest.raises(OSError), scopes.lock(layout, KEY):
        pytest.fail("a symlinked lock file was used")
    assert victim.read_text() == "precious"
    assert os.path.islink(layout.lock(KEY))
