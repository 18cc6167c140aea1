"""The report's view model: rows, the three top lines, recommendations, the fleet matrix.

Built once from `Results`; the markdown, text, JUnit and comment renderers only format it.
Everything here is plain text taken from the results as it is: the renderers escape it.
Rows switch on the structured `cause` (schema v2), never on the wording of `reason`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ci_fxcache.report import labels, recommendations
from ci_fxcache.report.known_issues import KnownIssue
from ci_fxcache.results import reader
from ci_fxcache.results.reader import VERDICT_ORDER, Group, Results

TOP_ENTRIES = 8  # entries a top line names before "and N more in the table"
# The three top lines, in this order: (emoji, heading, verdicts it lists).
TOP_LINES = (
    ("✅", "Cache", ("safe",)),
    ("❌", "Do not cache", ("unsafe",)),
    ("🟡", "Check", ("no-gain", "error")),
)


def cause_of(combo: dict[str, Any]) -> str:
    """The combination's cause: the document's `cause`, derived only where it has none."""
    cause = combo.get("cause")
    return str(cause) if cause else reader.v1_cause(combo)


def why_text(combo: dict[str, Any], cause: str) -> str:
    """The cause in a few words, with the one figure that supports it."""
    hot = combo.get("hot") or {}
    words = labels.CAUSE_WORDS.get(cause, cause)
    if combo.get("verdict") == "skipped":
        return str(combo.get("reason") or words)
    if cause == "hit":
        return ""  # the verdict says it all
    if cause == "crash" and hot.get("signal"):
        return f"{words}, {hot['signal']}"
    built = int(hot.get("kernels_built") or 0) + int(hot.get("triton_kernels_built") or 0)
    if cause == "rebuilt" and built:
        return f"hit, but {built} kernel file{'s' if built != 1 else ''} rebuilt"
    if cause == "slow" and combo.get("speedup") is not None:
        return f"{words}: {labels.fmt_speedup(combo['speedup'])}"
    differs = (combo.get("explain") or {}).get("differs") or []
    if cause in ("miss", "rebuilt") and differs:
        names = ", ".join(str(d.get("component")) for d in differs if isinstance(d, dict))
        return f"{words}: {names} {'differ' if len(differs) > 1 else 'differs'}"
    return words


@dataclass
class Row:
    """One combination as run on one runner (or, in `Section.rows`, its worst runner)."""

    combo: dict[str, Any]
    runner: str
    label: str
    issues: list[KnownIssue] = field(default_factory=list)
    disagreement: str = ""
    order: int = 0  # position in the results document (verify's plan order)
    advice: str = ""
    verdict: str = field(init=False)

    def __post_init__(self) -> None:
        self.verdict = str(self.combo["verdict"])

    @property
    def cause(self) -> str:
        return cause_of(self.combo)

    @property
    def emoji(self) -> str:
        return labels.EMOJI.get(self.verdict, "")

    @property
    def why(self) -> str:
        why = why_text(self.combo, self.cause)
        judged_at = labels.carried_from(self.combo)
        if judged_at is None:
            return why
        return f"{labels.NOT_RECHECKED}, judged {judged_at[:10]}: {why}"

    @property
    def notes(self) -> list[dict[str, Any]]:
        return [n for n in self.combo.get("notes") or [] if isinstance(n, dict)]

    def phase(self, name: str) -> dict[str, Any]:
        return dict(self.combo.get(name) or {})

    @property
    def cold_s(self) -> str:
        return labels.fmt_seconds(self.phase("cold").get("compile_s"))

    @property
    def hot_s(self) -> str:
        return labels.fmt_seconds(self.phase("hot").get("compile_s"))

    @property
    def shows_speedup(self) -> bool:
        """Unsafe rows never show a speedup: a fast wrong answer is no win."""
        return self.verdict in ("safe", "no-gain") and self.combo.get("speedup") is not None

    @property
    def speedup(self) -> str:
        return labels.fmt_speedup(self.combo.get("speedup")) if self.shows_speedup else "–"

    @property
    def hits_misses(self) -> str:
        hits, misses = self.combo.get("hits"), self.combo.get("misses")
        if self.verdict == "skipped" or (hits is None and misses is None):
            return "–"
        return f"{hits if hits is not None else '–'}/{misses if misses is not None else '–'}"

    @property
    def err_hot(self) -> str:
        return labels.fmt_err((self.combo.get("max_abs_err") or {}).get("hot_vs_cold"))

    @property
    def err_eager(self) -> str:
        return labels.fmt_err((self.combo.get("max_abs_err") or {}).get("cold_vs_eager"))

    @property
    def reason(self) -> str:
        return str(self.combo.get("reason") or "")

    @property
    def log(self) -> str:
        """The log tails of both phases, cold first."""
        parts = []
        for name in ("cold", "hot"):
            tail = self.phase(name).get("log_tail")
            if tail:
                parts.append(f"--- {name} ---\n{str(tail).rstrip()}")
        return "\n".join(parts)


@dataclass
class TopLine:
    """One of the three lines at the top: '❌ Do not cache: a (why), b (why)'."""

    emoji: str
    heading: str
    entries: list[str]


@dataclass
class Section:
    """One environment (fingerprint): one row per combination, worst runner first."""

    title: str
    arch: str
    heading: str  # the fields every row shares: 'sin_matmul · cuda · train'
    env: list[tuple[str, str]]
    runners: list[str]
    rows: list[Row]  # one per combination (worst across the runners), problems first
    skipped: list[Row]
    runner_rows: list[Row]  # every runner's own row, for JUnit and annotations
    top: list[TopLine]
    advice: list[str]
    counts: dict[str, int]
    varying: tuple[str, ...] = ()

    @property
    def issues(self) -> list[KnownIssue]:
        seen: dict[str, KnownIssue] = {}
        for row in self.rows + self.skipped:
            for issue in row.issues:
                seen.setdefault(issue.id, issue)
        return list(seen.values())

    @property
    def chart_rows(self) -> list[Row]:
        """Safe rows with a measured speedup: the only rows the chart shows."""
        return [r for r in self.rows if r.verdict == "safe" and r.shows_speedup]

    @property
    def log_rows(self) -> list[Row]:
        """Rows whose logs say something: every row that is not safe."""
        return [r for r in self.rows + self.skipped if r.verdict != "safe" and r.log]

    @property
    def top_line(self) -> str:
        """The top lines as one plain string (JSON summary, last-resort markdown)."""
        return " ".join(f"{t.heading}: {', '.join(t.entries)}." for t in self.top)


@dataclass
class FleetMatrix:
    """Rows = combination label, columns = environment; cells are verdicts (+ known issue)."""

    columns: list[str]
    rows: list[tuple[str, list[tuple[str, bool]]]]  # label, [(verdict or "", has_issue)]


@dataclass
class Report:
    """Everything a renderer needs."""

    report_id: str
    fleet: bool
    sections: list[Section]
    matrix: FleetMatrix | None
    top: list[TopLine]
    key_diffs: list[str]
    counts: dict[str, int]
    created_at: str

    @property
    def unsafe_count(self) -> int:
        return self.counts.get("unsafe", 0)

    @property
    def all_rows(self) -> list[Row]:
        return [r for s in self.sections for r in s.runner_rows]

    @property
    def runner_count(self) -> int:
        return sum(len(s.runners) for s in self.sections)


def _gpu_summary(fp: dict[str, Any]) -> tuple[str, str]:
    """(`H200`, `sm90`) for the visible GPUs; ('', '') when none is used."""
    gpus = fp.get("gpus") or []
    if fp.get("device_kind", "cpu") == "cpu" or not gpus:
        return "", ""
    names = sorted({str(g.get("name", "")).removeprefix("NVIDIA ").strip() for g in gpus})
    archs = fp.get("gpu_archs") or sorted({str(g.get("arch", "")) for g in gpus})
    return " + ".join(n for n in names if n), "_".join(archs)


def environment_title(fp: dict[str, Any]) -> tuple[str, str]:
    """('H200, sm90, torch 2.13.0+cu128', 'sm90') or ('CPU x86_64 avx512, torch ...', 'cpu')."""
    if not fp:
        return "unknown environment (no fingerprint)", "unknown"
    torch = f"torch {fp.get('torch_version', '?')}"
    name, arch = _gpu_summary(fp)
    if arch:
        return f"{name}, {arch}, {torch}", arch
    return f"CPU {fp.get('machine', '')} {fp.get('cpu_isa', '')}".strip() + f", {torch}", "cpu"


def _environment_rows(group: Group) -> list[tuple[str, str]]:
    fp = group.fingerprint
    gpus = fp.get("gpus") or []
    gpu_text = (
        ", ".join(
            f"{g.get('name')} (capability {g.get('capability')}, {g.get('arch')})" for g in gpus
        )
        or "none"
    )
    rows = [
        ("torch", str(fp.get("torch_version") or "–")),
        ("torch git version", str(fp.get("torch_git_version") or "–")),
        ("CUDA", str(fp.get("cuda_version") or "–")),
        ("HIP", str(fp.get("hip_version") or "–")),
        ("triton", str(fp.get("triton_version") or "–")),
        (
            "Python",
            f"{fp.get('python_implementation', '')} {fp.get('python_version', '')} "
            f"({fp.get('python_abi', '')})".strip(),
        ),
        ("GPUs", gpu_text),
        ("driver", str(fp.get("driver_version") or "–")),
        ("CPU ISA", str(fp.get("cpu_isa") or "–")),
        ("scope key", group.scope_key or "–"),
        ("runners", ", ".join(s.runner_name for s in group.shards)),
    ]
    for shard in group.shards:
        prefix = f"cache ({shard.runner_name})" if len(group.shards) > 1 else "cache"
        rows.append((prefix, describe_cache(shard.doc.get("cache"))))
    return rows


def describe_cache(state: Any) -> str:
    """One line about the restore before the run (`fxcache-cache-state/1`, or null)."""
    if not isinstance(state, dict):
        return "not restored by fxcache (no --cache-state)"
    hit = state.get("hit", state.get("cache_hit"))
    parts = []
    if state.get("mode") == "cold-fallback":
        parts.append("store unusable: cold fallback")
    elif hit is not None:
        parts.append("restored (hit)" if hit else "not found (miss): cold start")
    key = state.get("scope_key") or state.get("cache_key")
    if key:
        parts.append(f"key {key}")
    if state.get("read_only"):
        why = state.get("read_only_reason")
        parts.append(f"read-only ({why})" if why else "read-only")
    removed = state.get("invalidated")
    if isinstance(removed, list):
        if removed:
            whys = sorted(
                {
                    str(r.get("versions") or r.get("reason") or "")
                    for r in removed
                    if isinstance(r, dict)
                }
                - {""}
            )
            more = f" ({'; '.join(whys)})" if whys else ""
            parts.append(f"invalidation removed {len(removed)} stale scope(s){more}")
        else:
            parts.append("nothing stale")
    quarantined = state.get("quarantined")
    if isinstance(quarantined, list) and quarantined:
        parts.append(f"{len(quarantined)} broken scope(s) quarantined")
    return "; ".join(parts) or "restored"


def _worst_per_combo(group: Group) -> dict[str, tuple[dict[str, Any], str, str]]:
    """Per combination id: the worst verdict across the runners, its runner, a disagreement."""
    by_id: dict[str, list[tuple[dict[str, Any], str]]] = {}
    for shard in group.shards:
        for c in shard.combos:
            by_id.setdefault(str(c["id"]), []).append((c, shard.runner_name))
    out = {}
    for cid, seen in by_id.items():
        worst, runner = min(seen, key=lambda cr: VERDICT_ORDER[cr[0]["verdict"]])
        verdicts = {c["verdict"] for c, _ in seen}
        note = ""
        if len(verdicts) > 1:
            note = "runners disagree: " + ", ".join(f"{c['verdict']} on {r}" for c, r in seen)
        out[cid] = (worst, runner, note)
    return out


def _short(entries: list[str]) -> list[str]:
    """A top line stays short: the first entries, then how many more the table holds."""
    if len(entries) <= TOP_ENTRIES:
        return entries
    return [*entries[:TOP_ENTRIES], f"and {len(entries) - TOP_ENTRIES} more in the table"]


def top_lines(rows: list[Row]) -> list[TopLine]:
    """At most three lines: what to cache, what not to cache and why, what to check and why."""
    out = []
    for emoji, heading, verdicts in TOP_LINES:
        picked = [r for r in rows if r.verdict in verdicts]
        if heading == "Cache":
            entries = [r.label for r in picked] or ["nothing passed verification"]
        else:
            entries = [f"{r.label} ({r.why})" for r in picked]
        if entries:
            out.append(TopLine(emoji, heading, _short(entries)))
    return out


def _advice_lines(rows: list[Row]) -> list[str]:
    lines = [f"{r.label} ({r.verdict}): {r.advice}" for r in rows if r.advice]
    if any(r.advice and r.cause not in labels.COMPILER_CAUSES for r in rows):
        lines.append(recommendations.DISABLE_LINE)
    return lines


def build_section(
    group: Group, issues: list[KnownIssue], varying: tuple[str, ...] | None = None
) -> Section:
    """Rows, top lines and recommendations for one environment."""
    title, arch = environment_title(group.fingerprint)
    torch_version = str(group.fingerprint.get("torch_version") or "")
    worst = _worst_per_combo(group)
    combos = [c for c, _, _ in worst.values()]
    ran = [c for c in combos if c["verdict"] != "skipped"]
    if varying is None:
        # Skipped combinations (e.g. cuda on a CPU runner) need not lengthen every other label.
        varying = labels.varying_fields(ran)
    safe_by_model = recommendations.group_safe(combos)

    torch_issues = [i for i in issues if i.concerns_torch(torch_version)]

    def make_row(c: dict[str, Any], runner: str, order: int) -> Row:
        row = Row(c, runner, labels.combo_label(c, varying), order=order)
        row.issues = [
            i for i in torch_issues if i.matches(c) and (c["verdict"] != "skipped" or i.verdicts)
        ]
        return row

    runner_rows = [
        make_row(c, shard.runner_name, position)
        for shard in group.shards
        for position, c in enumerate(shard.combos)
    ]
    own_row = {id(r.combo): r for r in runner_rows}  # the worst runner's row, reused
    rows = [
        replace(own_row[id(c)], disagreement=note, order=position)
        for position, (c, _, note) in enumerate(worst.values())
    ]
    for row in rows:
        if row.verdict in ("unsafe", "no-gain", "error"):
            alt = recommendations.best_alternative(row.combo, safe_by_model)
            alt_label = labels.combo_label(alt, varying) if alt else ""
            row.advice = recommendations.advice(row.combo, row.cause, alt, alt_label)
    rows.sort(key=lambda r: (VERDICT_ORDER[r.verdict], r.order))
    counts = {v: 0 for v in VERDICT_ORDER}
    for r in rows:
        counts[r.verdict] += 1
    shown = [r for r in rows if r.verdict != "skipped"]
    return Section(
        title=title,
        arch=arch,
        heading=labels.constant_heading(next(iter(ran or combos), None), varying),
        env=_environment_rows(group),
        runners=[s.runner_name for s in group.shards],
        rows=shown,
        skipped=[r for r in rows if r.verdict == "skipped"],
        runner_rows=runner_rows,
        top=top_lines(shown),
        advice=_advice_lines(shown),
        counts=counts,
        varying=varying,
    )


def column_names(sections: list[Section]) -> list[str]:
    """One column per environment: its architecture, or its title where architectures repeat."""
    names = [s.arch for s in sections]
    if len(set(names)) < len(names):
        names = [s.title for s in sections]
    return [
        f"{n} ×{len(s.runners)}" if len(s.runners) > 1 else n
        for n, s in zip(names, sections, strict=True)
    ]


def fleet_matrix(sections: list[Section]) -> FleetMatrix:
    """Rows = combination, columns = environment (identical runners already share a column)."""
    cells: dict[str, dict[int, tuple[str, bool]]] = {}
    for index, section in enumerate(sections):
        for row in section.rows + section.skipped:
            cells.setdefault(row.label, {})[index] = (row.verdict, bool(row.issues))
    return FleetMatrix(
        columns=column_names(sections),
        rows=[
            (label, [by_col.get(i, ("", False)) for i in range(len(sections))])
            for label, by_col in cells.items()
        ],
    )


def fleet_top(sections: list[Section], columns: list[str]) -> list[TopLine]:
    """The three top lines for a fleet: safe everywhere; unsafe where; to check where."""
    per_label: dict[str, list[tuple[str, Row]]] = {}
    for name, section in zip(columns, sections, strict=True):
        for row in section.rows:
            per_label.setdefault(row.label, []).append((name, row))
    safe = [lab for lab, seen in per_label.items() if all(r.verdict == "safe" for _, r in seen)]
    out = [
        TopLine("✅", "Cache everywhere it ran", _short(safe) or ["nothing passed on every runner"])
    ]
    for emoji, heading, verdicts in TOP_LINES[1:]:
        entries = [
            f"{lab} on {name} ({row.why})"
            for lab, seen in per_label.items()
            for name, row in seen
            if row.verdict in verdicts
        ]
        if entries:
            out.append(TopLine(emoji, heading, _short(entries)))
    return out


def key_diff_lines(doc: dict[str, Any]) -> list[str]:
    """One line per pair of environments whose cache keys differ (a merged document's
    `key_diffs`): 'sm80 vs sm90: gpu_name, arch'. Reads `a`/`b` (or a two-item `pair`,
    `groups` or `runners`) and `differs` (or `keyed`): component names or objects naming one."""
    lines = []
    for entry in doc.get("key_diffs") or []:
        if not isinstance(entry, dict):
            continue
        names = next(
            (entry[k] for k in ("pair", "groups", "runners") if isinstance(entry.get(k), list)),
            [entry.get("a", entry.get("left")), entry.get("b", entry.get("right"))],
        )
        a, b = (str(n) if n is not None else "?" for n in [*names, None, None][:2])
        parts = [
            str(d.get("component") or d.get("field") or d.get("name"))
            if isinstance(d, dict)
            else str(d)
            for d in entry.get("differs") or entry.get("keyed") or []
        ]
        lines.append(f"{a} vs {b}: {', '.join(parts) or 'no keyed difference'}")
    return lines


def build(results: Results, issues: list[KnownIssue]) -> Report:
    """The report for a document of either schema."""
    varying = None
    if results.is_fleet:  # one vocabulary across environments, so rows line up in the matrix
        varying = labels.varying_fields(
            [c for g in results.groups for s in g.shards for c in s.combos]
        )
    sections = [build_section(g, issues, varying) for g in results.groups]
    counts = {v: sum(s.counts[v] for s in sections) for v in VERDICT_ORDER}
    matrix = fleet_matrix(sections) if results.is_fleet else None
    return Report(
        report_id=results.report_id,
        fleet=results.is_fleet,
        sections=sections,
        matrix=matrix,
        top=fleet_top(sections, matrix.columns) if matrix else sections[0].top,
        key_diffs=key_diff_lines(results.doc) if results.is_fleet else [],
        counts=counts,
        created_at=str(results.doc.get("created_at") or ""),
    )
