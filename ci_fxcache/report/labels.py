"""The report's vocabulary: one label per combination, short words per cause, number formats.

Every place that names a combination (top lines, table, chart, recommendations, fleet matrix,
text format) calls `combo_label`, so an entry reads the same everywhere: dtype, dynamic mode,
mechanism, always in that order (`bf16 dynamic precompile`), prefixed by the workload, device
or training mode only where the report holds more than one of them.
"""

from __future__ import annotations

import re
from typing import Any

from ci_fxcache.verify import verdict_kinds
from ci_fxcache.verify.matrix import dynamic_word, ranks_word, short_dtype

EMOJI = verdict_kinds.emoji()
ISSUE_MARK = "⚠️"  # a known upstream issue concerns this combination
# The fields that only enter a label (and a table column) when they vary within a report.
VARYING_FIELDS = ("workload", "device", "training", "mode", "ranks")

NOT_RECHECKED = "not re-checked this run"
# The report's line for the workloads whose model changed since their recorded reference.
CHANGED_HEADING = (
    "Model changed since the recorded reference, verified cold and hot again "
    "(not judged by the old reference)"
)


def _note(combo: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for note in combo.get("notes") or []:
        if isinstance(note, dict) and note.get("kind") == kind:
            return note
    return None


def carried_from(combo: dict[str, Any]) -> str | None:
    """When a combination carried into this run (note kind `carried`) was judged, else None."""
    note = _note(combo, "carried")
    return None if note is None else str(note.get("judged_at") or "an earlier run")


def carried_age(combo: dict[str, Any]) -> str:
    """How long before this run a carried verdict was judged (`, 3 h earlier`), or '' where
    the note does not say (a document written before the note recorded it)."""
    age = (_note(combo, "carried") or {}).get("age_s")
    if isinstance(age, (int, float)) and not isinstance(age, bool) and age >= 0:
        return f", {fmt_age(float(age))} earlier"
    return ""


def fmt_age(seconds: float) -> str:
    """`45 s`, `12 min`, `5 h`, `3 days`: an age in its largest whole unit."""
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            count = int(seconds // size)
            return f"{count} {'day' if unit == 'days' and count == 1 else unit}"
    return f"{int(seconds)} s"


def changed_unchecked(combo: dict[str, Any]) -> bool:
    """Whether the identity check of a `workload-changed` combination itself failed."""
    return bool((_note(combo, "workload-changed") or {}).get("unchecked"))


def changed_why(combo: dict[str, Any]) -> str | None:
    """What changed in the combination's workload since its recorded reference (note kind
    `workload-changed`: it was verified cold and hot again), else None."""
    note = _note(combo, "workload-changed")
    return None if note is None else str(note.get("why") or "changed")


# What each cause means, in a few words (schema v2 `cause`; docs/reports.md lists them).
CAUSE_WORDS = {
    "hit": "hot load hit",
    "partial-hit": "hit; an uncacheable part recompiled",
    "miss": "the cache missed",
    "rebuilt": "hit, but kernels were rebuilt",
    "slow": "hit, but too little speedup",
    "refused": "torch refused the artifact",
    "autotuned": "autotuning ran again on hot load",
    "hot-mismatch": "wrong values on hot load",
    "recompile": "recompiled on hot load",
    "crash": "crashed on hot load",
    "timeout": "hung on hot load",
    "hot-error": "failed on hot load",
    "cold-error": "compile failed: compiler, not cache",
    "compiler-mismatch": "compiled differs from eager: compiler, not cache",
    "not-run": "did not run",
    "no-device": "no such device here",
    "torch-too-old": "needs a newer torch",
    "gpu-too-old": "the GPU is too old",
    "unsupported": "not supported here",
}
# Failures the report attributes to the compiler: no cache advice for them.
COMPILER_CAUSES = frozenset({"cold-error", "compiler-mismatch"})


def training_word(value: Any) -> str:
    return "train" if value else "inference"


def field_word(combo: dict[str, Any], name: str) -> str:
    """How a varying field reads in a label or heading."""
    if name == "training":
        return training_word(combo.get("training"))
    if name == "ranks":  # one process: "1 rank", shown only beside other counts
        ranks = combo.get("ranks") or 1
        return "1 rank" if ranks == 1 else ranks_word(ranks, combo.get("rank_layout"))
    if name == "mode":
        return str(combo.get("mode") or "default")  # a document from before modes: default
    return str(combo.get(name))


def varying_fields(combos: list[dict[str, Any]]) -> tuple[str, ...]:
    """Which of workload, device, training, compile mode take more than one value among
    `combos` (a report whose combinations all use the default mode never names it)."""
    return tuple(n for n in VARYING_FIELDS if len({field_word(c, n) for c in combos}) > 1)


def constant_heading(combo: dict[str, Any] | None, varying: tuple[str, ...]) -> str:
    """'sin_matmul · cuda · train': the fields that are not `varying` (labels omit them)."""
    if combo is None:
        return ""
    fields = [n for n in VARYING_FIELDS if n not in varying]
    words = [field_word(combo, n) for n in fields]
    # torch.compile's default mode and one rank go unsaid: a report names a mode or a count
    # of ranks only where one is chosen
    unsaid = {("mode", "default"), ("ranks", "1 rank")}
    return " · ".join(w for n, w in zip(fields, words, strict=True) if (n, w) not in unsaid)


def combo_label(combo: dict[str, Any], varying: tuple[str, ...] = ()) -> str:
    """`bf16 dynamic precompile`, prefixed by the varying fields (`resnet cuda train ...`)."""
    return " ".join(b for b in (group_label(combo, varying, " "), short_label(combo)) if b)


def short_label(combo: dict[str, Any]) -> str:
    """`bf16 dynamic precompile`: the label without the varying fields (rows under a heading)."""
    return " ".join(
        (short_dtype(str(combo["dtype"])), dynamic_word(combo["dynamic"]), str(combo["mechanism"]))
    )


def group_label(combo: dict[str, Any], varying: tuple[str, ...], sep: str = " · ") -> str:
    """The varying fields alone (`resnet · cuda`): the heading a group of rows sits under."""
    return sep.join(field_word(combo, n) for n in varying)


# Dynamic modes in their natural order (grid columns): static, dynamic, mark_dynamic.
DYNAMIC_ORDER = ("false", "true", "mark")


def dynamic_rank(value: Any) -> int:
    text = str(value).lower()
    return DYNAMIC_ORDER.index(text) if text in DYNAMIC_ORDER else len(DYNAMIC_ORDER)


_SM = re.compile(r"sm(\d+)([a-z]?)")


def arch_key(arch: str) -> tuple[int, int, str]:
    """Architectures in their natural order: NVIDIA by compute capability (sm80, sm90, sm100),
    then ROCm (gfx...), then the CPU and anything else, each by name."""
    first = arch.split("_")[0]  # several architectures are joined by "_": sort by the first
    m = _SM.fullmatch(first)
    if m:
        return (0, int(m.group(1)), arch)
    if first.startswith("gfx"):
        return (1, 0, arch)
    return (2, 0, arch)


def fmt_seconds(value: Any) -> str:
    return "–" if value is None else f"{float(value):.2f}"


def fmt_speedup(value: Any, cause: str = "") -> str:
    """`9.1x`. A `slow` one, below its --min-speedup floor, keeps the two decimals verify
    recorded (rounded never across the floor): 1.98x must not read 2.0x beside a 2.0 floor."""
    if value is None:
        return "–"
    return f"{float(value):.2f}x" if cause == "slow" else f"{float(value):.1f}x"


# How a no-gain cell says why next to its speedup (`2.4x · miss`): the verdict stays no-gain.
NO_GAIN_WORDS = {"miss": "miss", "rebuilt": "rebuilt", "slow": "slow", "partial-hit": "partial"}


def fmt_speedup_why(value: Any, verdict: str, cause: str, kernels_built: int = 0) -> str:
    """The speedup cell: `9.0x`; for no-gain rows also why (`2.4x · miss`, `1.0x · 6 rebuilt`)."""
    shown = fmt_speedup(value, cause)
    if verdict != "no-gain":
        return shown
    word = NO_GAIN_WORDS.get(cause, cause)
    if cause == "rebuilt" and kernels_built:
        word = f"{kernels_built} rebuilt"
    return f"{shown} · {word}"


def fmt_err(value: Any) -> str:
    if value is None:
        return "–"
    v = float(value)
    return "0" if v == 0 else f"{v:.1e}"
