"""Writes the results documents in tests/data/ (schema fxcache-results/2, docs/contracts.md).

They stand for real `fxcache verify --json` output of GPU and CPU runners: every verdict, the
causes a report distinguishes (a compiler failure among them), notes and an explained miss,
several dtypes, dynamic modes and mechanisms. Regenerate with
`python tests/data/make_results.py` (deterministic: fixed times, no absolute paths).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CREATED = "2026-11-29T10:00:00Z"


def fingerprint(torch: str, cuda: str | None, gpus: list[tuple[str, str, str]]) -> dict[str, Any]:
    archs = sorted({g[2] for g in gpus})
    return {
        "torch_version": torch,
        "torch_git_version": "0f5e1ad4a3b7c5d6e7f8091a2b3c4d5e6f708192",
        "cuda_version": cuda,
        "hip_version": None,
        "triton_version": "3.5.0" if cuda else None,
        "python_implementation": "cpython",
        "python_version": "3.12.7",
        "python_abi": "cp312",
        "os": "linux",
        "machine": "x86_64",
        "gpus": [
            {"index": i, "name": n, "capability": c, "arch": a} for i, (n, c, a) in enumerate(gpus)
        ],
        "driver_version": "570.86.15" if cuda else None,
        "cpu_isa": "avx512",
        "cpu_capability_override": None,
        "salt": "",
        "python_executable": "/opt/venv/bin/python",
        "torch_path": "/opt/venv/lib/python3.12/site-packages/torch",
        "gpu_source": "nvidia-smi" if cuda else "none",
        "schema": 1,
        "device_kind": "cuda" if cuda else "cpu",
        "gpu_archs": archs if cuda else [],
    }


def phase(status: str, compile_s: float | None, counters: dict[str, int], log: str, **kw: Any):
    return {
        "status": status,
        "compile_s": compile_s,
        "wall_s": None if compile_s is None else round(compile_s + 3.1, 2),
        "counters": counters,
        "returncode": kw.pop("returncode", 0 if status == "ok" else 1),
        "signal": kw.pop("signal", None),
        "log_tail": log,
        **kw,
    }


DYN = {"false": "static", "true": "dynamic", "mark": "mark"}
SHORT = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def combo(
    device,
    dtype,
    dynamic,
    mechanism,
    verdict,
    reason,
    *,
    speedup=None,
    cold=None,
    hot=None,
    err=(0.0, 1.2e-06),
    hits=None,
    misses=None,
    workload="sin_matmul",
    training=True,
    cause=None,
    notes=(),
    explain=None,
):
    cid = (  # as ci_fxcache.verify.matrix.Combo.id makes it (its directory name)
        f"{re.sub(r'[^A-Za-z0-9_.]+', '_', workload)}-{device}-{dtype}-{DYN[dynamic]}"
        f"-{mechanism}-{'train' if training else 'infer'}"
    )
    return {
        "id": cid,
        "workload": workload,
        "device": device,
        "dtype": dtype,
        "dynamic": dynamic,
        "mechanism": mechanism,
        "training": training,
        "verdict": verdict,
        "reason": reason,
        "speedup": speedup,
        "cold": cold,
        "hot": hot,
        "max_abs_err": {"hot_vs_cold": err[0], "cold_vs_eager": err[1]},
        "tolerance": {"atol": 1e-05, "rtol": 1.3e-06}
        if dtype == "float32"
        else {"atol": 1e-02, "rtol": 1.6e-02},
        "hits": hits or 0,
        "misses": misses or 0,
        "cause": cause or DEFAULT_CAUSE[verdict],
        "notes": [dict(n) for n in notes],
        "explain": explain,
    }


DEFAULT_CAUSE = {
    "safe": "hit",
    "no-gain": "slow",
    "unsafe": "hot-mismatch",
    "error": "cold-error",
    "skipped": "unsupported",
}


def ok_pair(cold_s, hot_s, hot_counters, recompiles=0):
    cold = phase(
        "ok",
        cold_s,
        {"fxgraph_cache_miss": 2, "aot_autograd_cache_miss": 1},
        "compiled sin_matmul (forward+backward)\ncold compile done",
    )
    hot = phase(
        "ok", hot_s, hot_counters, "loaded from cache\nhot compile done", recompiles=recompiles
    )
    return cold, hot


def safe(device, dtype, dynamic, mechanism, cold_s, hot_s, **kw):
    counters = (
        {"dynamo_cache_hit": 1}
        if mechanism == "precompile"
        else {"fxgraph_cache_hit": 2, "aot_autograd_cache_hit": 1}
    )
    cold, hot = ok_pair(cold_s, hot_s, counters)
    shown = ", ".join(f"{k.replace('_cache', '')} {v}" for k, v in counters.items())
    sp = round(cold_s / hot_s, 1)
    hits = sum(counters.values())
    return combo(
        device,
        dtype,
        dynamic,
        mechanism,
        "safe",
        f"hot load hit ({shown}), outputs bitwise equal, {sp}x faster",
        speedup=sp,
        cold=cold,
        hot=hot,
        hits=hits,
        misses=0,
        **kw,
    )


def skipped(device, dtype, dynamic, mechanism, reason, cause, **kw):
    return combo(
        device, dtype, dynamic, mechanism, "skipped", reason, err=(None, None), cause=cause, **kw
    )


def state(hit: bool, key: str, invalidated: list[dict[str, Any]]) -> dict[str, Any]:
    """Restore's state object (schema fxcache-cache-state/1, docs/contracts.md)."""
    root = "/opt/fxcache"
    return {
        "schema": "fxcache-cache-state/1",
        "store": "local",
        "root": root,
        "scope_key": key,
        "hit": hit,
        "read_only": False,
        "read_only_reason": None,
        "mode": "in-place",
        "scope_dir": f"{root}/{key}",
        "inductor_dir": f"{root}/{key}/inductor",
        "triton_dir": f"{root}/{key}/triton",
        "verify_dir": f"{root}/{key}/verify",
        "overlay_dir": None,
        "files": 41 if hit else 0,
        "bytes": 1234567 if hit else 0,
        "verify_mode": "fast",
        "signed": False,
        "signature_checked": False,
        "invalidated": invalidated,
        "quarantined": [],
        "lease": None,
        "redis": None,
        "fingerprint": None,
        "restored_at": CREATED,
        "state_file": "/tmp/fxcache-restore-state.json",
    }


