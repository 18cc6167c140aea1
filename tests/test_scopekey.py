"""Scope keys: deterministic, sensitive to every keyed field, safe as names; property-based."""

from __future__ import annotations

import dataclasses
import json
import re

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ci_fxcache.env import scopekey
from ci_fxcache.env.fingerprint import Fingerprint
from ci_fxcache.env.gpus import Gpu
from tests.conftest import TORCH_PYTHON, RunFxcache, torch_build

text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    min_size=1,
    max_size=30,
)
version = st.from_regex(r"\A[0-9]{1,2}\.[0-9]{1,2}(\.[0-9]{1,2})?(\+[a-z0-9]{1,8})?\Z")
gpu = st.builds(
    Gpu,
    index=st.integers(0, 7),
    name=st.sampled_from(["NVIDIA H100", "NVIDIA A100", "AMD Instinct MI300X"]),
    capability=st.sampled_from(["8.0", "8.9", "9.0", "10.0"]),
    arch=st.sampled_from(["sm80", "sm89", "sm90", "sm100", "gfx90a", "gfx942"]),
)
fingerprints = st.builds(
    Fingerprint,
    torch_version=version,
    torch_git_version=st.from_regex(r"\A[0-9a-f]{40}\Z"),
    cuda_version=st.none() | st.sampled_from(["12.8", "12.6", "13.0"]),
    hip_version=st.none() | st.sampled_from(["6.2.41133-dd7f95766", "6.4.0"]),
    triton_version=st.none() | version,
    python_implementation=st.just("cpython"),
    python_version=st.sampled_from(["3.10.14", "3.11.7", "3.12.3", "3.13.1"]),
    python_abi=st.sampled_from(["cp310", "cp311", "cp312", "cp313", "cp313t"]),
    os=st.sampled_from(["linux", "darwin", "win32"]),
    machine=st.sampled_from(["x86_64", "aarch64"]),
    gpus=st.lists(gpu, max_size=4).map(tuple),
    driver_version=st.none() | st.sampled_from(["570.86.15", "550.54"]),
    cpu_isa=st.sampled_from(["amx", "avx512", "avx2", "asimd", "default"]),
    cpu_capability_override=st.none() | st.sampled_from(["avx2", "default"]),
    salt=st.just("") | text,
)

KEY_CHARS = re.compile(r"\A[A-Za-z0-9._+-]+\Z")

# Each keyed field with a strategy that produces a *different* value for it.
CHANGES = {
    "torch_version": lambda fp: fp.torch_version + ".post1",
    "torch_git_version": lambda fp: "f" * 40 if fp.torch_git_version != "f" * 40 else "e" * 40,
    "cuda_version": lambda fp: "11.8" if fp.cuda_version != "11.8" else "12.1",
    "hip_version": lambda fp: "5.7.1" if fp.hip_version != "5.7.1" else "6.0",
    "triton_version": lambda fp: "3.9.9" if fp.triton_version != "3.9.9" else None,
    "python_abi": lambda fp: "cp399",
    "os": lambda fp: "freebsd",
    "machine": lambda fp: "ppc64le",
    "cpu_isa": lambda fp: "zvector",
    "cpu_capability_override": lambda fp: (
        "avx512" if fp.cpu_capability_override != "avx512" else None
    ),
    "salt": lambda fp: fp.salt + "x",
}


@settings(max_examples=200, deadline=None)
@given(fingerprints)
def test_key_is_deterministic_and_parses(fp: Fingerprint) -> None:
    key = scopekey.scope_key(fp)
    assert key == scopekey.scope_key(dataclasses.replace(fp))
    assert KEY_CHARS.match(key) and len(key) <= 255 and "," not in key
    parsed = scopekey.parse(key)
    assert parsed is not None and parsed.scope == key and parsed.suffix == ""
    assert parsed.hash == scopekey.fingerprint_hash(fp.keyed_fields())
    assert parsed.accel == scopekey.accelerator_segment(fp)
    assert parsed.pool == (scopekey.pool_segment(fp) if fp.device_kind != "cpu" else "")
    with_suffix = scopekey.scope_key(fp, "run-812/attempt 2")
    reparsed = scopekey.parse(with_suffix)
    assert reparsed is not None and reparsed.scope == key and reparsed.suffix == "run-812_attempt_2"


