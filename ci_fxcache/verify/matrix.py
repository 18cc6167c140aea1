"""The verification matrix: axes, combinations, and their sources (flags and a YAML file)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from itertools import product
from typing import Any

from ci_fxcache import mechanisms as registry
from ci_fxcache import userfiles
from ci_fxcache.errors import UsageError

FILE_VERSIONS = (1,)
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("float32", "float16", "bfloat16", "bfloat16-autocast")
DYNAMIC = ("false", "true", "mark")
BUILTIN_WORKLOADS = ("sin_matmul", "mlp", "conv", "attention", "transformer_block")
# torch.compile's own mode names (`torch.compile(mode=...)`); "default" is its default.
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# The modes that capture CUDA graphs: on a device without CUDA torch skips the graphs.
CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")
# A `--ranks` value: a process count, with the cache layout of its ranks after a colon
# (`shared`, the default: one cache directory for all ranks, as torchrun jobs have it;
# `one-rank`: rank 0 compiles, torch 2.15's compile on one rank). docs/verify.md "Ranks".
RANK_LAYOUTS = ("shared", "one-rank")
RANKS_VALUE = re.compile(r"^([1-9][0-9]?)(?::(shared|one-rank))?$")
USER_WORKLOAD = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")

DEFAULTS: dict[str, list[Any]] = {
    "devices": ["auto"],
    "dtypes": ["float32", "bfloat16"],
    "dynamic": ["false", "true"],
    "mechanisms": registry.defaults(),
    "training": [True],
    "workloads": ["sin_matmul"],
    "modes": ["default"],
    "ranks": ["1"],
}
# Matrix-file key -> CLI flag, for messages.
FLAGS = {
    "devices": "--device",
    "dtypes": "--dtypes",
    "dynamic": "--dynamic",
    "mechanisms": "--mechanisms",
    "training": "--training",
    "workloads": "--workloads",
    "modes": "--modes",
    "ranks": "--ranks",
}
# The dynamic mode's word inside combination ids (directory names: never change them).
ID_DYNAMIC = {"false": "static", "true": "dynamic", "mark": "mark"}
# The words people read (progress lines, text output, reports): one vocabulary for all.
_DTYPE_SHORT = (("bfloat16", "bf16"), ("float16", "fp16"), ("float32", "fp32"), ("float64", "fp64"))
_DYNAMIC_WORD = {"false": "static", "true": "dynamic", "mark": "mark_dynamic"}


def short_dtype(dtype: str) -> str:
    """`bfloat16` -> `bf16` (also inside compound names such as `bfloat16-autocast`)."""
    for long, short in _DTYPE_SHORT:
        dtype = dtype.replace(long, short)
    return dtype


def dynamic_word(value: Any) -> str:
    """`"false"` -> `static`, `"true"` -> `dynamic`, `"mark"` -> `mark_dynamic`."""
    text = str(value).lower()  # also turns a JSON boolean into "true"/"false"
    return _DYNAMIC_WORD.get(text, text)


@dataclass(frozen=True)
class Combo:
    """One combination of the matrix."""

    workload: str
    device: str
    dtype: str
    dynamic: str
    mechanism: str
    training: bool
    # torch.compile's mode (MODES); the default mode adds nothing to the id or the label, so
    # the ids (directory names) of a matrix without modes never change.
    mode: str = "default"
    ranks: int = 1  # processes per phase (torch.distributed when more than 1)
    layout: str = "shared"  # the ranks' cache layout (RANK_LAYOUTS)

    @property
    def id(self) -> str:
        """Stable id, also the combination's directory name under --cache-dir (one rank: as
        before ranks existed)."""
        workload = re.sub(r"[^A-Za-z0-9_.]+", "_", self.workload)
        mode = "train" if self.training else "infer"
        dyn = ID_DYNAMIC[self.dynamic]
        ranks = f"-r{self.ranks}" if self.ranks != 1 else ""
        if self.ranks != 1 and self.layout != "shared":
            ranks += f"-{self.layout}"
        base = f"{workload}-{self.device}-{self.dtype}-{dyn}-{self.mechanism}-{mode}"
        return base + mode_suffix(self.mode, "-") + ranks

    @property
    def label(self) -> str:
        """Short human label for progress lines."""
        mode = "train" if self.training else "infer"
        ranks = f" {ranks_word(self.ranks, self.layout)}" if self.ranks != 1 else ""
        return (
            f"{self.workload} {self.device} {short_dtype(self.dtype)} "
            f"{dynamic_word(self.dynamic)} {self.mechanism} {mode}{mode_suffix(self.mode, ' ')}"
            f"{ranks}"
        )

    def to_dict(self) -> dict[str, Any]:
        """The combination's axes as the results document spells them (`ranks` and
        `rank_layout` only where they are not the one-process default)."""
        out: dict[str, Any] = {
            "workload": self.workload,
            "device": self.device,
            "dtype": self.dtype,
            "dynamic": self.dynamic,
            "mechanism": self.mechanism,
            "training": self.training,
            "mode": self.mode,
        }
        if self.ranks != 1:
            out["ranks"] = self.ranks
            if self.layout != "shared":
                out["rank_layout"] = self.layout
        return out


def ranks_word(ranks: Any, layout: Any = "shared") -> str:
    """`2 ranks`, `2 ranks one-rank`: the words people read for a ranks value."""
    word = f"{ranks} ranks"
    return word if layout in (None, "", "shared") else f"{word} {layout}"


def parse_ranks(value: str) -> tuple[int, str]:
    """A checked `--ranks` value (`2`, `2:one-rank`) as (process count, layout)."""
    found = RANKS_VALUE.match(value)
    if found is None:
        raise ValueError(value)
    return int(found.group(1)), found.group(2) or "shared"


def mode_suffix(mode: Any, sep: str) -> str:
    """`sep` + the compile mode where it is not torch's default ('' for the default mode, and
    for a document written before modes, which has none)."""
    return "" if mode in (None, "default") else f"{sep}{mode}"


@dataclass
class Matrix:
    """Selected values of each axis (`devices` may still say `auto`)."""

    devices: list[str] = field(default_factory=lambda: list(DEFAULTS["devices"]))
    dtypes: list[str] = field(default_factory=lambda: list(DEFAULTS["dtypes"]))
    dynamic: list[str] = field(default_factory=lambda: list(DEFAULTS["dynamic"]))
    mechanisms: list[str] = field(default_factory=registry.defaults)
    training: list[bool] = field(default_factory=lambda: list(DEFAULTS["training"]))
    workloads: list[str] = field(default_factory=lambda: list(DEFAULTS["workloads"]))
    modes: list[str] = field(default_factory=lambda: list(DEFAULTS["modes"]))
    ranks: list[str] = field(default_factory=lambda: list(DEFAULTS["ranks"]))

    def combos(self) -> list[Combo]:
        """Every combination, in a stable order (workload, device, dtype, dynamic, mech,
        training, compile mode, ranks)."""
        return [
            Combo(w, d, t, y, m, tr, mo, *parse_ranks(r))
            for w, d, t, y, m, tr, mo, r in product(
                self.workloads,
                self.devices,
                self.dtypes,
                self.dynamic,
                self.mechanisms,
                self.training,
                self.modes,
                self.ranks,
            )
        ]

    def to_dict(self) -> dict[str, Any]:
        """As the results document's `matrix` (`ranks` only where it is not just `1`)."""
        out = {k: list(getattr(self, k)) for k in FLAGS}
        if out["ranks"] == DEFAULTS["ranks"]:
            del out["ranks"]
        return out


