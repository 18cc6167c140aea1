"""What jobs leave behind: leases of jobs that died (container jobs, act), overlays and
temporary files of killed restores and saves, full disks (issue 23 §5, §6)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import RunFxcache
from tests.store_helpers import SAMPLE, Store, end_lease_holders, mount_tmpfs, write_files

# A container job's steps, or act: inside Actions, no Runner.Worker among the ancestors.
CONTAINER_JOB = {"GITHUB_ACTIONS": "true", "GITHUB_EVENT_NAME": "push"}


def _end_job(state: dict[str, Any]) -> None:
    """The job's processes are gone (its container torn down, the job killed): its lease
    holder dies with them."""
    pid = json.loads(Path(state["lease"]).read_text())["holder_pid"]
    os.kill(pid, signal.SIGKILL)
    while _alive(pid):  # not our child: whoever it was reparented to reaps it
        time.sleep(0.01)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@pytest.fixture
def store(tmp_path: Path, run_fxcache: RunFxcache) -> Iterator[Store]:
    s = Store(root=tmp_path / "root", run=run_fxcache, env={})
    yield s
    end_lease_holders(s.root)


def _saved(store: Store) -> dict[str, Any]:
    state = store.restore(state="first.json")
    write_files(state["scope_dir"], SAMPLE)
    proc = store.save(state="first.json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["saved"], proc.stderr
    return state


def test_a_dead_container_jobs_lease_without_owner_pid_is_dead_at_once(store: Store) -> None:
    """A container job's (or act's) lease has no owner pid; while its job runs, others get an
    overlay; once its processes are gone, the next restore has the scope in place, not in 6 h."""
    _saved(store)
    first = store.restore(state="a.json", env=CONTAINER_JOB)
    assert first["mode"] == "in-place"
    assert json.loads(Path(first["lease"]).read_text())["owner_pid"] is None
    second = store.restore(state="b.json", env=CONTAINER_JOB)
    assert second["mode"] != "in-place" and second["overlay_dir"], second  # a live writer
    _end_job(first)
    _end_job(second)
    third = store.restore(state="c.json", env=CONTAINER_JOB)
    assert third["mode"] == "in-place" and third["hit"], third


def test_a_trusted_job_with_an_overlay_says_so(store: Store) -> None:
    _saved(store)
    store.restore(state="a.json", env=CONTAINER_JOB)
    second = store.restore(state="b.json", env=CONTAINER_JOB)
    assert second["overlay_dir"] and not second["read_only"]
    line = next(x for x in second["_stderr"].splitlines() if x.startswith("fxcache: hit"))
    assert f"({len(SAMPLE)} files, {second['mode']} overlay; another job has" in line, line
    assert ", in place)" not in line


def test_invalidate_prunes_orphaned_overlays_and_temp_manifests(store: Store) -> None:
    """The overlay of a trusted job that died, and the temporary manifest of a save killed
    before its rename, are removed by the next `invalidate`, whatever the policy; the overlay
    of a job still running is kept."""
    first = _saved(store)
    key = first["scope_key"]
    holding = store.restore(state="a.json", env=CONTAINER_JOB)
    dead = store.restore(state="b.json", env=CONTAINER_JOB)
    alive = store.restore(state="c.json", env=CONTAINER_JOB)
    assert dead["overlay_dir"] and alive["overlay_dir"]
    _end_job(dead)
    temp = store.root / ".locks" / f"{key}.manifest.json.k1ll3d.tmp"
    temp.write_text("{}")
    proc = store.run("invalidate", "--root", str(store.root), "--max-age", "30d")
    assert proc.returncode == 0, proc.stderr
    assert "pruned 1 orphaned overlay(s), 1 temporary file(s)" in proc.stdout, proc.stdout
    assert not Path(dead["overlay_dir"]).exists() and not temp.exists()
    assert Path(alive["overlay_dir"]).is_dir() and Path(holding["scope_dir"]).is_dir()


def _fill(path: Path) -> None:
    """Write `path` until the filesystem is full."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)


def test_a_full_disk_leaves_no_partial_overlay_and_in_place_needs_no_space(
    tmp_path: Path, run_fxcache: RunFxcache
) -> None:
    """An overlay that cannot be built on a full disk is removed again (the job runs cold);
    a trusted in-place restore on the full disk is still a hit."""
    mnt = tmp_path / "tiny"
    if os.geteuid() != 0 or not mount_tmpfs(mnt, "1m"):
        pytest.skip("mounting a tiny tmpfs needs root with mount rights")
    try:
        store = Store(root=mnt / "root", run=run_fxcache, env={})
        state = store.restore(state="../job.json")
        write_files(state["scope_dir"], {f"inductor/e/{i:03d}": b"x" * 8192 for i in range(40)})
        assert json.loads(store.save(state="../job.json").stdout)["saved"]
        room = mnt / "room"
        room.write_bytes(b"\0" * 65536)  # what the overlay will find free
        _fill(mnt / "filler")
        room.unlink()
        ro = store.restore("--read-only", "--overlay", "copy", state="../ro.json")
        assert ro["mode"] == "cold-fallback" and "No space left" in ro["_stderr"], ro
        overlays = store.root / ".overlays"
        assert not overlays.exists() or not list(overlays.iterdir())
        _fill(mnt / "filler")
        again = store.restore(state="../again.json")
        assert again["mode"] == "in-place" and again["hit"], again["_stderr"]
    finally:
        end_lease_holders(mnt / "root")
        subprocess.run(["umount", "-l", str(mnt)], check=False)
