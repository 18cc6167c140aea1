"""tests/cxx_cache.py, the session's compiler-output cache: a hit serves the kept output of a
real compile, and anything that changes what the compiler would build misses."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import cxx_cache

REAL = cxx_cache.real_compiler()
pytestmark = pytest.mark.skipif(REAL is None, reason="no g++ on PATH")

SOURCE = '#include "value.h"\nextern "C" int value() { return VALUE; }\n'


class Tree:
    """A wrapper installed under tmp_path, a header folder and a source to compile."""

    def __init__(self, tmp_path: Path) -> None:
        assert REAL is not None
        self.bin = cxx_cache.install(tmp_path / "cache", REAL, sys.executable)
        self.store = tmp_path / "cache" / "store"
        self.include = tmp_path / "include"
        self.include.mkdir()
        self.header(1)
        self.source = tmp_path / "value.cpp"
        self.source.write_text(SOURCE)
        self.out = tmp_path / "out"
        self.out.mkdir()

    def header(self, value: int) -> None:
        (self.include / "value.h").write_text(f"#define VALUE {value}\n")

    def compile(self, name: str, *extra: str) -> subprocess.CompletedProcess[str]:
        args = [str(self.bin / "g++"), "-O1", "-shared", "-fPIC", f"-I{self.include}", *extra]
        args += [str(self.source), "-o", str(self.out / name)]
        return subprocess.run(args, capture_output=True, text=True, check=False)

    def value(self, name: str) -> int:
        return int(ctypes.CDLL(str(self.out / name)).value())

    def kept(self) -> list[Path]:
        return sorted(self.store.glob("*.out"))


def test_a_hit_serves_the_kept_output_of_the_real_compile(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    assert tree.compile("a.so").returncode == 0 and tree.value("a.so") == 1
    [kept] = tree.kept()
    assert kept.read_bytes() == (tree.out / "a.so").read_bytes()
    # Proof the second output comes from the store: mark the kept bytes, compile again.
    kept.write_bytes(kept.read_bytes() + b"served from the store")
    assert tree.compile("b.so").returncode == 0
    assert (tree.out / "b.so").read_bytes().endswith(b"served from the store")
    assert os.access(tree.out / "b.so", os.X_OK)


def test_outputs_are_copies_so_tampering_one_never_reaches_the_store(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    assert tree.compile("a.so").returncode == 0  # a miss: g++ writes a.so, the store a copy
    original = (tree.out / "a.so").read_bytes()
    assert tree.compile("b.so").returncode == 0  # a hit: b.so comes from the store
    for served in ("a.so", "b.so"):
        with open(tree.out / served, "r+b") as f:  # in place, as a tamper test would
            f.write(b"tampered")
    assert tree.compile("c.so").returncode == 0
    assert (tree.out / "c.so").read_bytes() == original


@pytest.mark.parametrize("change", ["source", "header", "flag"])
def test_a_changed_input_header_or_flag_compiles_again(tmp_path: Path, change: str) -> None:
    tree = Tree(tmp_path)
    assert tree.compile("a.so").returncode == 0 and tree.value("a.so") == 1
    extra: tuple[str, ...] = ()
    if change == "source":
        tree.source.write_text(SOURCE.replace("VALUE;", "VALUE + 1;"))
    elif change == "header":
        tree.header(2)  # what a torch upgraded in place does to its headers
    else:
        extra = ("-DVALUE_UNUSED=1",)
    assert tree.compile("b.so", *extra).returncode == 0
    assert tree.value("b.so") == {"source": 2, "header": 2, "flag": 1}[change]
    assert len(tree.kept()) == (1 if change == "header" else 2)  # a header overwrites its key


def test_a_library_replaced_at_the_same_path_compiles_again(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libdummy.so").write_bytes(b"")  # named by -l: only its identity is read
    link = (f"-L{lib}", "-ldummy", "-Wl,--as-needed")
    (lib / "libdummy.so").unlink()
    assert subprocess.run([REAL, "-shared", "-o", str(lib / "libdummy.so"), "-x", "c", "/dev/null"]
                          ).returncode == 0  # fmt: skip
    assert tree.compile("a.so", *link).returncode == 0
    (lib / "libdummy.so").unlink()
    assert subprocess.run([REAL, "-shared", "-o", str(lib / "libdummy.so"), "-x", "c", "/dev/null"]
                          ).returncode == 0  # fmt: skip
    assert tree.compile("b.so", *link).returncode == 0
    assert len(tree.kept()) == 2


def test_a_failing_compile_passes_its_status_and_message_and_keeps_nothing(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    tree.source.write_text("this is not C++\n")
    failed = tree.compile("a.so")
    assert failed.returncode != 0 and "error" in failed.stderr
    assert tree.kept() == [] and not (tree.out / "a.so").exists()


def test_probes_and_preprocessing_run_the_real_compiler(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    version = subprocess.run([str(tree.bin / "g++"), "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and "g++" in version.stdout.splitlines()[0].lower()
    assert tree.compile("a.i", "-E").returncode == 0
    assert "return 1;" in (tree.out / "a.i").read_text() and tree.kept() == []


def test_a_user_who_cannot_run_the_cache_compiles_for_real(tmp_path: Path) -> None:
    """The tests' unprivileged user cannot run the test venv's Python: g++ runs directly."""
    tree = Tree(tmp_path)
    assert REAL is not None
    tree.bin = cxx_cache.install(tmp_path / "other", REAL, str(tmp_path / "no-such-python"))
    assert tree.compile("a.so").returncode == 0 and tree.value("a.so") == 1
    assert list((tmp_path / "other" / "store").iterdir()) == []


def test_an_unwritable_store_still_compiles(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    tree.store.rmdir()
    tree.store.write_text("not a directory")
    assert tree.compile("a.so").returncode == 0 and tree.value("a.so") == 1


def test_the_session_puts_the_wrapper_first_on_path() -> None:
    """tests/conftest.py installed it for this run (FXCACHE_TEST_CXX_CACHE=0 turns it off)."""
    if os.environ.get("FXCACHE_TEST_CXX_CACHE") == "0":
        pytest.skip("FXCACHE_TEST_CXX_CACHE=0: this run compiles everything for real")
    first = subprocess.run(["sh", "-c", "command -v g++"], capture_output=True, text=True)
    assert "cxx_cache.py" in Path(first.stdout.strip()).read_text()