def document(runner, fp, scope_key, combos, cache, matrix):
    summary = {v: 0 for v in ("safe", "no-gain", "unsafe", "error", "skipped")}
    for c in combos:
        summary[c["verdict"]] += 1
    return {
        "schema": "fxcache-results/2",
        "fxcache_version": "0.1.0",
        "created_at": CREATED,
        "report_id": "fxcache",
        "runner": {"name": runner, "os": "linux"},
        "fingerprint": fp,
        "scope_key": scope_key,
        "cache": cache,
        "settings": {
            "phase": "both",
            "min_speedup": 2.0,
            "compare": "bitwise",
            "fail_on": "unsafe",
            "timeout_s": 600,
        },
        "matrix": matrix,
        "combos": combos,
        "summary": summary,
    }


def h200(runner="gpu-h200-01"):
    fp = fingerprint("2.13.0+cu128", "12.8", [("NVIDIA H200", "9.0", "sm90")])
    c = "cuda"
    cold, hot = ok_pair(8.4, 8.3, {"fxgraph_cache_hit": 2, "fxgraph_lookup_write_file": 2})
    hot["kernels_built"] = 6
    mega_nogain = combo(
        c,
        "bfloat16",
        "true",
        "mega",
        "no-gain",
        "counters report a hit (fxgraph_hit 2) but the hot process rebuilt 6 GPU kernel files "
        "(0.99x); outputs bitwise equal",
        speedup=0.99,
        cold=cold,
        hot=hot,
        hits=2,
        misses=0,
        cause="rebuilt",
        explain={"differs": [], "kernels_built": 6},
    )
    cold_u, _ = ok_pair(9.6, 0.03, {})
    hot_u = phase(
        "ok",
        0.03,
        {"dynamo_cache_hit": 1},
        "loaded precompiled graph\nmax abs diff 6.25e-02",
        recompiles=0,
    )
    wrong = combo(
        c,
        "bfloat16",
        "true",
        "precompile",
        "unsafe",
        "hot outputs differ from the cold compile (bitwise comparison, max abs err 0.0625)",
        speedup=320.0,
        cold=cold_u,
        hot=hot_u,
        err=(0.0625, 3.1e-03),
        hits=1,
        misses=0,
    )
    cold_c, _ = ok_pair(9.9, 0.0, {})
    hot_c = phase(
        "crash",
        None,
        {},
        "Fatal Python error: Segmentation fault\n\x1b[31mcore dumped\x1b[0m",
        returncode=-11,
        signal="SIGSEGV",
        recompiles=0,
    )
    crash = combo(
        c,
        "float16",
        "true",
        "precompile",
        "unsafe",
        "hot process crashed (killed by SIGSEGV: core dumped)",
        cold=cold_c,
        hot=hot_c,
        err=(None, 2.0e-03),
        cause="crash",
    )
    cold_e = phase(
        "error",
        None,
        {},
        "torch._inductor.exc.InductorError: LoweringException: mark_dynamic | unsupported",
    )
    err = combo(
        c,
        "float16",
        "mark",
        "fxgraph",
        "error",
        "cold compile failed (error: LoweringException: mark_dynamic | unsupported); "
        "not a cache problem",
        cold=cold_e,
        hot=phase("not-run", None, {}, "", returncode=None, error="cold phase failed"),
        err=(None, None),
        cause="cold-error",
    )
    cold_m, _ = ok_pair(8.7, 0.0, {})
    mismatch = combo(
        c,
        "float16",
        "false",
        "fxgraph",
        "error",
        "the cold compiled output differs from eager beyond the fp64-referenced accuracy check "
        "(compiled RMSE 4.1e-02, eager RMSE 2.0e-03); a compiler problem, not a cache problem",
        cold=cold_m,
        hot=phase("not-run", None, {}, "", returncode=None, error="cold result rejected"),
        err=(None, 6.3e-02),
        cause="compiler-mismatch",
    )
    combos = [
        safe(c, "float32", "false", "fxgraph", 8.1, 0.9),
        safe(c, "float32", "false", "precompile", 8.3, 0.03),
        safe(c, "float32", "true", "fxgraph", 9.8, 1.4),
        safe(c, "bfloat16", "false", "fxgraph", 8.2, 0.9),
        safe(c, "bfloat16", "false", "precompile", 8.0, 0.03),
        safe(c, "bfloat16", "true", "fxgraph", 9.9, 1.6),
        wrong,
        mega_nogain,
        safe(c, "bfloat16-autocast", "true", "precompile", 9.6, 1.3),
        crash,
        err,
        mismatch,
        skipped(
            c,
            "bfloat16",
            "true",
            "remote",
            "no Redis URL: pass --redis-url to check the remote cache",
            "unsupported",
        ),
    ]
    key = "fxcache-v1-linux-x86_64-cp312-torch2.13.0+cu128-cu12.8-sm90-3f0c2a9b71de"
    cache = state(
        True,
        key,
        [
            {
                "scope": "fxcache-v1-linux-x86_64-cp312-torch2.12.1+cu128-cu12.8-sm90-9a8b7c6d5e4f",
                "reason": "upgrade",
                "versions": "torch 2.12.1+cu128 -> 2.13.0+cu128",
                "bytes": 734003200,
            }
        ],
    )
    matrix = {
        "devices": ["cuda"],
        "dtypes": ["float32", "bfloat16", "float16", "bfloat16-autocast"],
        "dynamic": ["false", "true", "mark"],
        "mechanisms": ["fxgraph", "precompile", "mega", "remote"],
        "training": [True],
        "workloads": ["sin_matmul"],
    }
    return document(
        runner,
        fp,
        "fxcache-v1-linux-x86_64-cp312-torch2.13.0+cu128-cu12.8-sm90-3f0c2a9b71de",
        combos,
        cache,
        matrix,
    )


