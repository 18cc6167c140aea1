"""The verdicts: one record each, the one place that spells their properties.

A verdict is what a combination's evidence comes to (DESIGN.md "Verdicts"). Everything that
differs by verdict reads its record here: the order rows and summaries use (problems first),
the emoji and the terminal colour, the word the text matrix prints, whether it counts as a
problem, whether a hot-only run may carry it (verify/recheck.py), which `--fail-on` level
fails it, its top line in the report and the causes it can have (verify/causes.py).
tests/test_verdict_kinds.py checks that no other module spells an emoji, a colour or a table
of verdicts; a single name compared with a document's `verdict` is the data's value, not a
property, and is spelled where it is compared. No import here: verify and every later stage read it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """One verdict."""

    name: str
    # Rows and summaries sort by it: the worst first.
    order: int
    emoji: str
    # The ANSI SGR code the text table colours it with (on a TTY without NO_COLOR).
    colour: str
    # How the text matrix prints it (UNSAFE shouts) and the comment's legend names it.
    word: str
    legend: str
    # Whether it counts as a problem (the matrix's problem rows, the headline's counts); the
    # problems are also the `--fail-on` levels: level X fails X and every worse problem.
    problem: bool = False
    # Whether its hot load ran and gave no wrong answer: its speedup is worth showing (a fast
    # wrong answer is no win).
    loaded: bool = False
    # Whether a hot-only run may carry it instead of re-checking (verify/recheck.py).
    carried: bool = False
    # The report's top line that lists it (None: listed under "skipped" only).
    heading: str | None = None
    # The causes it can have, in the order docs/verify.md lists them.
    causes: tuple[str, ...] = ()


ALL: tuple[Verdict, ...] = (
    Verdict(
        name="safe", order=3, emoji="✅", colour="32", word="safe", legend="safe",
        loaded=True, heading="Cache", causes=("hit", "partial-hit"),
    ),
    Verdict(
        name="no-gain", order=2, emoji="🟡", colour="33", word="no-gain", legend="no gain",
        problem=True, loaded=True, carried=True, heading="Check",
        causes=("miss", "rebuilt", "slow", "refused", "autotuned"),
    ),
    Verdict(
        name="unsafe", order=0, emoji="❌", colour="31", word="UNSAFE", legend="unsafe",
        problem=True, heading="Do not cache",
        causes=("hot-mismatch", "recompile", "crash", "timeout", "hot-error"),
    ),
    Verdict(
        name="error", order=1, emoji="💥", colour="35", word="error", legend="error",
        problem=True, heading="Check", causes=("cold-error", "compiler-mismatch", "not-run"),
    ),
    Verdict(
        name="skipped", order=4, emoji="⏭️", colour="2", word="skipped", legend="skipped",
        causes=("no-device", "torch-too-old", "gpu-too-old", "unsupported"),
    ),
)  # fmt: skip
# The report's top lines, in this order: the heading and the verdict whose emoji leads it.
TOP_LINES = (("Cache", "safe"), ("Do not cache", "unsafe"), ("Check", "no-gain"))


def names() -> tuple[str, ...]:
    """Every verdict's name, in the results schema's order."""
    return tuple(v.name for v in ALL)


def get(name: str) -> Verdict:
    """The record of `name`; KeyError for an unknown one (the reader refuses those first)."""
    for v in ALL:
        if v.name == name:
            return v
    raise KeyError(f"unknown verdict {name!r}")


def order() -> dict[str, int]:
    """Each verdict's rank, the worst first (0), in that order (counts are listed so)."""
    return {v.name: v.order for v in sorted(ALL, key=lambda v: v.order)}


def problems() -> tuple[str, ...]:
    """The verdicts that count as a problem, the worst first."""
    return tuple(v.name for v in sorted(ALL, key=lambda v: v.order) if v.problem)


def emoji() -> dict[str, str]:
    return {v.name: v.emoji for v in ALL}


def loaded() -> tuple[str, ...]:
    return tuple(v.name for v in ALL if v.loaded)


def carried() -> tuple[str, ...]:
    return tuple(v.name for v in ALL if v.carried)


def fail_on() -> dict[str, tuple[str, ...]]:
    """`--fail-on` levels and the verdicts each fails: `never`, then each problem, which fails
    itself and every worse one."""
    worst_first = problems()
    return {"never": (), **{p: worst_first[: i + 1] for i, p in enumerate(worst_first)}}


def listed_under(heading: str) -> tuple[str, ...]:
    """The verdicts a top line lists, in the registry's order."""
    return tuple(v.name for v in ALL if v.heading == heading)


def legend() -> str:
    """The comment's legend of verdict emoji: top lines first, then skipped."""
    shown = [get(n) for h, _ in TOP_LINES for n in listed_under(h)]
    shown += [v for v in ALL if v not in shown]
    return " · ".join(f"{v.emoji} {v.legend}" for v in shown)
