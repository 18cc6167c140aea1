"""Helper of `benchmarks/gpu_check.sh` (every decision of the check lives here; the script only
runs steps):

    python benchmarks/gpu_check.py preflight WORK        print torch / Triton / CUDA / driver /
        GPU properties / CPUs, write WORK/preflight.json; exit 0 with a GPU, 3 without CUDA (the
        CPU fallback), 4 when torch or the toolkit cannot be imported (stop)
    python benchmarks/gpu_check.py watch PEAK.json [--logs TMP DEST] -- CMD...   run CMD, record
        the most Inductor compile-worker processes alive at once under it; with --logs, copy
        the phase logs verify writes under TMP into DEST as they grow (exit status: CMD's)
    python benchmarks/gpu_check.py listing DIR OUT.txt   list DIR's files with their sizes
    python benchmarks/gpu_check.py evidence WORK PYTHON  list each run's cache dir, render each
        run's markdown report
    python benchmarks/gpu_check.py archive WORK OUT.tar.gz   the evidence in one archive
    python benchmarks/gpu_check.py check OUT WORK        read what gpu_check.sh wrote, print each
        check, write OUT/checks.json; exit 1 when a check fails
    python benchmarks/gpu_check.py table WORK OUT.txt    the final table (under 12,000 characters)
    python benchmarks/gpu_check.py env-checks WORK       the no-import GPU view (nvidia-smi,
        libcuda.so.1) against torch.cuda's under several CUDA_VISIBLE_DEVICES values; prints a
        table, writes WORK/env-checks.json; exit 1 on a disagreement
    python benchmarks/gpu_check.py extra-steps WORK      the issue 46 verify steps this machine
        gets (compile modes on the GPU; 2 ranks where it has 2 GPUs), one a line:
        NAME CAP_S ARGS... (`extra_steps`; without WORK/preflight.json, every one: the dry run)
    python benchmarks/gpu_check.py has NAME              exit 0 when NAME is a subcommand here

The checks only a real GPU can answer: the fingerprint and `import torch` agree on the GPU
(probe), index and UUID selection give one scope key, every CUDA phase ran on the device the
job was given (the UUID) with hot on cold's device, skips name their cause, compile workers
stayed within the bound, Triton's cache holds compiled kernels and its driver module, every
CUDA hot phase counted its Triton builds or said why not, and a second hot process on the same
cache hit it.

Issue 28 §2-4's environment checks (scope key, libcuda, visible devices) are added as
functions here and one entry in `SUBCOMMANDS` (`env-checks WORK`): gpu_check.sh calls it when
`has env-checks` says it exists; what it writes to WORK/env-checks.json (`ENV_CHECKS`) joins
checks.json, each check named `env: ...`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

TABLE_LIMIT = 12_000
ENV_CHECKS = "env-checks.json"  # {"checks": [{"check", "ok", "detail"}]}, by `env-checks WORK`
PREFLIGHT_GPU, PREFLIGHT_NO_CUDA, PREFLIGHT_STOP = 0, 3, 4
# Issue 46: what teams ship, on the GPU. One small model, one combination per mode, so both
# fit the 8 minutes beside the rest: max-autotune benchmarks Triton templates, reduce-overhead
# captures CUDA graphs. The ranks step needs two GPUs (one per rank, NCCL).
_SMALL = ("--device", "cuda", "--workloads", "mlp", "--dtypes", "float32", "--dynamic", "false")
MODES_STEP = ("modes", 90, (*_SMALL, "--mechanisms", "fxgraph", "--training", "false",
                            "--modes", "max-autotune,reduce-overhead"))  # fmt: skip
RANKS_STEP = ("ranks-2", 75, (*_SMALL, "--mechanisms", "fxgraph", "--training", "true",
                              "--ranks", "2"))  # fmt: skip


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


def copy_logs(source: Path, dest: Path) -> None:
    """Copy the phase logs (`*.log`) under `source` that are new or grew into `dest` (flat,
    named by their path): verify deletes its run directory when it ends."""
    for log in source.glob("fxcache-run-*/**/*.log"):
        target = dest / "__".join(log.relative_to(source).parts[1:])
        with contextlib.suppress(OSError):
            if not target.exists() or target.stat().st_size != log.stat().st_size:
                dest.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(log, target)


def peak_compile_workers(
    argv: list[str], logs: tuple[Path, Path] | None = None, **popen: Any
) -> tuple[int, int]:
    """Run `argv` (Popen keywords pass through), sampling its compile workers every 0.05 s:
    its exit status and the most that were alive at once. `logs`: (source, dest) of
    `copy_logs`, done at each sample."""
    proc = subprocess.Popen(argv, **popen)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, compile_workers(proc.pid))
        if logs is not None:
            copy_logs(*logs)
        threading.Event().wait(0.05)
    return proc.returncode, peak


def watch(peak_file: Path, argv: list[str], logs: tuple[Path, Path] | None = None) -> int:
    """Run `argv` and write its compile-worker peak to `peak_file`; its exit status."""
    from ci_fxcache.verify import runner

    status, peak = peak_compile_workers(argv, logs)
    # one GPU: one phase at a time
    seen = {"peak_compile_workers": peak, "threads": runner.compile_threads(1)}
    peak_file.write_text(json.dumps(seen))
    return status


# -- preflight -------------------------------------------------------------------------------


def _driver_version(torch: Any) -> str | None:
    """The CUDA driver's version as the driver reports it (cuDriverGetVersion), or None."""
    import ctypes

    try:
        lib = ctypes.CDLL("libcuda.so.1")
        version = ctypes.c_int()
        if lib.cuDriverGetVersion(ctypes.byref(version)) != 0:
            return None
        return f"{version.value // 1000}.{version.value % 1000 // 10}"
    except (OSError, AttributeError):
        return None


