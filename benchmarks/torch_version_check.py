"""Check one torch release against fxcache's torch-version table (not part of CI).

Builds a venv with `torch==VERSION` from the package index (a CUDA build is several GB: run it
on a machine with the bandwidth), then, on that real torch:
  1. probes every option of ci_fxcache/env/torch_support.py and compares with what the table
     says that release has;
  2. runs `fxcache verify` with the default matrix (or the axes given after `--`) and prints
     each combination's verdict, cause and reason: gated combinations must come out `skipped`
     (cause torch-too-old), never as an error or a crash.

Usage: python benchmarks/torch_version_check.py 2.6.0 [--venv DIR | --python PY] [--pip-arg ARG]...
       [--json PATH] [-- AXES]
`--python` checks an interpreter that already has that torch (nothing is installed). On a
machine whose pip configuration caps torch (a constraints file), lift the cap for the install
with `PIP_CONSTRAINT=/dev/null`. Exit status: 0 when the table matches and no combination is
an error or unsafe, 1 otherwise. Record each run in docs/torch-versions.md, with the load.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_matrix import run_verify

from ci_fxcache.env import torch_support


def build_venv(version: str, venv: Path, pip_args: list[str]) -> str:
    """A venv with exactly `torch==version` (and numpy); its python."""
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    start = time.perf_counter()
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", f"torch=={version}", "numpy", *pip_args],
        check=True,
    )
    print(f"installed torch=={version} in {time.perf_counter() - start:.0f} s ({venv})")
    return str(python)


def check_table(python: str) -> tuple[bool, str]:
    """Probe every option on the real torch; print and compare with the table. Returns whether
    they agree, and the torch version."""
    version, present = torch_support.probe(python)
    expected = torch_support.expected(version)
    print(f"\ntorch {version}: options (present / the table says)")
    for name, option in torch_support.OPTIONS.items():
        mark = "ok" if present[name] == expected[name] else "MISMATCH"
        print(
            f"  {name:<22} {present[name]!s:<5} / {expected[name]!s:<5} "
            f">= {'.'.join(map(str, option.since)):<5} {mark}"
        )
    return present == expected, version


def load() -> str:
    """The load average (1, 5, 15 min): every figure is printed with the load it ran under."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def verify(python: str, work: Path, axes: list[str], save: Path | None) -> bool:
    """Run the matrix on the real torch; print each combination; False on error or unsafe."""
    before = load()
    elapsed, doc = run_verify(python, work, *axes)
    print(f"\nfxcache verify ({elapsed:.0f} s, load {before} -> {load()}): {doc['summary']}")
    for combo in doc["combos"]:
        cause = combo.get("cause") or "-"
        print(f"  {combo['id']:<60} {combo['verdict']:<8} {cause:<14} {combo['reason']}")
    if save is not None:
        save.write_text(json.dumps(doc, indent=1))
    return not any(c["verdict"] in ("error", "unsafe") for c in doc["combos"])


def main() -> int:
    """Build the venv, check the table, run the matrix."""
    argv = sys.argv[1:]
    axes = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("version", help="a released torch version, e.g. 2.6.0 (never unpinned)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--venv", type=Path, help="venv dir (default: a new temporary one)")
    where.add_argument("--python", help="an interpreter that has this torch: install nothing")
    parser.add_argument("--json", type=Path, help="also write the results document here")
    parser.add_argument(
        "--pip-arg", action="append", default=[], help="extra pip install argument (repeatable)"
    )
    args = parser.parse_args(argv)
    if not re.fullmatch(r"\d+\.\d+\.\d+", args.version):
        parser.error(f"version {args.version!r}: give an exact release such as 2.6.0")
    work = Path(tempfile.mkdtemp(prefix=f"fxcache-torch{args.version}-"))
    python = args.python or build_venv(args.version, args.venv or work / "venv", args.pip_arg)
    table_ok, installed = check_table(python)
    if torch_support.release(installed)[:3] != torch_support.release(args.version)[:3]:
        print(f"{python} has torch {installed}, not {args.version}")
        return 1
    matrix_ok = verify(python, work, axes, args.json)
    table = "matches" if table_ok else "MISMATCHES"
    print(f"\ntable {table}; matrix {'ok' if matrix_ok else 'FAILED'}")
    return 0 if table_ok and matrix_ok else 1


if __name__ == "__main__":
    sys.exit(main())
