"""Overlay builds make their directories in forked processes, by parent (store/overlay.py,
store/forked.py): the same tree as one process, and a failed child is made up for."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ci_fxcache.store import forked, overlay

FILES = (
    [f"inductor/fxgraph/{a:02x}/{b:016x}/entry" for a in range(12) for b in range(a + 1)]
    + [f"triton/{c:032x}/kernel.so" for c in range(9)]
    + ["inductor/aotautograd/x/y/z/entry"]
)


def _tree(root: Path) -> set[str]:
    return {
        os.path.relpath(os.path.join(top, name), root)
        for top, dirs, files in os.walk(root)
        for name in dirs + files
    }


@pytest.fixture
def forking(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Fork even for this small tree, on 2 CPUs, although xdist's worker runs a thread (the
    children only make directories). The list counts forks."""
    monkeypatch.setattr(overlay, "_MIN_DIRS_PER_WORKER", 1)
    monkeypatch.setattr(forked.threading, "active_count", lambda: 1)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1}, raising=False)
    forks: list[int] = []
    real_fork = os.fork
    monkeypatch.setattr(os, "fork", lambda: forks.append(1) or real_fork())
    return forks


def _source(tmp_path: Path) -> Path:
    source = tmp_path / "scope"
    for rel in FILES:
        (source / rel).parent.mkdir(parents=True, exist_ok=True)
        (source / rel).write_bytes(rel.encode())
    return source


def test_an_overlay_built_in_two_processes_is_the_tree_one_process_builds(
    tmp_path: Path, forking: list[int]
) -> None:
    source = _source(tmp_path)
    assert overlay.build(source, sorted(FILES), tmp_path / "two", "hardlink") == "hardlink"
    assert forking == [1]
    forking.clear()
    with pytest.MonkeyPatch.context() as single:
        single.setattr(forked, "workers", lambda count, per: 1)
        overlay.build(source, sorted(FILES), tmp_path / "one", "hardlink")
    assert forking == []
    assert _tree(tmp_path / "two") == _tree(tmp_path / "one") == _tree(source)
    for rel in FILES:  # every file shares the scope's inode
        assert os.path.samefile(source / rel, tmp_path / "two" / rel)


def test_a_failed_directory_child_is_made_up_for(
    tmp_path: Path, forking: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    source = _source(tmp_path)
    parent = os.getpid()
    real_makedirs = os.makedirs

    def makedirs(path: str, *args: object, **kwargs: object) -> None:
        if os.getpid() != parent:
            raise OSError("the child dies")
        real_makedirs(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(overlay.os, "makedirs", makedirs)
    overlay.build(source, sorted(FILES), tmp_path / "built", "hardlink")
    assert forking == [1]
    assert _tree(tmp_path / "built") == _tree(source)


def test_the_process_count_follows_the_cpus_a_container_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cgroup CPU quota caps the forked workers as it caps Inductor's pool (env/cpus.py is the
    one count of usable CPUs): a fake /sys with `cpu.max` of one CPU on a 4-CPU mask."""
    from ci_fxcache.env import cpus

    monkeypatch.setattr(forked.threading, "active_count", lambda: 1)
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text("0::/job\n")
    (tmp_path / "sys/fs/cgroup/job").mkdir(parents=True)
    (tmp_path / "sys/fs/cgroup/job/cpu.max").write_text("100000 100000\n")
    real = cpus.usable_cpus
    monkeypatch.setattr(cpus, "usable_cpus", lambda: real(tmp_path, affinity=4))
    assert forked.workers(10_000, 1) == 1
    (tmp_path / "sys/fs/cgroup/job/cpu.max").write_text("max 100000\n")
    assert forked.workers(10_000, 1) == min(4, forked.MAX_WORKERS)