def small_gpu(runner, name, cap, arch, scope_hash, bf16_dynamic):
    fp = fingerprint("2.13.0+cu128", "12.8", [(name, cap, arch)])
    c = "cuda"
    combos = [
        safe(c, "float32", "false", "precompile", 11.0, 0.05),
        safe(c, "float32", "true", "precompile", 12.0, 0.06),
    ]
    combos.append(bf16_dynamic)
    matrix = {
        "devices": ["cuda"],
        "dtypes": ["float32", "bfloat16"],
        "dynamic": ["false", "true"],
        "mechanisms": ["precompile"],
        "training": [True],
        "workloads": ["sin_matmul"],
    }
    return document(
        runner,
        fp,
        f"fxcache-v1-linux-x86_64-cp312-torch2.13.0+cu128-cu12.8-{arch}-{scope_hash}",
        combos,
        None,
        matrix,
    )


def a100():
    cold, _ = ok_pair(12.0, 0.05, {})
    hot = phase("ok", 0.05, {"dynamo_cache_hit": 1}, "max abs diff 3.1e-02")
    bad = combo(
        "cuda",
        "bfloat16",
        "true",
        "precompile",
        "unsafe",
        "hot outputs differ from the cold compile (bitwise comparison, max abs err 0.03125)",
        speedup=240.0,
        cold=cold,
        hot=hot,
        err=(0.03125, 2.9e-03),
        hits=1,
        misses=0,
    )
    return small_gpu("gpu-a100-01", "NVIDIA A100-SXM4-80GB", "8.0", "sm80", "77aa01b2c3d4", bad)