def _module_version(name: str) -> str | None:
    try:
        module = __import__(name)
    except Exception:
        return None
    return str(getattr(module, "__version__", "unknown"))


def preflight_facts() -> tuple[int, dict[str, Any]]:
    """What the machine offers, as torch sees it, and the preflight exit status."""
    facts: dict[str, Any] = {"python": sys.version.split()[0], "executable": sys.executable}
    facts["nproc"] = os.cpu_count()
    with contextlib.suppress(AttributeError):
        facts["affinity"] = len(os.sched_getaffinity(0))
    try:
        import ci_fxcache.cli  # noqa: F401  (the toolkit and its own needs: yaml, jinja2, ...)
        from ci_fxcache.env import cpus

        facts["usable_cpus"] = cpus.usable_cpus()
    except Exception as exc:
        facts["stop"] = f"the toolkit cannot be imported ({type(exc).__name__}: {exc})"
        return PREFLIGHT_STOP, facts
    try:
        import torch
    except Exception as exc:
        facts["stop"] = f"torch is not importable by {sys.executable} ({type(exc).__name__}: {exc})"
        return PREFLIGHT_STOP, facts
    facts.update(
        torch=torch.__version__,
        cuda=torch.version.cuda,
        hip=getattr(torch.version, "hip", None),
        triton=_module_version("triton"),
        timm=_module_version("timm"),
        transformers=_module_version("transformers"),
        driver=_driver_version(torch),
    )
    available = torch.cuda.is_available()
    facts["cuda_available"] = available
    facts["gpus"] = []
    if not available:
        why = "a CPU build of torch" if not torch.version.cuda and not facts["hip"] else ""
        facts["no_cuda"] = why or "torch.cuda.is_available() is False"
        return PREFLIGHT_NO_CUDA, facts
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        uuid = str(getattr(p, "uuid", "") or "")
        facts["gpus"].append(
            {
                "index": i,
                "name": p.name,
                "capability": f"{p.major}.{p.minor}",
                "memory_gib": round(p.total_memory / 2**30, 1),
                "multiprocessors": p.multi_processor_count,
                "uuid": (uuid if uuid.startswith("GPU-") else f"GPU-{uuid}") if uuid else "",
                "arch": getattr(p, "gcnArchName", None),
            }
        )
    return PREFLIGHT_GPU, facts