@settings(max_examples=150, deadline=None)
@given(fingerprints, st.sampled_from(sorted(CHANGES)))
def test_any_keyed_change_changes_key(fp: Fingerprint, field: str) -> None:
    changed = dataclasses.replace(fp, **{field: CHANGES[field](fp)})
    assert changed.keyed_fields() != fp.keyed_fields()
    assert scopekey.scope_key(changed) != scopekey.scope_key(fp)


@settings(max_examples=100, deadline=None)
@given(fingerprints, st.sampled_from(["sm75", "sm120", "gfx1100"]))
def test_gpu_arch_change_changes_key_for_gpu_builds(fp: Fingerprint, arch: str) -> None:
    gpu_fp = dataclasses.replace(fp, cuda_version="12.8", hip_version=None)
    new_gpu = Gpu(len(fp.gpus), "NVIDIA Other", "0.0", arch)
    changed = dataclasses.replace(gpu_fp, gpus=(*gpu_fp.gpus, new_gpu))
    assert scopekey.scope_key(changed) != scopekey.scope_key(gpu_fp)
    parsed = scopekey.parse(scopekey.scope_key(changed))
    assert parsed is not None and arch in parsed.archs


@settings(max_examples=100, deadline=None)
@given(fingerprints, st.sampled_from(["NVIDIA H200", "NVIDIA GH200 480GB", "NVIDIA L4"]))
def test_gpu_model_change_changes_key_for_gpu_builds_only(fp: Fingerprint, name: str) -> None:
    renamed = tuple(dataclasses.replace(g, name=name) for g in fp.gpus)
    changed = dataclasses.replace(fp, gpus=renamed)
    if fp.device_kind == "cpu" or {g.name for g in fp.gpus} in ({name}, set()):
        assert scopekey.scope_key(changed) == scopekey.scope_key(fp)
    else:
        assert scopekey.scope_key(changed) != scopekey.scope_key(fp)


# What one runner pool's environment changes over time (keep-latest ages these out) and what
# tells pools apart (keep-latest keeps N of each).
GENERATIONS = (
    "torch_version",
    "torch_git_version",
    "cuda_version",
    "triton_version",
    "python_abi",
    "salt",
)
POOL_CHANGES = ("os", "machine", "cpu_isa", "cpu_capability_override")


def _pool(fp: Fingerprint) -> str:
    parsed = scopekey.parse(scopekey.scope_key(fp))
    assert parsed is not None
    return parsed.runner_pool


@settings(max_examples=150, deadline=None)
@given(fingerprints, st.sampled_from(GENERATIONS), st.sampled_from(POOL_CHANGES))
def test_runner_pool_is_the_hardware_not_the_environment(
    fp: Fingerprint, generation: str, pool_field: str
) -> None:
    gpu_fp = dataclasses.replace(fp, cuda_version=fp.cuda_version or "12.8", hip_version=None)
    newer = dataclasses.replace(gpu_fp, **{generation: CHANGES[generation](gpu_fp)})
    assume(newer.device_kind != "cpu")
    assert scopekey.scope_key(newer) != scopekey.scope_key(gpu_fp)
    assert _pool(newer) == _pool(gpu_fp)
    elsewhere = dataclasses.replace(gpu_fp, **{pool_field: CHANGES[pool_field](gpu_fp)})
    assert _pool(elsewhere) != _pool(gpu_fp)


@settings(max_examples=100, deadline=None)
@given(fingerprints, st.sampled_from(["NVIDIA H200", "NVIDIA GH200 480GB", "NVIDIA L4"]))
def test_runner_pool_holds_the_gpu_models(fp: Fingerprint, name: str) -> None:
    gpu_fp = dataclasses.replace(fp, cuda_version="12.8", hip_version=None)
    renamed = dataclasses.replace(gpu_fp, gpus=(*gpu_fp.gpus, Gpu(9, name, "9.0", "sm90")))
    if renamed.gpu_models != gpu_fp.gpu_models:
        assert _pool(renamed) != _pool(gpu_fp)