def t4():
    return small_gpu(
        "gpu-t4-01",
        "Tesla T4",
        "7.5",
        "sm75",
        "5e6f70819a2b",
        skipped(
            "cuda",
            "bfloat16",
            "true",
            "precompile",
            "bfloat16 needs sm80+ (this GPU is sm75)",
            "gpu-too-old",
        ),
    )


def h200_plain(runner):
    d = small_gpu(
        runner,
        "NVIDIA H200",
        "9.0",
        "sm90",
        "3f0c2a9b71de",
        safe("cuda", "bfloat16", "true", "precompile", 10.0, 0.05),
    )
    return d


def cpu():
    fp = fingerprint("2.13.0+cpu", None, [])
    c = "cpu"
    cold, hot = ok_pair(8.4, 7.9, {"fxgraph_cache_hit": 2, "fxgraph_lookup_write_file": 2})
    hot["kernels_built"] = 2
    mega = combo(
        c,
        "float32",
        "false",
        "mega",
        "no-gain",
        "counters report a hit (fxgraph_hit 2) but the hot process rebuilt 2 C++ kernel files "
        "(1.06x); outputs bitwise equal",
        speedup=1.06,
        cold=cold,
        hot=hot,
        hits=2,
        misses=0,
        cause="rebuilt",
        explain={"differs": [], "kernels_built": 2},
    )
    cold_x, hot_x = ok_pair(10.2, 9.8, {"fxgraph_cache_miss": 2, "aot_autograd_cache_miss": 1})
    missed = combo(
        c,
        "float32",
        "true",
        "mega",
        "no-gain",
        "the FX graph cache missed on hot load (fxgraph_miss 2); the key differs in "
        "inductor config freezing",
        speedup=1.04,
        cold=cold_x,
        hot=hot_x,
        hits=0,
        misses=3,
        cause="miss",
        explain={
            "differs": [{"component": "inductor_config.freezing", "cold": False, "hot": True}]
        },
    )
    recompiles = {
        "kind": "model-recompiles",
        "text": "the second shape recompiles in cold and hot alike (guard: L['x'].size()[0] == 8)",
        "guard": "L['x'].size()[0] == 8",
    }
    partial = safe(
        c,
        "bfloat16",
        "true",
        "fxgraph",
        12.0,
        1.3,
        cause="partial-hit",
        notes=[{"kind": "uncacheable", "text": "one graph AOTAutograd bypasses (a custom op)"}],
    )
    combos = [
        safe(c, "float32", "false", "fxgraph", 9.1, 1.2),
        safe(c, "float32", "true", "fxgraph", 11.3, 1.4, notes=[recompiles]),
        safe(c, "bfloat16", "false", "fxgraph", 9.4, 1.1),
        partial,
        mega,
        missed,
        skipped("cuda", "bfloat16", "true", "fxgraph", "no CUDA device", "no-device"),
    ]
    matrix = {
        "devices": ["cpu", "cuda"],
        "dtypes": ["float32", "bfloat16"],
        "dynamic": ["false", "true"],
        "mechanisms": ["fxgraph", "mega"],
        "training": [True],
        "workloads": ["sin_matmul"],
    }
    return document(
        "cpu-01",
        fp,
        "fxcache-v1-linux-x86_64-cp312-torch2.13.0+cpu-cpu-59b2e5fecf37",
        combos,
        state(False, "fxcache-v1-linux-x86_64-cp312-torch2.13.0+cpu-cpu-59b2e5fecf37", []),
        matrix,
    )