def _bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "train"):
        return True
    if text in ("false", "0", "no", "infer"):
        return False
    raise UsageError(f"{where}: {value!r} is not true or false")


def _check(axis: str, values: list[Any], where: str) -> list[Any]:
    if not values:
        raise UsageError(f"{where}: needs at least one value")
    allowed: tuple[str, ...] = {
        "devices": DEVICES,
        "dtypes": DTYPES,
        "dynamic": DYNAMIC,
        "mechanisms": registry.names(),  # read now: a new record is all it takes
        "modes": MODES,
    }.get(axis, ())
    out: list[Any] = []
    for raw in values:
        if axis == "training":
            value: Any = _bool(raw, where)
        elif axis == "dynamic" and isinstance(raw, bool):
            value = "true" if raw else "false"
        else:
            value = str(raw).strip()
            if axis != "workloads":
                value = value.lower()
        if axis == "ranks":
            value = _ranks_value(value, where)
        if allowed and value not in allowed:
            raise UsageError(
                f"{where}: unknown {axis[:-1] if axis != 'dynamic' else 'dynamic'} value "
                f"{value!r}; choose from {', '.join(allowed)}"
            )
        if (
            axis == "workloads"
            and value not in BUILTIN_WORKLOADS
            and not USER_WORKLOAD.match(value)
        ):
            raise UsageError(
                f"{where}: unknown workload {value!r}; use a built-in "
                f"({', '.join(BUILTIN_WORKLOADS)}) or package.module:factory"
            )
        if value not in out:
            out.append(value)
    return out


