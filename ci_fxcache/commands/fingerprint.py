"""`fxcache fingerprint`: what this runner and interpreter are, as far as compiled code cares."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ci_fxcache import cli
from ci_fxcache.commands import options
from ci_fxcache.env import fingerprint, probe, scopekey, torch_support
from ci_fxcache.errors import EXIT_CHECK_FAILED, EXIT_OK
from ci_fxcache.report import text_table


def register(sub: Any, parent: argparse.ArgumentParser) -> None:
    """Add the `fingerprint` subcommand."""
    parser = sub.add_parser(
        "fingerprint",
        parents=[parent],
        help="show the environment fingerprint (torch, CUDA, triton, Python, GPUs, CPU ISA)",
        description="Read the target interpreter's torch/triton versions without importing "
        "torch, plus GPUs (nvidia-smi / rocminfo) and the CPU ISA.",
    )
    options.python_option(parser)
    options.salt_option(parser)
    parser.add_argument("--json", dest="as_json", action="store_true", help="print JSON")
    parser.add_argument(
        "--probe",
        dest="probe_torch",
        action="store_true",
        help="also import torch in the target interpreter and cross-check every field "
        "(exit 1 on a mismatch)",
    )
    parser.set_defaults(func=run)


def _text(fp: fingerprint.Fingerprint) -> str:
    gpus = ", ".join(f"{g.name} ({g.arch})" for g in fp.gpus) or "none"
    rows = [
        ("torch", fp.torch_version),
        ("torch git", fp.torch_git_version),
        ("CUDA", fp.cuda_version or "-"),
        ("HIP", fp.hip_version or "-"),
        ("triton", fp.triton_version or "-"),
        ("python", f"{fp.python_implementation} {fp.python_version} ({fp.python_abi})"),
        ("interpreter", fp.python_executable),
        ("platform", f"{fp.os} {fp.machine}"),
        ("GPUs", gpus),
        ("driver", fp.driver_version or "-"),
        (
            "CPU ISA",
            fp.cpu_isa
            + (
                f" (ATEN_CPU_CAPABILITY={fp.cpu_capability_override})"
                if fp.cpu_capability_override
                else ""
            ),
        ),
        ("salt", fp.salt or "-"),
        ("scope key", scopekey.scope_key(fp)),
    ]
    return "\n".join(text_table.lines(rows))


def run(*, python: str, salt: str | None, as_json: bool, probe_torch: bool) -> int:
    """Print the fingerprint; with --probe, cross-check it against `import torch`."""
    fp = fingerprint.collect(python, salt)
    torch_support.announce_newer(fp.torch_version)
    checks = probe.run(fp, python) if probe_torch else []
    failed = [c for c in checks if not c.ok]
    if as_json:
        doc: dict[str, Any] = {"fingerprint": fp.to_dict(), "scope_key": scopekey.scope_key(fp)}
        if probe_torch:
            doc["probe"] = {
                "ok": not failed,
                "fields": [c.__dict__ for c in checks],
            }
        print(json.dumps(doc, indent=2))
    else:
        print(_text(fp))
        if probe_torch:
            print()
            print("probe (import torch):", "all fields agree" if not failed else "MISMATCH")
            for c in checks:
                mark = "ok      " if c.ok else "MISMATCH"
                print(f"  {mark} {c.field}: fingerprint={c.fingerprint!r} torch={c.torch!r}")
    if failed:
        cli.report_failure(
            "fingerprint and torch disagree on "
            + ", ".join(f"{c.field} ({c.fingerprint!r} vs {c.torch!r})" for c in failed)
        )
        return EXIT_CHECK_FAILED
    return EXIT_OK
