"""`fxcache key --diff A B` and the merged document's `key_diffs`: how two runners differ."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from tests.conftest import TORCH_PYTHON, RunFxcache

DATA = Path(__file__).parent / "data"
COMBO = "sin_matmul-cuda-float32-static-precompile-train"


def shard(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((DATA / f"shard_{name}.json").read_text())
    return doc


def write(path: Path, doc: dict[str, Any]) -> str:
    path.write_text(json.dumps(doc))
    return str(path)


def diff(run_fxcache: RunFxcache, a: str, b: str) -> tuple[int, dict[str, Any], str]:
    as_json = run_fxcache("key", "--diff", a, b, "--json")
    text = run_fxcache("key", "--diff", a, b)
    assert as_json.returncode == text.returncode, (as_json.stderr, text.stderr)
    return as_json.returncode, json.loads(as_json.stdout), text.stdout


def test_results_documents_of_two_gpu_kinds_differ_in_a_keyed_field(
    run_fxcache: RunFxcache,
) -> None:
    code, result, text = diff(
        run_fxcache, str(DATA / "shard_h200.json"), str(DATA / "shard_a100.json")
    )
    assert code == 1  # different scopes: two caches
    assert not result["same_scope"]
    assert result["keyed"] == [
        {"field": "gpu_archs", "a": ["sm90"], "b": ["sm80"]},
        {"field": "gpu_models", "a": ["nvidia_h200"], "b": ["nvidia_a100_sxm4_80gb"]},
    ]
    assert result["reported"] == [
        {"field": "gpus", "a": ["NVIDIA H200 (sm90)"], "b": ["NVIDIA A100-SXM4-80GB (sm80)"]}
    ]
    assert "different scopes" in text and "gpu_archs: ['sm90'] -> ['sm80']" in text


def test_same_scope_is_exit_0_and_names_only_reported_fields(
    run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    other = shard("h200_b")
    other["fingerprint"]["driver_version"] = "580.1"
    code, result, text = diff(
        run_fxcache, str(DATA / "shard_h200.json"), write(tmp_path / "b.json", other)
    )
    assert code == 0
    assert result["same_scope"] and result["keyed"] == []
    assert result["reported"] == [{"field": "driver_version", "a": "570.86.15", "b": "580.1"}]
    assert "same scope" in text


def test_real_fingerprints_name_the_keyed_field_behind_the_hash(
    run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    proc = run_fxcache("fingerprint", "--python", TORCH_PYTHON, "--json")
    assert proc.returncode == 0, proc.stderr
    mine = json.loads(proc.stdout)
    upgraded = copy.deepcopy(mine)
    upgraded["fingerprint"]["torch_version"] = "2.14.1+cpu"
    del upgraded["scope_key"]  # recomputed from the fingerprint
    a, b = write(tmp_path / "a.json", mine), write(tmp_path / "b.json", upgraded)
    code, result, _ = diff(run_fxcache, a, b)
    assert code == 1
    assert result["keyed"] == [
        {"field": "torch_version", "a": mine["fingerprint"]["torch_version"], "b": "2.14.1+cpu"}
    ]
    assert result["a"] == mine["scope_key"] and "torch2.14.1+cpu" in result["b"]
    # A bare key against a fingerprint: only the key's readable parts and its hash compare.
    code, result, _ = diff(run_fxcache, mine["scope_key"], b)
    assert code == 1
    assert [c["field"] for c in result["keyed"]] == ["fingerprint hash", "torch_version"]
    assert result["reported"] == []


def test_bad_sides_are_usage_errors(run_fxcache: RunFxcache, tmp_path: Path) -> None:
    merged = tmp_path / "merged.json"
    assert run_fxcache("merge", str(DATA / "shard_h200.json"), "-o", str(merged)).returncode == 0
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    for side, message in (
        ("no-such-thing", "neither an fxcache scope key nor a file"),
        (str(broken), "cannot read it as JSON"),
        (str(merged), "a merged document holds several environments"),
        (write(tmp_path / "empty.json", {}), "has neither a fingerprint nor a scope key"),
    ):
        proc = run_fxcache("key", "--diff", str(DATA / "shard_h200.json"), side)
        assert proc.returncode == 2, side
        assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def _missed(doc: dict[str, Any]) -> dict[str, Any]:
    combo = next(c for c in doc["combos"] if c["id"] == COMBO)
    combo.update(verdict="no-gain", cause="miss", hits=0, misses=1, reason="hot load missed")
    doc["summary"] = {**doc["summary"], "safe": doc["summary"]["safe"] - 1, "no-gain": 1}
    return doc


def test_merge_records_how_a_missing_runner_differs_from_a_hitting_one(
    run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    # One architecture (sm90), but the second runner's GPU is an H100: torch keys on the GPU
    # name, and so does the scope key (its GPU models): two scopes, the model named as keyed.
    from ci_fxcache.env import scopekey
    from ci_fxcache.env.fingerprint import Fingerprint

    h100 = _missed(shard("h200_b"))
    h100["fingerprint"]["gpus"][0]["name"] = "NVIDIA H100 80GB HBM3"
    h100["scope_key"] = scopekey.scope_key(Fingerprint.from_dict(h100["fingerprint"]))
    a100 = _missed(shard("a100"))
    out = tmp_path / "all.json"
    proc = run_fxcache(
        "merge",
        str(DATA / "shard_h200.json"),
        write(tmp_path / "h100.json", h100),
        write(tmp_path / "a100.json", a100),
        "-o",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    diffs = json.loads(out.read_text())["key_diffs"]
    by_runner = {d["runners"]["b"]: d for d in diffs}
    assert set(by_runner) == {"gpu-h200-02", "gpu-a100-01"}
    assert {d["runners"]["a"] for d in diffs} == {"gpu-h200-01"}
    h100_diff = by_runner["gpu-h200-02"]
    assert not h100_diff["same_scope"] and h100_diff["combos"] == [COMBO]
    assert h100_diff["keyed"] == [
        {"field": "gpu_models", "a": ["nvidia_h200"], "b": ["nvidia_h100_80gb_hbm3"]}
    ]
    assert {
        "field": "gpus",
        "a": ["NVIDIA H200 (sm90)"],
        "b": ["NVIDIA H100 80GB HBM3 (sm90)"],
    } in (h100_diff["reported"])
    other = by_runner["gpu-a100-01"]
    assert other["keyed"] == [
        {"field": "gpu_archs", "a": ["sm90"], "b": ["sm80"]},
        {"field": "gpu_models", "a": ["nvidia_h200"], "b": ["nvidia_a100_sxm4_80gb"]},
    ]
    assert other["a"] == shard("h200")["scope_key"] and other["b"] == a100["scope_key"]


def test_merge_without_misses_has_no_key_diffs(run_fxcache: RunFxcache, tmp_path: Path) -> None:
    out = tmp_path / "all.json"
    proc = run_fxcache(
        "merge", str(DATA / "shard_h200.json"), str(DATA / "shard_a100.json"), "-o", str(out)
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["key_diffs"] == []


def test_bare_keys_of_two_gpu_models_of_one_arch_name_the_runner_pool(
    run_fxcache: RunFxcache,
) -> None:
    pool = "runner pool (GPU models, CPU ISA)"
    prefix = "fxcache-v1-linux-x86_64-cp312-torch2.14.1+cu130-cu13.0-sm90-"
    h100 = prefix + "nvidia_h100_80gb_hbm3.avx512_vnni.0a1b2c3d-0d4e61a2c9f3-run-1"
    h200 = prefix + "nvidia_h200.avx512_vnni.4e5f6a7b-9f8e7d6c5b4a"
    code, result, text = diff(run_fxcache, h100, h200)
    assert code == 1 and not result["same_scope"]
    assert [c["field"] for c in result["keyed"]] == ["fingerprint hash", pool]
    assert result["a"] == h100.removesuffix("-run-1")
    assert f"{pool}: 'nvidia_h100_80gb_hbm3.avx512_vnni.0a1b2c3d' -> " in text
    # A key written before the pool segment, against today's key of one runner.
    code, result, _ = diff(run_fxcache, prefix + "0d4e61a2c9f3", h200)
    assert code == 1
    assert [c["field"] for c in result["keyed"]] == ["fingerprint hash", pool]
    assert result["keyed"][1]["a"] == ""