def nothing_safe():
    d = cpu()
    d["combos"] = [c for c in d["combos"] if c["verdict"] in ("no-gain", "skipped")]
    d["summary"] = {
        v: sum(c["verdict"] == v for c in d["combos"])
        for v in ("safe", "no-gain", "unsafe", "error", "skipped")
    }
    return d


# A fleet as a team runs it: four architectures, five real-looking model factories, 60
# combinations each (3 dtypes x 2 dynamic modes x 2 mechanisms per model), a few problems.
FLEET_MODELS = (
    "myorg.models.very_long_module_name:build_model_factory",
    "acme_research.vision.backbones.convnext_v2:convnext_v2_large_384",
    "acme_research.nlp.llama_finetune.modeling:build_llama3_8b_lora",
    "internal.recsys.two_tower_retrieval.model:make_two_tower_model",
    "speech.asr.conformer_ctc.factory:conformer_ctc_xlarge_streaming",
)
FLEET_GPUS = {  # arch: (GPU name, capability, runner, ROCm)
    "sm80": ("NVIDIA A100-SXM4-80GB", "8.0", "gpu-a100-01", False),
    "sm90": ("NVIDIA H200", "9.0", "gpu-h200-01", False),
    "sm100": ("NVIDIA B200", "10.0", "gpu-b200-01", False),
    "gfx942": ("AMD Instinct MI300X", "9.4", "gpu-mi300x-01", True),
}
CI = {  # what verify records inside GitHub Actions (docs/reports.md)
    "sha": "abc1234def5678901234567890abcdef12345678",
    "server_url": "https://github.com",
    "repository": "acme-ml/train-stack",
    "run_id": "12941873650",
    "run_number": "123",
}


def _fleet_problem(arch: str, workload: str, dtype: str, dynamic: str, mechanism: str):
    """The problem (verdict, cause, reason) a fleet combination has on `arch`, or None."""
    llama, convnext, speech = FLEET_MODELS[2], FLEET_MODELS[1], FLEET_MODELS[4]
    key = (arch, workload, dtype, dynamic, mechanism)
    problems = {
        ("sm80", llama, "bfloat16", "true", "precompile"): (
            "unsafe",
            "hot-mismatch",
            "hot outputs differ from the cold compile (max abs err 0.031)",
        ),
        ("gfx942", llama, "bfloat16", "false", "precompile"): (
            "unsafe",
            "hot-mismatch",
            "hot outputs differ from the cold compile (max abs err 0.125)",
        ),
        ("sm100", llama, "bfloat16", "true", "precompile"): (
            "unsafe",
            "crash",
            "hot process crashed (killed by SIGSEGV: core dumped)",
        ),
        ("sm100", convnext, "bfloat16", "true", "precompile"): (
            "unsafe",
            "hot-mismatch",
            "hot outputs differ from the cold compile (max abs err 0.0625)",
        ),
        ("sm100", speech, "float16", "false", "fxgraph"): (
            "error",
            "compiler-mismatch",
            "the cold compiled output differs from eager beyond the accuracy check",
        ),
        ("sm100", FLEET_MODELS[0], "float32", "true", "fxgraph"): (
            "no-gain",
            "miss",
            "the FX graph cache missed on hot load (fxgraph_miss 3)",
        ),
    }
    return problems.get(key)


