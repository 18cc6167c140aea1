"""Scope keys: a readable prefix plus a hash of the canonical fingerprint.

Format (v1), `-`-separated, every segment in [A-Za-z0-9._+]:

    fxcache-v1-<os>-<machine>-<abi>-torch<version>-<accel>[-<archs>-<pool>]-<hash12>[-<suffix>]

`accel` is `cpu`, `cu<CUDA major.minor>` or `rocm<HIP major.minor>`; `archs` (GPU builds only)
is the sorted distinct GPU architectures joined by `_` (`sm90`, `sm80_sm90`, `gfx90a`), or
`nogpu` when a GPU build sees no device. `pool` (GPU builds only) names the runner pool:
`<models>.<cpu isa>.<digest8>` (see `pool_segment`); GPU keys written before it existed have
none and still parse. `hash12` is the first 12 hex digits of the SHA-256 of the canonical JSON
of `Fingerprint.keyed_fields()`. `suffix` is free (e.g. a run id when saving to actions/cache)
and is ignored when scopes are compared.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from ci_fxcache.env.fingerprint import Fingerprint
from ci_fxcache.errors import UsageError

KEY_VERSION = 1
PREFIX = f"fxcache-v{KEY_VERSION}"
MAX_KEY_LENGTH = 512  # actions/cache's limit; directory names allow 255
_UNSAFE = re.compile(r"[^A-Za-z0-9._+]")
KEY_RE = re.compile(
    r"^fxcache-v(?P<version>\d+)"
    r"-(?P<os>[A-Za-z0-9._+]+)"
    r"-(?P<machine>[A-Za-z0-9._+]+)"
    r"-(?P<abi>[A-Za-z0-9._+]+)"
    r"-torch(?P<torch>[A-Za-z0-9._+]+)"
    r"-(?P<accel>cpu|cu[0-9.]+|rocm[0-9.]+)"
    r"(?:-(?P<archs>(?![0-9a-f]{12}(?:-|$))[A-Za-z0-9._+]+)"
    r"(?:-(?P<pool>[A-Za-z0-9._+]*\.[0-9a-f]{8}))?)?"
    r"-(?P<hash>[0-9a-f]{12})"
    r"(?:-(?P<suffix>[A-Za-z0-9._+-]+))?$"
)


def segment(text: str) -> str:
    """Make `text` safe as one key segment (no `-`, `/`, spaces or commas)."""
    return _UNSAFE.sub("_", text.strip()) or "_"


def _normalise(value: Any) -> Any:
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, dict):
        return {str(k): _normalise(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_normalise(v) for v in value]
    return value


def canonical_json(fields: dict[str, Any]) -> str:
    """Order- and whitespace-independent serialisation of the keyed fields."""
    return json.dumps(_normalise(fields), sort_keys=True, separators=(",", ":"))


def fingerprint_hash(fields: dict[str, Any]) -> str:
    """First 12 hex digits of the SHA-256 of `canonical_json(fields)`."""
    return hashlib.sha256(canonical_json(fields).encode("utf-8")).hexdigest()[:12]


def _major_minor(version: str) -> str:
    return ".".join(re.findall(r"\d+", version)[:2]) or "0"


def accelerator_segment(fp: Fingerprint) -> str:
    """`cpu`, `cu12.8` or `rocm6.2`."""
    if fp.hip_version:
        return f"rocm{_major_minor(fp.hip_version)}"
    if fp.cuda_version:
        return f"cu{_major_minor(fp.cuda_version)}"
    return "cpu"


# The keyed fields that tell runner pools apart (hardware and runner setup), as opposed to what
# one pool's environment changes over time (torch, CUDA, HIP, Triton, Python ABI, salt), which
# `--keep-latest` ages out within a pool. ParsedKey.runner_pool reads it back from a key.
POOL_FIELDS = ("os", "machine", "gpu_archs", "gpu_models", "cpu_isa", "cpu_capability_override")
POOL_LABEL_MAX = 64


def pool_segment(fp: Fingerprint) -> str:
    """A GPU build's runner-pool segment, `<models>.<cpu isa>.<digest8>`
    (`nvidia_h200.avx512_vnni.4c8b371a`): the label is for people (model names without
    ROCm's target features, cut at POOL_LABEL_MAX characters); the digest, the first 8 hex
    digits of the SHA-256 of the canonical JSON of the POOL_FIELDS, is what keeps pools apart."""
    fields = fp.keyed_fields()
    digest = fingerprint_hash({name: fields.get(name) for name in POOL_FIELDS})[:8]
    names = [segment(model.split("@", 1)[0]) for model in fp.gpu_models]
    label = ".".join([*names, segment(fp.cpu_isa)])[:POOL_LABEL_MAX].rstrip(".")
    return f"{label}.{digest}"


def scope_key(fp: Fingerprint, suffix: str = "") -> str:
    """The scope key of fingerprint `fp` (optionally with a free-form suffix)."""
    parts = [
        PREFIX,
        segment(fp.os),
        segment(fp.machine),
        segment(fp.python_abi),
        "torch" + segment(fp.torch_version),
        accelerator_segment(fp),
    ]
    if fp.device_kind != "cpu":
        parts.append("_".join(segment(a) for a in fp.gpu_archs) or "nogpu")
        parts.append(pool_segment(fp))
    parts.append(fingerprint_hash(fp.keyed_fields()))
    if suffix.strip():
        parts.append(re.sub(r"[^A-Za-z0-9._+-]", "_", suffix.strip()))
    key = "-".join(parts)
    if len(key) > MAX_KEY_LENGTH:
        raise UsageError(
            f"scope key would be {len(key)} characters (max {MAX_KEY_LENGTH}): use a shorter suffix"
        )
    return key


@dataclass(frozen=True)
class ParsedKey:
    """The readable parts of a scope key."""

    version: int
    os: str
    machine: str
    abi: str
    torch: str
    accel: str
    archs: tuple[str, ...]  # () for CPU builds; ("nogpu",) for a GPU build that saw no device
    hash: str
    suffix: str
    pool: str = ""  # GPU builds' pool segment; "" for CPU keys and GPU keys written before it

    @property
    def scope(self) -> str:
        """The key without its suffix: what identifies the scope."""
        parts = [
            f"fxcache-v{self.version}",
            self.os,
            self.machine,
            self.abi,
            f"torch{self.torch}",
            self.accel,
        ]
        if self.archs:
            parts.append("_".join(self.archs))
        if self.pool:
            parts.append(self.pool)
        parts.append(self.hash)
        return "-".join(parts)

    @property
    def runner_pool(self) -> str:
        """What scopes of one runner pool share (`--keep-latest` keeps N per pool): OS, machine,
        GPU archs and, for GPU keys, the pool segment (GPU models, CPU ISA). A CPU key's hash
        alone holds its CPU ISA, so CPU scopes of one OS and machine are one pool; so are GPU
        keys written before the pool segment, per arch, apart from the newer ones."""
        parts = [self.os, self.machine, "_".join(self.archs) or "cpu"]
        if self.pool:
            parts.append(self.pool)
        return "-".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict, with the scope."""
        return {
            "version": self.version,
            "os": self.os,
            "machine": self.machine,
            "abi": self.abi,
            "torch": self.torch,
            "accel": self.accel,
            "archs": list(self.archs),
            "pool": self.pool,
            "hash": self.hash,
            "suffix": self.suffix,
            "scope": self.scope,
        }


def parse(key: str) -> ParsedKey | None:
    """Parse a key of our format; None for anything else (foreign caches are left alone)."""
    match = KEY_RE.match(key)
    if match is None:
        return None
    archs = match["archs"]
    return ParsedKey(
        version=int(match["version"]),
        os=match["os"],
        machine=match["machine"],
        abi=match["abi"],
        torch=match["torch"],
        accel=match["accel"],
        archs=tuple(archs.split("_")) if archs else (),
        hash=match["hash"],
        suffix=match["suffix"] or "",
        pool=match["pool"] or "",
    )