def preflight(work: Path) -> int:
    """Print the facts, write `work/preflight.json`; the exit status (see the module doc)."""
    status, facts = preflight_facts()
    work.mkdir(parents=True, exist_ok=True)
    (work / "preflight.json").write_text(json.dumps(facts, indent=1))
    for key, value in facts.items():
        if key != "gpus":
            print(f"preflight: {key} = {value}")
    for gpu in facts.get("gpus", []):
        print("preflight: gpu", json.dumps(gpu))
    if status == PREFLIGHT_STOP:
        print(f"preflight: STOP: {facts['stop']}")
    elif status == PREFLIGHT_NO_CUDA:
        print(f"preflight: no CUDA device seen by torch ({facts['no_cuda']}): CPU fallback")
    return status


# -- evidence --------------------------------------------------------------------------------


def listing(directory: Path, out: Path) -> None:
    """`size path` for every file under `directory` (the cache listing of the evidence)."""
    lines = [
        f"{p.stat().st_size:>10} {p.relative_to(directory)}"
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    ]
    out.write_text("\n".join(lines) + "\n")


def evidence(work: Path, python: str) -> int:
    """The cache listing of each run's directory and each results document's markdown report."""
    skip = {"results", "reports", "logs"}
    for directory in sorted(d for d in work.iterdir() if d.is_dir()):
        if directory.name not in skip and not directory.name.startswith("tmp-"):
            listing(directory, work / f"listing-{directory.name}.txt")
    status = 0
    for doc in sorted((work / "results").glob("*.json")):
        md = work / "reports" / f"{doc.stem}.md"
        argv = [python, "-m", "ci_fxcache", "report", str(doc), "--format", "md", "-o", str(md)]
        if subprocess.run(argv, check=False, timeout=60).returncode != 0:
            print(f"report {doc.name}: failed")
            status = 1
    return status


ARCHIVED = ("results", "reports", "logs")


def archive(work: Path, target: Path) -> int:
    """One archive of the evidence: results, reports, phase logs, listings, fingerprints,
    compile-worker peaks, the steps' exit statuses and every reference (no cache contents)."""
    import tarfile

    with tarfile.open(target, "w:gz") as tar:
        for name in ARCHIVED:
            if (work / name).is_dir():
                tar.add(work / name, arcname=name)
        for path in sorted(work.iterdir()):
            if path.is_file():
                tar.add(path, arcname=path.name)
        for ref in sorted(work.glob("*/*/reference.json")):
            tar.add(ref, arcname=str(Path("references") / ref.relative_to(work)))
    print(f"archive: {target} ({target.stat().st_size} bytes)")
    return 0


def _results(work: Path) -> dict[str, list[dict[str, Any]]]:
    """Each verify run's combos, by run name (work/results/NAME.json, in name order)."""
    found: dict[str, list[dict[str, Any]]] = {}
    for path in sorted((work / "results").glob("*.json")):
        with contextlib.suppress(OSError, ValueError, KeyError):
            found[path.stem] = list(json.loads(path.read_text())["combos"])
    return found


def _seconds(phase: dict[str, Any] | None) -> str:
    value = (phase or {}).get("compile_s")
    return f"{value:.1f}" if isinstance(value, (int, float)) else "-"


def _triton(phase: dict[str, Any] | None) -> str:
    phase = phase or {}
    if phase.get("triton_uncounted"):
        text = "uncounted"
    elif "triton_kernels_built" in phase:
        text = str(phase["triton_kernels_built"])
    else:
        text = "-"
    drivers = len(phase.get("triton_driver_builds") or [])
    return f"{text}+{drivers}drv" if drivers else text


