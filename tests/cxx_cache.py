"""A compiler-output cache for the test session (what ccache does in CI), as `g++` on PATH.

Every cold phase compiles into a fresh Inductor cache directory, so the same kernels and
Inductor's vector-ISA probes (2-3 s each here) are compiled again in every test. This wrapper
runs the real `g++` on a miss and keeps its output; on a hit it copies that output to `-o`.
Inductor still calls the compiler for every kernel (fxcache counts `CppBuilder.build`, not
compiler processes), writes the same files and loads a real g++ output: only the compile's
duration and the path recorded in its debug info differ.

A hit needs the same compiler binary, the same arguments (the output path aside), the same bytes
in every input and `-include` file, and unchanged headers (as listed by `-MD` on the miss) and
linked libraries (size, mtime, inode: a torch upgraded in place at the same path misses).
Anything else (`--version`, `-E`, relative paths, an unwritable cache) runs the real compiler.

`FXCACHE_TEST_CXX_CACHE=0` in the test run's environment turns it off (tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE_SUFFIXES = (".c", ".cc", ".cpp", ".cxx")
# Arguments that make the compiler write something other than (or besides) the -o file.
NOT_CACHED = ("-E", "-M", "-MM", "-MD", "-MMD", "-MF", "-save-temps", "-", "--version", "-v")
KEY_VERSION = "1"


def _digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _signature(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def _libraries(args: list[str]) -> list[str]:
    """The shared libraries `-l`/`-L` name that exist (what a torch upgraded in place replaces)."""
    dirs = [a[2:] for a in args if a.startswith("-L") and len(a) > 2]
    names = [a[2:] for a in args if a.startswith("-l") and len(a) > 2]
    return [f"{d}/lib{n}.so" for d in dirs for n in names if os.path.exists(f"{d}/lib{n}.so")]


def cache_key(compiler: str, args: list[str]) -> tuple[str, str] | None:
    """(key, output path) for a compile this cache can serve, or None to run the compiler."""
    if any(a in NOT_CACHED for a in args) or args.count("-o") != 1:
        return None
    out = args[args.index("-o") + 1]
    parts: list[object] = [KEY_VERSION, os.path.realpath(compiler), _signature(compiler)]
    inputs = 0
    for i, arg in enumerate(args):
        previous = args[i - 1] if i else ""
        if previous == "-o":
            parts.append("<out>")
        elif previous == "-include" or arg.endswith(SOURCE_SUFFIXES):
            if not os.path.isabs(arg) or not os.path.isfile(arg):
                return None
            source = previous != "-include"  # a source's path varies per test; its bytes count
            inputs += source
            parts.append(["<source>" if source else arg, _digest(arg)])
        elif arg.startswith(("-I", "-L")) and not os.path.isabs(arg[2:]):
            return None
        else:
            parts.append(arg)
    if inputs != 1 or not os.path.isabs(out):
        return None
    parts.append([[lib, _signature(lib)] for lib in _libraries(args)])
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest(), out


def _headers(deps_file: Path, skip: set[str]) -> list[str]:
    """The files a make-style dependency file names (`-MD` output), less `skip`."""
    text = deps_file.read_text().replace("\\\n", " ")
    _, _, deps = text.partition(": ")
    return [d for d in deps.split() if d not in skip]


def _hit(store: Path, key: str) -> Path | None:
    entry = store / f"{key}.out"
    try:
        manifest = json.loads((store / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None
    if not entry.is_file():
        return None
    for path, signature in manifest["headers"]:
        if _signature(path) != signature:
            return None
    return entry


def _place(entry: Path, out: str) -> None:
    """Copy (never link: tests tamper with outputs) the kept output to `out`, as g++ would."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(out), prefix=".cxx-cache-")
    os.close(fd)
    shutil.copyfile(entry, tmp)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, (stat.S_IRWXU | stat.S_IRWXG | stat.S_IRWXO) & ~umask)
    os.replace(tmp, out)


def _compile_and_keep(compiler: str, args: list[str], store: Path, key: str, out: str) -> int:
    with tempfile.TemporaryDirectory(prefix="cxx-cache-") as scratch:
        deps = Path(scratch) / "deps"
        status = subprocess.call([compiler, *args, "-MD", "-MF", str(deps)])
        if status != 0 or not deps.is_file():
            return status
        sources = {a for a in args if a.endswith(SOURCE_SUFFIXES)}
        headers = [[h, _signature(h)] for h in _headers(deps, sources)]
        if any(signature is None for _, signature in headers):
            return 0  # a header it cannot name again (a path with spaces): never served
        with contextlib.suppress(OSError):  # a store this user cannot write to: compiled anyway
            _keep(store / f"{key}.out", Path(out).read_bytes())
            _keep(store / f"{key}.json", json.dumps({"headers": headers}).encode())  # last: a hit
    return 0


def _keep(path: Path, data: bytes) -> None:
    """Write `path` whole or not at all, readable by the tests' unprivileged user."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".keep-")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    compiler, store, args = argv[0], Path(argv[1]), argv[2:]
    try:
        found = cache_key(compiler, args)
    except OSError:
        found = None
    if found is None:
        return subprocess.call([compiler, *args])
    key, out = found
    entry = _hit(store, key)
    if entry is not None:
        try:
            _place(entry, out)
            return 0
        except OSError:
            pass
    return _compile_and_keep(compiler, args, store, key, out)


def real_compiler() -> str | None:
    """The first `g++` on PATH that is not this wrapper."""
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        candidate = Path(folder, "g++")
        if candidate.is_file() and os.access(candidate, os.X_OK):
            with open(candidate, "rb") as f:  # a wrapper names this file in its first lines
                if Path(__file__).name.encode() in f.read(4096):
                    continue
            return str(candidate)
    return None


def install(base: Path, compiler: str, python: str) -> Path:
    """Write `base/bin/g++` (this cache in front of `compiler`): the directory to put on PATH."""
    bin_dir, store = base / "bin", base / "store"
    base.mkdir(parents=True, exist_ok=True)
    base.chmod(0o755)  # tests run steps as an unprivileged user too: they use it read-only
    bin_dir.mkdir(mode=0o755, parents=True)
    store.mkdir(mode=0o755)
    wrapper = bin_dir / "g++"
    here = Path(__file__).resolve()
    # Only compiles with -o start Python; probes and preprocessing exec the compiler at once, and
    # so does a user who cannot run this Python (the tests' unprivileged user).
    wrapper.write_text(
        "#!/bin/sh\n"
        'case " $* " in\n'
        '  *" -E "*) ;;\n'
        f'  *" -o "*) [ -x "{python}" ] && [ -r "{here}" ] &&\n'
        f'    exec "{python}" -I -S "{here}" "{compiler}" "{store}" "$@" ;;\n'
        "esac\n"
        f'exec "{compiler}" "$@"\n'
    )
    wrapper.chmod(0o755)
    return bin_dir


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