def test_pool_segment_is_short_and_safe_with_many_long_models() -> None:
    names = [f"NVIDIA A100-SXM4-80GB MIG {n}g.{n}0gb" for n in range(1, 8)]
    many = tuple(Gpu(i, name, "8.0", "sm80") for i, name in enumerate(names))
    key = scopekey.scope_key(dataclasses.replace(SM90, gpus=many))
    parsed = scopekey.parse(key)
    assert parsed is not None and parsed.scope == key and KEY_CHARS.match(key)
    assert len(parsed.pool) <= scopekey.POOL_LABEL_MAX + 9 and len(key) <= 200
    rocm = dataclasses.replace(SM90, cuda_version=None, hip_version="6.4.0")
    mi300 = Gpu(0, "AMD Instinct MI300X", "gfx942:sramecc+:xnack-", "gfx942")
    parsed = scopekey.parse(scopekey.scope_key(dataclasses.replace(rocm, gpus=(mi300,))))
    assert parsed is not None and parsed.pool.startswith("amd_instinct_mi300x.avx512_vnni.")
    # The label leaves ROCm's target features out; the digest keeps the two pools apart.
    other = dataclasses.replace(mi300, capability="gfx942:sramecc-:xnack-")
    reparsed = scopekey.parse(scopekey.scope_key(dataclasses.replace(rocm, gpus=(other,))))
    assert reparsed is not None and reparsed.runner_pool != parsed.runner_pool
    assert reparsed.pool.rsplit(".", 1)[0] == parsed.pool.rsplit(".", 1)[0]
    nogpu = scopekey.parse(scopekey.scope_key(SM90))
    assert nogpu is not None and nogpu.archs == ("nogpu",)
    assert nogpu.pool.startswith("avx512_vnni.")


@settings(max_examples=100, deadline=None)
@given(fingerprints, st.randoms(use_true_random=False))
def test_irrelevant_differences_do_not_change_key(fp: Fingerprint, rnd: object) -> None:
    # Reported-only fields, GPU order/duplication, the case and spacing of GPU names and
    # surrounding whitespace leave the key alone.
    import random

    assert isinstance(rnd, random.Random)
    shuffled = list(fp.gpus)
    rnd.shuffle(shuffled)
    other = dataclasses.replace(
        fp,
        gpus=tuple(dataclasses.replace(g, name=f" {g.name.upper()}  ") for g in shuffled * 2),
        driver_version="999.1",
        python_executable="/elsewhere/bin/python",
        python_version=fp.python_version + "0",
        torch_path="/elsewhere/torch",
        gpu_source="rocminfo",
        torch_version=f"  {fp.torch_version}\t",
    )
    assert scopekey.scope_key(other) == scopekey.scope_key(fp)
    fields = fp.keyed_fields()
    reordered = dict(reversed(list(fields.items())))
    assert scopekey.canonical_json(reordered) == scopekey.canonical_json(fields)


@given(st.text(max_size=80))
def test_parse_rejects_foreign_keys(text_key: str) -> None:
    parsed = scopekey.parse(text_key)
    if parsed is not None:  # anything accepted must round-trip to its own scope
        assert text_key.startswith(parsed.scope)