def table(work: Path) -> str:
    """The final table: one row per combination of every run, within TABLE_LIMIT characters."""
    head = (
        f"{'run':<16} {'combination':<58} {'verdict':<8} {'cause':<17} "
        f"{'cold s':>6} {'hot s':>6} {'hit/miss':>8} {'triton':>9}"
    )
    rows = [head, "-" * len(head)]
    for name, combos in _results(work).items():
        for c in combos:
            combo = (
                str(c.get("id", "?")).replace("-fxgraph-", "-fx-").replace("-precompile-", "-pc-")
            )
            rows.append(
                f"{name[:16]:<16} {combo[:58]:<58} {str(c.get('verdict'))[:8]:<8} "
                f"{str(c.get('cause'))[:17]:<17} {_seconds(c.get('cold')):>6} "
                f"{_seconds(c.get('hot')):>6} "
                f"{str(c.get('hits', 0)) + '/' + str(c.get('misses', 0)):>8} "
                f"{_triton(c.get('hot')):>9}"
            )
    rows.append("triton: kernels the hot phase compiled (+N drv: Triton C modules built)")
    text = ""
    for kept, row in enumerate(rows):
        if len(text) + len(row) + 80 > TABLE_LIMIT:
            text += f"... {len(rows) - kept} more rows in the results (evidence archive)\n"
            break
        text += row + "\n"
    return text


