"""The hash lock (toolkit/requirements*.txt) covers every interpreter and machine it is for:
each locked distribution has a wheel that pip would install on CPython 3.11-3.13 on x86_64
and on aarch64 Linux, read from the wheel names toolkit/lock.py writes beside the hashes."""

from __future__ import annotations

import importlib.util
import re

import pytest
from packaging.tags import Tag, cpython_tags
from packaging.utils import parse_wheel_filename

from tests.conftest import ROOT

_spec = importlib.util.spec_from_file_location("toolkit_lock", ROOT / "toolkit" / "lock.py")
assert _spec and _spec.loader
lock = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lock)

LOCKS = sorted((ROOT / "toolkit").glob("requirements*.txt"))


def locked(text: str) -> dict[str, tuple[list[str], list[str]]]:
    """name==version -> (wheel files named in its comments, its hashes)."""
    out: dict[str, tuple[list[str], list[str]]] = {}
    wheels: list[str] = []
    for block in re.split(r"\n(?=[#a-z])", text):
        if block.startswith("# Generated"):
            continue
        if block.startswith("# "):
            wheels.append(block[2:].strip())
            continue
        pin = block.split(" ", 1)[0]
        out[pin] = (wheels, re.findall(r"--hash=sha256:([0-9a-f]{64})", block))
        wheels = []
    return out


def supported(python: str, machine: str) -> set[Tag]:
    major, minor = (int(p) for p in python.split("."))
    platforms = lock.platform_tags(machine)
    return set(cpython_tags((major, minor), platforms=platforms)) | {
        Tag(f"py{major}", "none", "any"), Tag(f"py{major}{minor}", "none", "any"),
    } | {Tag(f"py{major}{m}", "none", "any") for m in range(minor)}  # fmt: skip


def test_the_lock_names_a_wheel_for_each_hash() -> None:
    for path in LOCKS:
        for pin, (wheels, hashes) in locked(path.read_text()).items():
            assert wheels, f"{path.name}: {pin} has no wheel names (rerun toolkit/lock.py)"
            assert len(hashes) == len(set(wheels)), f"{path.name}: {pin}"


@pytest.mark.parametrize("machine", lock.MACHINES)
@pytest.mark.parametrize("python", lock.PYTHONS)
def test_every_locked_distribution_installs_on_each_target(python: str, machine: str) -> None:
    tags = supported(python, machine)
    for path in LOCKS:
        for pin, (wheels, _) in locked(path.read_text()).items():
            fits = [w for w in wheels if parse_wheel_filename(w)[3] & tags]
            assert fits, f"{path.name}: no wheel of {pin} installs on cp{python} {machine}"


def test_platform_tags_reach_wheels_tagged_for_an_older_glibc_only() -> None:
    # obstore 0.12.1 publishes its aarch64 wheel as manylinux_2_24 alone; pip's --platform
    # manylinux2014_aarch64 never saw it, and the lock had no aarch64 obstore.
    assert "manylinux_2_24_aarch64" in lock.platform_tags("aarch64")
    assert "manylinux_2_17_x86_64" in lock.platform_tags("x86_64")
    assert not any("2_29" in t for m in lock.MACHINES for t in lock.platform_tags(m))
