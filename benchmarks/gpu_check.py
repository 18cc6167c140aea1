"""Helper of `benchmarks/gpu_check.sh`: watch a command's compile workers; check a GPU run.

    python benchmarks/gpu_check.py watch PEAK.json -- CMD...   run CMD, record the most
        Inductor compile-worker processes alive at once under it (exit status: CMD's)
    python benchmarks/gpu_check.py check OUT_DIR WORK_DIR      read what gpu_check.sh wrote
        there, print each check and write OUT_DIR/checks.json; exit 1 when a check fails
    python benchmarks/gpu_check.py env-checks OUT_DIR          the no-import GPU view
        (nvidia-smi, libcuda.so.1) against torch.cuda's under several CUDA_VISIBLE_DEVICES
        values; prints a table, writes OUT_DIR/env-checks.json; exit 1 on a disagreement

The checks are those of issue 15 sections 3 to 5 that only a real GPU can answer: the fingerprint
and `import torch` agree on the GPU (probe), index and UUID selection give one scope key, every
CUDA phase ran on the device the job was given (the UUID) with hot on cold's device, the skips
name their cause, and the compile workers stayed within the per-phase bound.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
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


# -- env checks (issue 28 sections 2-4) --
# torch.cuda's own view, asked in a fresh process (CUDA reads its variables once, at init).
TORCH_VIEW = (
    "import json, torch\n"
    "n = torch.cuda.device_count() if torch.cuda.is_available() else 0\n"
    "print(json.dumps([[torch.cuda.get_device_name(i), '%d.%d' % "
    "torch.cuda.get_device_capability(i)] for i in range(n)]))\n"
)


def _torch_view(env: dict[str, str]) -> list[list[str]] | str:
    proc = subprocess.run(
        [sys.executable, "-c", TORCH_VIEW],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode != 0:
        return (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return [list(d) for d in json.loads(proc.stdout.splitlines()[-1])]


def _without_cuda_variables() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("CUDA_")}


def _visible_values() -> list[dict[str, str] | None]:
    """The settings checked: unset, an index, a repeat, an invalid entry, a UUID prefix,
    two indices in PCI order (two GPUs or more), empty."""
    from ci_fxcache.env import gpus

    found = gpus.detect(_without_cuda_variables())
    values: list[dict[str, str] | None] = [None, {"CUDA_VISIBLE_DEVICES": "0"}]
    values += [{"CUDA_VISIBLE_DEVICES": "0,0"}, {"CUDA_VISIBLE_DEVICES": "0,99,0"}]
    smi = shutil.which("nvidia-smi")
    if smi:
        query = [smi, "--query-gpu=uuid", "--format=csv,noheader", "-i", "0"]
        proc = subprocess.run(query, capture_output=True, text=True, timeout=60, check=False)
        if proc.returncode == 0 and proc.stdout.split():
            values.append({"CUDA_VISIBLE_DEVICES": proc.stdout.split()[0][:12]})
    if len(found.gpus) > 1:
        values.append({"CUDA_VISIBLE_DEVICES": "1,0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    values.append({"CUDA_VISIBLE_DEVICES": ""})
    return values


def _agrees(seen: Any, torch_view: list[list[str]] | str) -> bool:
    """Whether a no-import view (None: that tool is missing) names torch's devices: the same
    count, in the same order, with the same model (as the scope folds names) and capability."""
    from ci_fxcache.env import gpus

    if seen is None or isinstance(torch_view, str):
        return True
    ours = [(gpus.model_name(g.name), g.capability) for g in seen]
    return ours == [(gpus.model_name(n), c) for n, c in torch_view]


def env_checks(out: Path, settings: list[dict[str, str] | None] | None = None) -> int:
    """Compare the fingerprint's two no-import views of the GPUs (nvidia-smi, the CUDA driver
    through libcuda.so.1) with torch.cuda's, per CUDA_VISIBLE_DEVICES setting: name (as the
    scope key folds it), capability, count. Print a table; write OUT/env-checks.json."""
    from ci_fxcache.env import gpus

    rows: list[dict[str, Any]] = []
    base = _without_cuda_variables()
    smi = shutil.which("nvidia-smi", path=base.get("PATH"))
    for setting in settings if settings is not None else _visible_values():
        env = {**base, **(setting or {})}
        smi_view = gpus.detect(env) if smi else None
        report = gpus.cuda_driver_report(env) or {}
        driver_view = gpus.parse_cuda_driver(report) if not report.get("error") else []
        torch_view = _torch_view(env)
        views = {
            "nvidia-smi": None if smi_view is None else smi_view.gpus,
            "libcuda": driver_view,
        }

        rows.append(
            {
                "setting": setting or {},
                "torch": torch_view,
                "nvidia-smi": None if smi_view is None else [g.name for g in smi_view.gpus],
                "libcuda": [g.name for g in driver_view],
                "libcuda_path": report.get("library"),
                "libcuda_error": report.get("error"),
                "ok": {name: _agrees(seen, torch_view) for name, seen in views.items()},
            }
        )
    failed = [r for r in rows if isinstance(r["torch"], str) or not all(r["ok"].values())]
    print(f"{'setting':<44} {'torch':>5} {'smi':>5} {'cuda':>5}  ok")
    for row in rows:
        text = " ".join(f"{k}={v!r}" for k, v in row["setting"].items()) or "(unset)"
        torch_n = len(row["torch"]) if not isinstance(row["torch"], str) else "err"
        smi_n = "-" if row["nvidia-smi"] is None else len(row["nvidia-smi"])
        flags = ",".join(
            f"{k}:{'-' if row[k] is None else 'ok' if v else 'DIFF'}" for k, v in row["ok"].items()
        )
        print(f"{text[:44]:<44} {torch_n!s:>5} {smi_n!s:>5} {len(row['libcuda']):>5}  {flags}")
    print(f"libcuda: {rows[0]['libcuda_path'] if rows else None}; nvidia-smi: {smi}")
    doc = {"rows": rows, "failed": len(failed), "nvidia_smi": smi}
    (out / "env-checks.json").write_text(json.dumps(doc, indent=1))
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "watch" and argv[2] == "--":
        return watch(Path(argv[1]), argv[3:])
    if len(argv) == 3 and argv[0] == "check":
        return check(Path(argv[1]), Path(argv[2]))
    if len(argv) == 2 and argv[0] == "env-checks":
        return env_checks(Path(argv[1]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