def check(out: Path, work: Path) -> int:
    """Evaluate the run in `work` (the script's scratch dir); write `out/checks.json`; the exit
    status."""
    checks: list[dict[str, Any]] = []

    def record(name: str, ok: bool, detail: str) -> None:
        checks.append({"check": name, "ok": ok, "detail": detail})
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")

    preflight_doc: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        preflight_doc = json.loads((work / "preflight.json").read_text())
    runs = _results(work)
    cuda = [c for cs in runs.values() for c in cs if c.get("device") == "cuda"]
    if preflight_doc.get("stop") or not preflight_doc:
        record("preflight", False, str(preflight_doc.get("stop") or "no preflight.json"))
    elif not preflight_doc.get("gpus"):
        record("preflight", True, f"no GPU ({preflight_doc.get('no_cuda')}): CPU fallback")
        causes = {c.get("cause") for c in cuda}
        # a mechanism this torch lacks is gated first (precompile-api before torch 2.15)
        expected = {"no-device", "torch-too-old"}
        record("skips", causes <= expected, f"CUDA causes {sorted(map(str, causes))}")
    else:
        _gpu_checks(work, runs, cuda, record)
    # The env-checks subcommand (issue 28 §2-4) writes its own checks here, in the same shape.
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        for item in json.loads((work / ENV_CHECKS).read_text())["checks"]:
            record(f"env: {item['check']}", bool(item["ok"]), str(item.get("detail", "")))
    for peak_file in sorted(work.glob("*.peak.json")):
        seen = json.loads(peak_file.read_text())
        threads = seen["threads"]
        bound = 0 if threads == 1 else 1 + threads  # Inductor's sidecar plus its workers
        record(
            f"compile workers ({peak_file.name.removesuffix('.peak.json')})",
            seen["peak_compile_workers"] <= bound,
            f"peak {seen['peak_compile_workers']}, bound {bound} ({threads} threads a phase)",
        )
    measured = side_by_side(runs)
    if measured:
        print("measured:", json.dumps(measured))
    verdicts: dict[str, int] = {}
    for combo in (c for cs in runs.values() for c in cs):
        verdicts[combo["verdict"]] = verdicts.get(combo["verdict"], 0) + 1
    print("verdicts:", json.dumps(verdicts))
    failed = [c["check"] for c in checks if not c["ok"]]
    (out / "checks.json").write_text(
        json.dumps(
            {"checks": checks, "verdicts": verdicts, "measured": measured, "failed": failed},
            indent=1,
        )
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
    checks = [
        {
            "check": " ".join(f"{k}={v}" for k, v in row["setting"].items()) or "unset",
            "ok": row not in failed,
            "detail": f"torch {row['torch']!r}; nvidia-smi {row['nvidia-smi']!r}; "
            f"libcuda {row['libcuda']!r}",
        }
        for row in rows
    ]
    doc = {"checks": checks, "rows": rows, "failed": len(failed), "nvidia_smi": smi}
    (out / "env-checks.json").write_text(json.dumps(doc, indent=1))
    return 1 if failed else 0


def side_by_side(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The cold and hot compile times of the CUDA combinations that ran both under
    `--device auto` (beside the CPU stage) and alone: their sums and the ratio auto / alone
    (issue 28 §1: about 1 when GPU phases are never timed beside CPU phases). A measurement
    printed for the reader, not a pass/fail check: one run's timings are noisy."""
    alone = {c["id"]: c for c in runs.get("cuda-alone", []) if c.get("verdict") != "skipped"}
    both = [(c, alone[c["id"]]) for c in runs.get("default-auto", []) if c["id"] in alone]
    found: dict[str, Any] = {}
    for phase in ("cold", "hot"):
        pairs = [
            (a[phase]["compile_s"], b[phase]["compile_s"])
            for a, b in both
            if (a.get(phase) or {}).get("compile_s") and (b.get(phase) or {}).get("compile_s")
        ]
        if pairs:
            auto_s, alone_s = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
            found[f"{phase}_auto_vs_alone"] = {
                "combinations": len(pairs),
                "auto_s": round(auto_s, 2),
                "alone_s": round(alone_s, 2),
                "ratio": round(auto_s / alone_s, 2),
            }
    return found


def extra_steps(preflight_doc: dict[str, Any] | None) -> list[tuple[str, int, tuple[str, ...]]]:
    """The issue 46 steps for this machine: the modes on any GPU run (the script skips it in
    the CPU fallback, as every GPU step), 2 ranks only with 2 GPUs; None (the dry run, no
    preflight): every step, so the plan shows the most the run can take."""
    if preflight_doc is None:
        return [MODES_STEP, RANKS_STEP]
    gpus = len(preflight_doc.get("gpus") or [])
    return [MODES_STEP] + ([RANKS_STEP] if gpus >= 2 else [])


def _extra_steps(args: list[str]) -> int:
    doc: dict[str, Any] | None = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        doc = json.loads((Path(args[0]) / "preflight.json").read_text())
    for name, cap, argv in extra_steps(doc):
        print(name, cap, *argv)
    return 0


def _mode_and_rank_checks(
    runs: dict[str, list[dict[str, Any]]], record: Callable[[str, bool, str], None]
) -> None:
    """The issue 46 rows, where their steps ran: no mode and no rank is unsafe or an error
    (a mode that cannot run here is skipped with its cause), and each 2-rank combination was
    judged on both ranks."""
    for name in (MODES_STEP[0], RANKS_STEP[0]):
        if name not in runs:
            continue
        combos = runs[name]
        bad = [f"{c['id']}: {c['verdict']} ({c.get('reason')})"[:200] for c in combos
               if c["verdict"] in ("unsafe", "error")]  # fmt: skip
        judged = [c for c in combos if c["verdict"] != "skipped"]
        if name == RANKS_STEP[0]:
            bad += [c["id"] for c in judged if len(c.get("rank_verdicts") or []) != 2]
        record(name, bool(combos) and not bad, f"{len(combos)} combinations; wrong: {bad[:3]}")


def _gpu_checks(
    work: Path,
    runs: dict[str, list[dict[str, Any]]],
    cuda: list[dict[str, Any]],
    record: Callable[[str, bool, str], None],
) -> None:
    by_index = json.loads((work / "fingerprint.json").read_text())
    by_uuid = json.loads((work / "fingerprint-uuid.json").read_text())
    uuid = (work / "uuid").read_text().strip().removeprefix("uuid=")
    probe = by_index.get("probe") or {}
    record("probe", bool(probe.get("ok")), json.dumps(probe.get("fields", []))[:600])
    record(
        "uuid key",
        by_index["scope_key"] == by_uuid["scope_key"],
        f"{by_index['scope_key']} vs {by_uuid['scope_key']} (CUDA_VISIBLE_DEVICES=UUID)",
    )
    ran = [c for c in cuda if c["verdict"] != "skipped"]
    record("ran", bool(ran), f"{len(ran)} of {len(cuda)} CUDA combinations ran")
    _mode_and_rank_checks(runs, record)
    ran = [c for c in ran if int(c.get("ranks") or 1) == 1]  # ranks hold a device each
    phases = [(c["id"], n, c[n]) for c in ran for n in ("cold", "hot") if c.get(n)]
    wrong = [f"{i} {n}" for i, n, p in phases if (p.get("gpu") or {}).get("visible") != uuid]
    record("slots", not wrong, f"phases not on {uuid}: {wrong[:5]}")
    moved = [c["id"] for c in ran if c["hot"] and c["hot"].get("gpu") != c["cold"].get("gpu")]
    record("hot on cold's device", not moved, f"moved: {moved[:5]}")
    skipped = [c for c in cuda if c["verdict"] == "skipped"]
    uncaused = [c["id"] for c in skipped if not c.get("cause")]
    record("skip causes", not uncaused, f"skipped without cause: {uncaused[:5]}")
    hot = [c["hot"] for c in ran if c.get("hot") and c["hot"].get("status") == "ok"]
    silent = [
        p.get("pid") for p in hot if "triton_count" not in p and not p.get("triton_uncounted")
    ]
    record("triton counted", not silent, f"hot phases neither counted nor said why: {silent[:5]}")
    listing_file = work / "listing-default-auto.txt"
    files = listing_file.read_text() if listing_file.exists() else ""
    cubins = files.count(".cubin\n") + files.count(".hsaco\n")
    drivers = sum("cuda_utils" in line or "hip_utils" in line for line in files.splitlines())
    record(
        "triton cache",
        cubins > 0 and drivers > 0,
        f"{cubins} kernel binaries, {drivers} driver modules",
    )
    second = [c for c in runs.get("second-hot", []) if c["verdict"] != "skipped"]
    hits = [c["id"] for c in second if c.get("hits") and not c.get("misses")]
    record(
        "second hot process",
        bool(second) and len(hits) == len(second),
        f"{len(hits)} of {len(second)} hit",
    )


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "watch":
        logs = None
        rest = argv[2:]
        if rest[:1] == ["--logs"] and len(rest) >= 3:
            logs = (Path(rest[1]), Path(rest[2]))
            rest = rest[3:]
        if rest[:1] == ["--"]:
            return watch(Path(argv[1]), rest[1:], logs)
    command = SUBCOMMANDS.get(argv[0]) if argv else None
    if command is not None:
        return command(argv[1:])
    print(__doc__, file=sys.stderr)
    return 2


def _listing_status(directory: Path, out: Path) -> int:
    listing(directory, out)
    return 0


def _has(args: list[str]) -> int:
    return 0 if len(args) == 1 and args[0] in SUBCOMMANDS else 1


def _write_table(args: list[str]) -> int:
    text = table(Path(args[0]))
    Path(args[1]).write_text(text)
    print(text, end="")
    return 0


SUBCOMMANDS: dict[str, Callable[[list[str]], int]] = {
    "preflight": lambda a: preflight(Path(a[0])),
    "evidence": lambda a: evidence(Path(a[0]), a[1]),
    "archive": lambda a: archive(Path(a[0]), Path(a[1])),
    "listing": lambda a: _listing_status(Path(a[0]), Path(a[1])),
    "check": lambda a: check(Path(a[0]), Path(a[1])),
    "table": _write_table,
    "env-checks": lambda a: env_checks(Path(a[0])),
    "has": _has,
    "extra-steps": _extra_steps,
}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
