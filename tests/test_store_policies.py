"""Invalidation policies as pure functions (shared by the local store and GitHub caches)."""

from __future__ import annotations

import dataclasses

import pytest

from ci_fxcache.env import scopekey
from ci_fxcache.env.fingerprint import Fingerprint
from ci_fxcache.env.gpus import Gpu
from ci_fxcache.errors import UsageError
from ci_fxcache.store.policies import Entry, Policy, parse_duration, parse_size, select
from tests.test_scopekey import SM90

DAY = 86400.0
NOW = 1_000 * DAY


def entry(torch: str, arch: str, days: float, size: int, n: int) -> Entry:
    accel = "cpu" if arch == "cpu" else "cu12.8"
    archs = "" if arch == "cpu" else f"-{arch}"
    key = scopekey.parse(f"fxcache-v1-linux-x86_64-cp311-torch{torch}-{accel}{archs}-{n:012x}")
    assert key is not None
    return Entry(name=f"e{n}", key=key, last_used=NOW - days * DAY, size=size)


def names(selected: list[Entry]) -> list[str]:
    return sorted(e.name for e in selected)


def test_parsers() -> None:
    assert parse_duration("14d") == 14 * DAY and parse_duration("90s") == 90
    assert parse_size("50G") == 50 * 1024**3 and parse_size("1.5MiB") == int(1.5 * 1024**2)
    for bad in ("14", "d", "-1d"):
        with pytest.raises(UsageError):
            parse_duration(bad)
    with pytest.raises(UsageError):
        parse_size("lots")


def test_policies_combine() -> None:
    entries = [
        entry("2.13.0", "sm90", 1, 10, 1),
        entry("2.13.0", "sm90", 3, 10, 2),
        entry("2.13.0", "sm90", 20, 10, 3),
        entry("2.12.0", "sm80", 2, 10, 4),
        entry("2.13.0", "cpu", 5, 100, 5),
    ]
    assert names(select(entries, Policy(max_age_s=14 * DAY), NOW)) == ["e3"]
    assert names(select(entries, Policy(keep_latest=1), NOW)) == ["e2", "e3"]
    assert names(select(entries, Policy(older_torch_than="2.13.0"), NOW)) == ["e4"]
    # LRU eviction runs after the other policies, over what they keep.
    chosen = select(entries, Policy(max_age_s=14 * DAY, max_size=25), NOW)
    assert names(chosen) == ["e2", "e3", "e5"]
    assert chosen[0].reasons  # every selected entry says why
    both = select(entries, Policy(max_age_s=14 * DAY, keep_latest=1), NOW)
    e3 = next(e for e in both if e.name == "e3")
    assert len(e3.reasons) == 2


# Keep-latest keeps N scopes per runner pool. Scopes differ by GPU model (torch keys the
# device name) and by CPU ISA (keyed by fxcache): pools of one `sm90` on one shared store
# (store github, a shared root, S3) must not evict each other's scope.
def scope_entry(name: str, fp: Fingerprint, days: float, *gpu_names: str) -> Entry:
    gpus = tuple(Gpu(i, gpu, "9.0", "sm90") for i, gpu in enumerate(gpu_names))
    key = scopekey.parse(scopekey.scope_key(dataclasses.replace(fp, gpus=gpus), "run-1"))
    assert key is not None
    return Entry(name=name, key=key, last_used=NOW - days * DAY, size=10)


def test_keep_latest_keeps_a_scope_per_gpu_model_of_one_arch() -> None:
    entries = [
        scope_entry("h100", SM90, 1, "NVIDIA H100 80GB HBM3"),
        scope_entry("h200", SM90, 2, "NVIDIA H200"),
        scope_entry("gh200", SM90, 3, "NVIDIA GH200 480GB"),
        scope_entry("mig", SM90, 4, "NVIDIA H100 80GB HBM3 MIG 3g.40gb"),
        scope_entry("h100_h200", SM90, 5, "NVIDIA H100 80GB HBM3", "NVIDIA H200"),
    ]
    assert {e.key.archs for e in entries} == {("sm90",)}
    assert select(entries, Policy(keep_latest=1), NOW) == []


def test_keep_latest_keeps_only_the_latest_torch_of_one_model() -> None:
    older = dataclasses.replace(SM90, torch_version="2.13.0+cu130", cuda_version="12.8")
    rebuilt = dataclasses.replace(SM90, torch_git_version="b" * 40, triton_version="3.8.1")
    entries = [
        scope_entry("h200-2.14", SM90, 1, "NVIDIA H200"),
        scope_entry("h200-2.13", older, 2, "NVIDIA H200"),
        scope_entry("h200-rebuilt", rebuilt, 3, "NVIDIA H200"),
        scope_entry("h200-salted", dataclasses.replace(SM90, salt="x"), 4, "NVIDIA H200"),
        scope_entry("h100-2.13", older, 5, "NVIDIA H100 80GB HBM3"),
        scope_entry("h100-2.14", SM90, 6, "NVIDIA H100 80GB HBM3"),
    ]
    chosen = select(entries, Policy(keep_latest=1), NOW)
    assert names(chosen) == ["h100-2.14", "h200-2.13", "h200-rebuilt", "h200-salted"]
    assert all("beyond the 1 latest for linux-x86_64-sm90-nvidia_h" in e.reasons[0] for e in chosen)


def test_keep_latest_keeps_a_scope_per_cpu_isa_of_one_gpu_model() -> None:
    # One H100 model on hosts of two CPU kinds: two scopes (the CPU ISA is keyed), two pools.
    avx2 = dataclasses.replace(SM90, cpu_isa="avx2")
    capped = dataclasses.replace(SM90, cpu_capability_override="avx2")
    entries = [
        scope_entry("amx", dataclasses.replace(SM90, cpu_isa="amx"), 1, "NVIDIA H100 PCIe"),
        scope_entry("avx2", avx2, 2, "NVIDIA H100 PCIe"),
        scope_entry("capped", capped, 3, "NVIDIA H100 PCIe"),
    ]
    assert select(entries, Policy(keep_latest=1), NOW) == []


def test_keep_latest_groups_old_gpu_keys_apart_from_new_ones() -> None:
    # GPU keys written before the pool segment (H100 and H200 alike) still parse; they form
    # their runner arch's group as before, and never take a slot of a pool of today's keys.
    old_h100 = entry("2.13.0", "sm90", 0.5, 10, 1)
    old_h200 = entry("2.13.0", "sm90", 0.6, 10, 2)
    assert old_h100.key.pool == "" and old_h100.key.runner_pool == "linux-x86_64-sm90"
    new = scope_entry("h200", SM90, 3, "NVIDIA H200")
    chosen = select([old_h100, old_h200, new], Policy(keep_latest=1), NOW)
    assert names(chosen) == ["e2"]
    assert chosen[0].reasons == ["beyond the 1 latest for linux-x86_64-sm90"]


def test_keep_latest_groups_cpu_scopes_per_os_and_machine() -> None:
    # Documented limit: a CPU key is unchanged by the pool segment, so scopes of two CPU
    # ISAs on one shared store are one pool (docs/store.md says so and what to do).
    cpu = dataclasses.replace(SM90, torch_version="2.13.0+cpu", cuda_version=None)
    entries = [
        scope_entry("avx512", cpu, 1),
        scope_entry("avx2", dataclasses.replace(cpu, cpu_isa="avx2"), 2),
    ]
    assert {e.key.runner_pool for e in entries} == {"linux-x86_64-cpu"}
    assert names(select(entries, Policy(keep_latest=1), NOW)) == ["avx2"]