def _ranks_value(value: str, where: str) -> str:
    """A `--ranks` item in its one spelling (`2`, `2:one-rank`; `2:shared` is `2`)."""
    try:
        count, layout = parse_ranks(value)
    except ValueError:
        raise UsageError(
            f"{where}: {value!r} is not a process count from 1 to 99, optionally followed by "
            f":{' or :'.join(RANK_LAYOUTS)}"
        ) from None
    return str(count) if layout == "shared" or count == 1 else f"{count}:{layout}"


def split(text: str) -> list[str]:
    """A comma-separated flag value as a list (blank items dropped)."""
    return [item.strip() for item in text.split(",") if item.strip()]


def load_file(path: str) -> dict[str, list[Any]]:
    """Read and validate a YAML matrix file (see docs/matrix-file.md)."""
    label = f"--matrix-file {path}"
    data = userfiles.parse_yaml(userfiles.read_text(path, label), label)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UsageError(
            f"--matrix-file {path}: expected a mapping of axes, got {type(data).__name__}"
        )
    if "version" in data and data["version"] not in FILE_VERSIONS:
        raise UsageError(
            f"--matrix-file {path}: version {data['version']!r} is not supported; this fxcache "
            f"reads version {', '.join(map(str, FILE_VERSIONS))} (upgrade fxcache or fix the file)"
        )
    body = data.get("matrix", data) if set(data) <= {"matrix", "version"} else data
    if not isinstance(body, dict):
        raise UsageError(f"--matrix-file {path}: 'matrix' must be a mapping of axes")
    aliases = {
        "device": "devices",
        "dtype": "dtypes",
        "mechanism": "mechanisms",
        "workload": "workloads",
        "mode": "modes",
    }
    out: dict[str, list[Any]] = {}
    for key, value in body.items():
        axis = aliases.get(str(key), str(key))
        if axis not in FLAGS:
            raise UsageError(
                f"--matrix-file {path}: unknown key {key!r}; allowed: {', '.join(FLAGS)}"
            )
        if isinstance(value, (str, bool, int)):
            value = split(value) if isinstance(value, str) else [value]
        if not isinstance(value, list):
            raise UsageError(
                f"--matrix-file {path}: {key} must be a list or a comma-separated string"
            )
        out[axis] = _check(axis, value, f"--matrix-file {path}: {key}")
    return out


def build(flags: dict[str, str | None], matrix_file: str | None) -> Matrix:
    """The matrix: defaults, overridden by the matrix file, overridden by flags."""
    matrix = Matrix()
    if matrix_file:
        for axis, values in load_file(matrix_file).items():
            setattr(matrix, axis, values)
    for axis, text in flags.items():
        if text is not None:
            setattr(matrix, axis, _check(axis, split(text), f"{FLAGS[axis]} {text}"))
    return matrix
