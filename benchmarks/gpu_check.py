"""Helper of `benchmarks/gpu_check.sh`: watch a command's compile workers; check a GPU run.

    python benchmarks/gpu_check.py watch PEAK.json -- CMD...   run CMD, record the most
        Inductor compile-worker processes alive at once under it (exit status: CMD's)
    python benchmarks/gpu_check.py check OUT_DIR WORK_DIR      read what gpu_check.sh wrote
        there, print each check and write OUT_DIR/checks.json; exit 1 when a check fails

The checks are those of issue 15 sections 3 to 5 that only a real GPU can answer: the fingerprint
and `import torch` agree on the GPU (probe), index and UUID selection give one scope key, every
CUDA phase ran on the device the job was given (the UUID) with hot on cold's device, the skips
name their cause, and the compile workers stayed within the per-phase bound.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from ci_fxcache.verify import runner


def compile_workers(root: int) -> int:
    """How many Inductor compile-worker processes (the SubprocPool sidecar and its workers,
    torch/_inductor/compile_worker/) run under process `root` now."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    count = 0
    for pid in parents:
        ancestor = parents.get(pid)
        while ancestor and ancestor != root:
            ancestor = parents.get(ancestor)
        if ancestor == root:
            with contextlib.suppress(OSError):
                count += b"compile_worker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    return count


def peak_compile_workers(argv: list[str], **popen: Any) -> tuple[int, int]:
    """Run `argv` (Popen keywords pass through), sampling its compile workers every 0.05 s:
    its exit status and the most that were alive at once."""
    proc = subprocess.Popen(argv, **popen)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, compile_workers(proc.pid))
        threading.Event().wait(0.05)
    return proc.returncode, peak


def watch(peak_file: Path, argv: list[str]) -> int:
    """Run `argv` and write its compile-worker peak to `peak_file`; its exit status."""
    status, peak = peak_compile_workers(argv)
    # one GPU: one phase at a time
    seen = {"peak_compile_workers": peak, "threads": runner.compile_threads(1)}
    peak_file.write_text(json.dumps(seen))
    return status


def _combos(path: Path) -> list[dict[str, Any]]:
    return list(json.loads(path.read_text())["combos"]) if path.exists() else []


def check(out: Path, work: Path) -> int:
    """Evaluate the run in `out` (and `work`, the script's scratch dir); the exit status."""
    checks: list[dict[str, Any]] = []

    def record(name: str, ok: bool, detail: str) -> None:
        checks.append({"check": name, "ok": ok, "detail": detail})
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")

    by_index = json.loads((out / "fingerprint.json").read_text())
    by_uuid = json.loads((work / "fingerprint-uuid.json").read_text())
    uuid = (work / "uuid").read_text().strip().removeprefix("uuid=")
    combos = _combos(out / "default-cuda.json") + _combos(out / "transformer-bf16.json")
    if not by_index["fingerprint"]["gpus"]:
        record("gpu", True, "no GPU: CPU fallback, CUDA combinations must all be skipped")
        causes = {c.get("cause") for c in combos}
        record("skips", causes == {"no-device"}, f"causes {sorted(map(str, causes))}")
    else:
        probe = by_index.get("probe") or {}
        record("probe", bool(probe.get("ok")), json.dumps(probe.get("fields", []))[:600])
        record(
            "uuid key",
            by_index["scope_key"] == by_uuid["scope_key"],
            f"{by_index['scope_key']} vs {by_uuid['scope_key']} (CUDA_VISIBLE_DEVICES=UUID)",
        )
        ran = [c for c in combos if c["verdict"] != "skipped"]
        record("ran", bool(ran), f"{len(ran)} of {len(combos)} CUDA combinations ran")
        phases = [(c["id"], n, c[n]) for c in ran for n in ("cold", "hot") if c.get(n)]
        wrong = [f"{i} {n}" for i, n, p in phases if (p.get("gpu") or {}).get("visible") != uuid]
        record("slots", not wrong, f"phases not on {uuid}: {wrong[:5]}")
        moved = [c["id"] for c in ran if c["hot"] and c["hot"].get("gpu") != c["cold"].get("gpu")]
        record("hot on cold's device", not moved, f"moved: {moved[:5]}")
        skipped = [c for c in combos if c["verdict"] == "skipped"]
        uncaused = [c["id"] for c in skipped if not c.get("cause")]
        record("skip causes", not uncaused, f"skipped without cause: {uncaused[:5]}")
    for name in ("default-cuda", "transformer-bf16"):
        peak_file = work / f"{name}.peak.json"
        if not peak_file.exists():
            continue
        seen = json.loads(peak_file.read_text())
        threads = seen["threads"]
        bound = 0 if threads == 1 else 1 + threads  # Inductor's sidecar plus its workers
        record(
            f"compile workers ({name})",
            seen["peak_compile_workers"] <= bound,
            f"peak {seen['peak_compile_workers']}, bound {bound} ({threads} threads a phase)",
        )
    verdicts: dict[str, int] = {}
    for combo in combos:
        verdicts[combo["verdict"]] = verdicts.get(combo["verdict"], 0) + 1
    print("verdicts:", json.dumps(verdicts))
    failed = [c["check"] for c in checks if not c["ok"]]
    (out / "checks.json").write_text(
        json.dumps({"checks": checks, "verdicts": verdicts, "failed": failed}, indent=1)
    )
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "watch" and argv[2] == "--":
        return watch(Path(argv[1]), argv[3:])
    if len(argv) == 3 and argv[0] == "check":
        return check(Path(argv[1]), Path(argv[2]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