def test_parse_examples() -> None:
    cpu_key = "fxcache-v1-linux-x86_64-cp311-torch2.13.0+cpu-cpu-59b2e5fecf37"
    gpu_key = "fxcache-v1-linux-x86_64-cp312-torch2.13.0+cu128-cu12.8-sm80_sm90-0d4e61a2c9f3-run-9"
    cpu = scopekey.parse(cpu_key)
    gpu = scopekey.parse(gpu_key)
    assert cpu is not None and cpu.archs == () and cpu.accel == "cpu" and cpu.torch == "2.13.0+cpu"
    assert gpu is not None and gpu.archs == ("sm80", "sm90") and gpu.suffix == "run-9"
    # A GPU key written before the pool segment: still ours, grouped by its arch as before.
    assert gpu.accel == "cu12.8" and gpu.pool == "" and gpu.runner_pool == "linux-x86_64-sm80_sm90"
    assert gpu.scope == gpu_key.removesuffix("-run-9")
    assert cpu.pool == "" and cpu.runner_pool == "linux-x86_64-cpu" and cpu.scope == cpu_key
    new_key = (
        "fxcache-v1-linux-x86_64-cp312-torch2.14.1+cu130-cu13.0-sm90-nvidia_h200.avx512_vnni."
        "4c8b371a-0d4e61a2c9f3-run-9.1"
    )
    new = scopekey.parse(new_key)
    assert new is not None and new.archs == ("sm90",) and new.hash == "0d4e61a2c9f3"
    assert new.pool == "nvidia_h200.avx512_vnni.4c8b371a" and new.suffix == "run-9.1"
    assert new.runner_pool == "linux-x86_64-sm90-nvidia_h200.avx512_vnni.4c8b371a"
    assert new.scope == new_key.removesuffix("-run-9.1")
    # A suffix that looks like a pool segment stays the suffix of an old key.
    odd = scopekey.parse(gpu_key + "-x.0123abcd")
    assert odd is not None and odd.pool == "" and odd.suffix == "run-9-x.0123abcd"
    for foreign in ("node-cache-linux-x64", "fxcache-v1-linux", "pip-fxcache-v1-x"):
        assert scopekey.parse(foreign) is None


def test_cli_key_is_stable_and_salt_changes_it(run_fxcache: RunFxcache) -> None:
    first = run_fxcache("key", "--python", TORCH_PYTHON)
    second = run_fxcache("key", "--python", TORCH_PYTHON)
    salted = run_fxcache("key", "--python", TORCH_PYTHON, "--salt", "team-a")
    env_salted = run_fxcache("key", "--python", TORCH_PYTHON, env={"FXCACHE_KEY_SALT": "team-a"})
    assert first.returncode == second.returncode == salted.returncode == 0
    assert first.stdout == second.stdout
    key, build = scopekey.parse(first.stdout.strip()), torch_build()
    assert first.stdout.startswith("fxcache-v1-linux-") and key is not None
    # The torch the tests run with, whichever build: `torch2.13.0+cpu-cpu`, `+cu130-cu13.0`.
    accel = "cu" + ".".join(build.cuda.split(".")[:2]) if build.cuda else "cpu"
    assert (key.torch, key.accel) == (build.version, accel)
    assert salted.stdout != first.stdout and env_salted.stdout == salted.stdout


def test_cli_key_json_and_parse(run_fxcache: RunFxcache) -> None:
    doc = json.loads(run_fxcache("key", "--json", "--python", TORCH_PYTHON).stdout)
    assert doc["parts"]["scope"] == doc["key"]
    assert scopekey.fingerprint_hash(doc["keyed_fields"]) == doc["parts"]["hash"]
    parsed = run_fxcache("key", "--parse", doc["key"] + "-run-1", "--json")
    assert json.loads(parsed.stdout)["suffix"] == "run-1"
    bad = run_fxcache("key", "--parse", "not-a-key")
    assert bad.returncode == 2 and "not an fxcache scope key" in bad.stderr


# torch's FX graph key holds the GPU's name (CacheBase.get_system: the CUDA device name, or
# ROCm's full gcnArchName), so one scope must not mix models that share a compute capability.
SM90 = Fingerprint(
    torch_version="2.14.1+cu130",
    torch_git_version="a" * 40,
    cuda_version="13.0",
    hip_version=None,
    triton_version="3.8.0",
    python_implementation="cpython",
    python_version="3.12.3",
    python_abi="cp312",
    os="linux",
    machine="x86_64",
    gpus=(),
    driver_version="580.65.06",
    cpu_isa="avx512_vnni",
    cpu_capability_override=None,
)


def _on(fp: Fingerprint, *names: str, capability: str = "9.0", arch: str = "sm90") -> str:
    gpus = tuple(Gpu(i, name, capability, arch) for i, name in enumerate(names))
    return scopekey.scope_key(dataclasses.replace(fp, gpus=gpus))


