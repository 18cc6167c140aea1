"""Nondeterministic models judged fairly, with real compiles on the CPU and fault injection
(tests/workloads/models.py): the cold phase checks the compiled model against itself on every
input shape; eager output that no seed reproduces is not taken for random ops."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import RunFxcache
from tests.test_verify import FAST, MODELS, verify_one

pytestmark = pytest.mark.slow


def test_noise_on_the_second_shape_only_is_nondeterminism_not_a_bad_cache(
    run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    # Both phases jitter on the second input shape only: a hot phase that rechecks only the
    # first shape finds itself stable and calls the difference a hot/cold mismatch.
    proc, combo = verify_one(
        run_fxcache,
        tmp_path,
        *FAST,
        workload=f"{MODELS}:jittery",
        dynamic="true",
        training="false",
        phase="both",
        env={"FXCACHE_TEST_FAULT": "jitter-second"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert combo["verdict"] == "safe", combo["reason"]
    assert combo["cold"]["self_stable"] is False and combo["hot"]["self_stable"] is False
    (note,) = [n for n in combo["notes"] if n["kind"] == "nondeterministic"]
    assert "output 0 on the second input shape" in note["text"]
    assert "first input shape" not in note["text"]


def test_a_cold_phase_unstable_against_itself_is_seen_by_the_cold_phase(
    run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    # Jitter in the cold process only; the hot process is stable against itself.
    proc, combo = verify_one(
        run_fxcache,
        tmp_path,
        *FAST,
        training="false",
        workload=f"{MODELS}:jittery",
        phase="cold",
        env={"FXCACHE_TEST_FAULT": "jitter"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc, combo = verify_one(
        run_fxcache, tmp_path, *FAST, training="false", workload=f"{MODELS}:jittery"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert combo["hot"]["self_stable"] is True
    assert combo["max_abs_err"]["hot_vs_cold"] > 0.0
    assert (combo["verdict"], combo["cause"]) == ("safe", "hit"), combo["reason"]
    (note,) = [n for n in combo["notes"] if n["kind"] == "nondeterministic"]
    assert "cold phase: output 0 on the first input shape" in note["text"]


def test_eager_noise_is_not_taken_for_random_numbers(
    run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    proc, combo = verify_one(
        run_fxcache,
        tmp_path,
        *FAST,
        workload=f"{MODELS}:eager_noisy",
        training="false",
        phase="both",
        env={"FXCACHE_TEST_FAULT": "eager-noise"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    kinds = [n["kind"] for n in combo["notes"]]
    assert "random-ops" not in kinds, combo["notes"]
    assert "eager-unreproducible" in kinds
    # judged against float64 instead: the compiled (noise-free) result is the closer one
    assert "fp64-accuracy" in kinds
    assert combo["verdict"] == "safe", combo["reason"]
    assert combo["max_abs_err"]["hot_vs_cold"] == 0.0


def test_deterministic_mode_reaches_the_phases_and_is_part_of_the_cache_key(
    run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    record = tmp_path / "seen.jsonl"
    env = {"FXCACHE_TEST_RECORD": str(record)}
    workload = f"{MODELS}:records_determinism"
    cache = tmp_path / "c"
    proc, combo = verify_one(
        run_fxcache, cache, "--deterministic", *FAST, workload=workload, phase="both", env=env
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (combo["verdict"], combo["cause"]) == ("safe", "hit"), combo["reason"]
    seen = [json.loads(line) for line in record.read_text().splitlines()]
    # the workload check (not a phase) first, then the cold and hot phases
    want = {"algorithms": True, "inductor": True, "cublas": ":4096:8"}
    assert seen[-2:] == [want, want], seen
    # the same cache without the mode: torch keys on it, so the hot load misses
    proc, combo = verify_one(run_fxcache, cache, *FAST, workload=workload, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (combo["verdict"], combo["cause"]) == ("no-gain", "miss"), combo["reason"]
    assert json.loads(record.read_text().splitlines()[-1])["algorithms"] is False