def fleet_shard(arch: str) -> dict[str, Any]:
    """One architecture's results document of the 4 x 60 fleet (deterministic)."""
    name, cap, runner, rocm = FLEET_GPUS[arch]
    fp = fingerprint("2.13.0+rocm6.4" if rocm else "2.13.0+cu128", "12.8", [(name, cap, arch)])
    if rocm:
        fp.update(cuda_version=None, hip_version="6.4.43482", driver_version="6.12.12")
        fp["gpu_source"] = "rocminfo"
    combos = []
    n = 0
    for workload in FLEET_MODELS:
        for dtype in ("float32", "bfloat16", "float16"):
            for dynamic in ("false", "true"):
                for mechanism in ("fxgraph", "precompile"):
                    n += 1
                    cold_s = round(31.0 + (n * 7.3) % 40, 1)
                    hot_s = round(cold_s / (3.0 + (n % 5) * 0.6), 1)
                    if mechanism == "precompile":
                        hot_s = round(hot_s / 2, 1)
                    kw = {"workload": workload}
                    if rocm and dtype == "float16" and mechanism == "precompile" and n % 4 == 0:
                        combos.append(
                            skipped(
                                "cuda",
                                dtype,
                                dynamic,
                                mechanism,
                                "caching precompile of float16 is not supported on ROCm here",
                                "unsupported",
                                **kw,
                            )
                        )
                        continue
                    problem = _fleet_problem(arch, workload, dtype, dynamic, mechanism)
                    if problem is None:
                        combos.append(safe("cuda", dtype, dynamic, mechanism, cold_s, hot_s, **kw))
                        continue
                    verdict, cause, reason = problem
                    cold, hot = ok_pair(cold_s, hot_s, {"fxgraph_cache_hit": 2})
                    cold["log_tail"] = f"compiled {workload.split(':')[-1]}\ncold compile done"
                    extra: dict[str, Any] = {"cause": cause}
                    if cause == "crash":
                        hot = phase(
                            "crash",
                            None,
                            {},
                            "Fatal Python error: Segmentation fault",
                            returncode=-11,
                            signal="SIGSEGV",
                        )
                        extra["err"] = (None, 2.0e-03)
                    elif cause == "hot-mismatch":
                        hot["log_tail"] = "loaded precompiled graph\nmax abs diff 6.25e-02"
                        extra.update(err=(0.0625, 3.1e-03), hits=1)
                    elif cause == "compiler-mismatch":
                        hot = phase("not-run", None, {}, "", returncode=None)
                        extra["err"] = (None, 6.3e-02)
                    elif cause == "miss":
                        hot_s = round(cold_s / 1.1, 1)
                        hot["compile_s"] = hot_s
                        hot["log_tail"] = "FX graph cache miss: key differs\nhot compile done"
                        extra.update(
                            speedup=round(cold_s / hot_s, 2),
                            misses=3,
                            explain={
                                "differs": [
                                    {
                                        "component": "inductor_config.freezing",
                                        "cold": False,
                                        "hot": True,
                                    }
                                ]
                            },
                        )
                    combos.append(
                        combo(
                            "cuda",
                            dtype,
                            dynamic,
                            mechanism,
                            verdict,
                            reason,
                            cold=cold,
                            hot=hot,
                            **kw,
                            **extra,
                        )
                    )
    matrix = {
        "devices": ["cuda"],
        "dtypes": ["float32", "bfloat16", "float16"],
        "dynamic": ["false", "true"],
        "mechanisms": ["fxgraph", "precompile"],
        "training": [True],
        "workloads": list(FLEET_MODELS),
    }
    tag = "rocm6.4-gfx942" if rocm else f"cu12.8-{arch}"
    doc = document(
        runner,
        fp,
        f"fxcache-v1-linux-x86_64-cp312-torch2.13.0-{tag}-{n:04d}{arch:0>8}",
        combos,
        None,
        matrix,
    )
    doc["ci"] = dict(CI)
    return doc


FILES = {
    "results_h200.json": lambda: {**h200(), "ci": dict(CI)},
    "results_cpu.json": cpu,
    "results_nothing_safe.json": nothing_safe,
    "shard_h200.json": lambda: h200_plain("gpu-h200-01"),
    "shard_h200_b.json": lambda: h200_plain("gpu-h200-02"),
    "shard_a100.json": a100,
    "shard_t4.json": t4,
}

if __name__ == "__main__":
    for name, make in FILES.items():
        (HERE / name).write_text(json.dumps(make(), indent=2) + "\n", encoding="utf-8")
        print("wrote", name)