def test_gpu_models_of_one_architecture_get_scopes_of_their_own() -> None:
    models = [
        "NVIDIA H100 80GB HBM3",
        "NVIDIA H100 PCIe",
        "NVIDIA H200",
        "NVIDIA GH200 480GB",
        "NVIDIA A100-SXM4-80GB MIG 3g.40gb",  # a MIG slice, named with its profile
        "NVIDIA A100-SXM4-80GB MIG 1g.10gb",
        "NVIDIA A100-SXM4-80GB",
    ]
    keys = [_on(SM90, name) for name in models]
    assert len(set(keys)) == len(models), keys
    assert all("-sm90-" in key for key in keys)  # the readable part stays the architecture
    # What nvidia-smi, the driver and rocminfo may differ in for one model does not split it
    assert _on(SM90, "NVIDIA  H200 ") == _on(SM90, "nvidia h200") == _on(SM90, "NVIDIA H200")
    assert gpus_model_names(SM90, "NVIDIA H100 80GB HBM3") == ("nvidia_h100_80gb_hbm3",)


def gpus_model_names(fp: Fingerprint, name: str) -> tuple[str, ...]:
    return dataclasses.replace(fp, gpus=(Gpu(0, name, "9.0", "sm90"),)).gpu_models


def test_rocm_scopes_hold_the_full_gcn_arch_name() -> None:
    rocm = dataclasses.replace(SM90, cuda_version=None, hip_version="6.4.0")
    mi300 = "AMD Instinct MI300X"
    plain = _on(rocm, mi300, capability="gfx942:sramecc+:xnack-", arch="gfx942")
    other = _on(rocm, mi300, capability="gfx942:sramecc-:xnack-", arch="gfx942")
    assert plain != other and "-gfx942-" in plain and "-gfx942-" in other


def test_cpu_scope_keys_are_unchanged_by_the_gpu_models() -> None:
    # The key of a CPU build is what it was before GPU models were keyed (no cold compile
    # for CPU users), and GPUs on the host still do not enter it.
    cpu = dataclasses.replace(
        SM90, torch_version="2.13.0+cpu", cuda_version=None, triton_version=None
    )
    expected = "fxcache-v1-linux-x86_64-cp312-torch2.13.0+cpu-cpu-799581093e7f"
    assert scopekey.scope_key(cpu) == expected
    assert _on(cpu, "NVIDIA H200") == expected
    assert "gpu_models" not in cpu.keyed_fields()


# The parser of fxcache releases before the pool segment (main before this change), verbatim:
# a fleet mid-upgrade runs it, and it must leave today's GPU keys alone as foreign.
RELEASED_KEY_RE = re.compile(
    r"^fxcache-v(?P<version>\d+)"
    r"-(?P<os>[A-Za-z0-9._+]+)"
    r"-(?P<machine>[A-Za-z0-9._+]+)"
    r"-(?P<abi>[A-Za-z0-9._+]+)"
    r"-torch(?P<torch>[A-Za-z0-9._+]+)"
    r"-(?P<accel>cpu|cu[0-9.]+|rocm[0-9.]+)"
    r"(?:-(?P<archs>(?![0-9a-f]{12}(?:-|$))[A-Za-z0-9._+]+))?"
    r"-(?P<hash>[0-9a-f]{12})"
    r"(?:-(?P<suffix>[A-Za-z0-9._+-]+))?$"
)


@settings(max_examples=150, deadline=None)
@given(fingerprints, st.sampled_from(["", "run-812.1", "llama-run-9.2"]))
def test_released_parsers_see_gpu_keys_as_foreign_and_cpu_keys_as_before(
    fp: Fingerprint, suffix: str
) -> None:
    key = scopekey.scope_key(fp, suffix)
    released = RELEASED_KEY_RE.match(key)
    if fp.device_kind == "cpu":
        parsed = scopekey.parse(key)
        assert released is not None and parsed is not None
        assert (released["hash"], released["suffix"] or "") == (parsed.hash, parsed.suffix)
    else:
        assert released is None
