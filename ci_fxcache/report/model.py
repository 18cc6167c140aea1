"""The report's view model: rows, the three top lines, recommendations, the fleet matrix.

Built once from `Results`; the markdown, text, JUnit and comment renderers only format it.
Everything here is plain text taken from the results as it is: the renderers escape it.
Rows switch on the structured `cause` (schema v2), never on the wording of `reason`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ci_fxcache.env import torch_support
from ci_fxcache.report import labels, recommendations
from ci_fxcache.report.known_issues import KnownIssue
from ci_fxcache.results import reader
from ci_fxcache.results.reader import VERDICT_ORDER, Group, Results
from ci_fxcache.results.writer import CI_PATTERNS
from ci_fxcache.verify import causes, verdict_kinds

TOP_ENTRIES = 8  # entries a top line names before "and N more in the table"
CHART_MAX_BARS = 12  # more bars repeat the table without adding to it
CHART_MAX_LABEL = 34  # Mermaid drops every bar label once one runs to about 35
CHART_MAX_SPREAD = 20.0  # largest / smallest speedup: beyond this the small bars are slivers
PROBLEMS = verdict_kinds.problems()
# The three top lines, in this order: (emoji, heading, verdicts it lists).
TOP_LINES = tuple(
    (verdict_kinds.get(lead).emoji, heading, verdict_kinds.listed_under(heading))
    for heading, lead in verdict_kinds.TOP_LINES
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
        return f"{words}: {labels.fmt_speedup(combo['speedup'], cause)}"
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
    group: str = ""  # the varying fields (workload...): the heading the row sits under
    short: str = ""  # dtype, dynamic, mechanism
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
        age = labels.carried_age(self.combo)
        return f"{labels.NOT_RECHECKED}, judged {judged_at[:10]}{age}: {why}"

    @property
    def notes(self) -> list[dict[str, Any]]:
        return [n for n in self.combo.get("notes") or [] if isinstance(n, dict)]

    def phase(self, name: str) -> dict[str, Any]:
        return dict(self.combo.get(name) or {})

    @property
    def cold_s(self) -> str:
        return self._seconds("cold")

    @property
    def hot_s(self) -> str:
        return self._seconds("hot")

    def _seconds(self, name: str) -> str:
        """The phase's compile time; none where kernels were copied from the run's build memo
        (worker/phase.py BuildMemo): that time is not the phase's own."""
        phase = self.phase(name)
        if phase.get("kernels_from_memo"):
            return labels.fmt_seconds(None)
        return labels.fmt_seconds(phase.get("compile_s"))

    @property
    def shows_speedup(self) -> bool:
        """Unsafe rows never show a speedup: a fast wrong answer is no win."""
        return self.verdict in verdict_kinds.loaded() and self.combo.get("speedup") is not None

    @property
    def speedup(self) -> str:
        return labels.fmt_speedup(self.combo.get("speedup")) if self.shows_speedup else "–"

    @property
    def speedup_cell(self) -> str:
        """The speedup, and for a no-gain row why it is no gain (`2.4x · miss`)."""
        if not self.shows_speedup:
            return "–"
        hot = self.phase("hot")
        built = int(hot.get("kernels_built") or 0) + int(hot.get("triton_kernels_built") or 0)
        return labels.fmt_speedup_why(self.combo.get("speedup"), self.verdict, self.cause, built)

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
    lead: str = ""  # '56/60 safe; all but:' before the entries (or instead of them)
    sep: str = ", "  # between entries; "; " where an entry is itself a list (`grouped`)

    @property
    def text(self) -> str:
        """The lead and the entries as plain text (the renderers escape it)."""
        return " ".join([self.lead, self.sep.join(self.entries)]).strip()


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
    gpu: str = ""  # 'H200' (empty on a CPU)
    failing_jobs: int = 0  # runners whose `verify --fail-on` policy these verdicts fail
    judged_jobs: int = 0  # runners whose document says its --fail-on policy
    name: str = ""  # its column in a fleet report ('sm90 ×2')
    chart: list[Row] = field(default_factory=list)  # the bars, when a chart adds something
    chart_of: int = 0  # how many safe rows the chart chose from
    job: str = ""  # a fleet's line for its runners' own jobs (`your job: 35 of 38 graphs ...`)

    @property
    def where(self) -> str:
        """'H200 sm90' or 'CPU x86_64 avx512': the environment in a few words."""
        return f"{self.gpu} {self.arch}".strip() if self.gpu else self.title.split(", torch")[0]

    @property
    def ran(self) -> int:
        return sum(n for v, n in self.counts.items() if v != "skipped")

    @property
    def problem_rows(self) -> list[Row]:
        return [r for r in self.rows if r.verdict in PROBLEMS]

    @property
    def safe_rows(self) -> list[Row]:
        return [r for r in self.rows if r.verdict == "safe"]

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
        return " ".join(f"{t.heading}: {t.text.rstrip(':')}." for t in self.top)


@dataclass
class FleetMatrix:
    """Rows = combination label, columns = environment; cells are verdicts (+ known issue).

    Rows are sorted by their worst verdict across the columns (problems first, then plan
    order); `groups` and `short` name the heading each row sits under and its label there."""

    columns: list[str]
    rows: list[tuple[str, list[tuple[str, bool]]]]  # label, [(verdict or "", has_issue)]
    groups: dict[str, str] = field(default_factory=dict)  # label -> heading ('' when one)
    short: dict[str, str] = field(default_factory=dict)  # label -> 'bf16 dynamic precompile'

    @staticmethod
    def is_problem(cells: list[tuple[str, bool]]) -> bool:
        return any(v in PROBLEMS for v, _ in cells)

    def grouped(self, problems: bool) -> list[tuple[str, list[tuple[str, list[tuple[str, bool]]]]]]:
        """(heading, rows) for the problem rows (`problems`) or the others, headings in the order
        of their first row."""
        out: dict[str, list[tuple[str, list[tuple[str, bool]]]]] = {}
        for label, cells in self.rows:
            if self.is_problem(cells) == problems:
                out.setdefault(self.groups.get(label, ""), []).append((label, cells))
        return list(out.items())

    @property
    def problem_count(self) -> int:
        return sum(self.is_problem(cells) for _, cells in self.rows)


@dataclass
class Grid:
    """The dtype x dynamic answer for one workload (and mechanism set): rows = dtypes, columns =
    dynamic modes, each cell the verdict's symbol (one per environment in a fleet), the
    speedup where safe."""

    group: str  # the workload etc. ('' when the report holds one)
    mechanisms: list[str]  # the mechanisms its cells cover (named in a cell where they differ)
    columns: list[str]  # 'static', 'dynamic', 'mark_dynamic'
    rows: list[tuple[str, list[str]]]  # dtype, one cell per column


@dataclass
class Headline:
    """The first line: `❌ 1 unsafe · 56/60 safe · H200 sm90 · job fails · abc1234 · run #123`."""

    emoji: str
    problems: list[tuple[str, int]]  # (verdict, count) for unsafe, error, no-gain when > 0
    safe: int
    ran: int
    everywhere: bool  # a fleet counts combinations safe on every environment
    where: str
    job: str  # 'job fails', 'job passes', '2/4 jobs fail', or ''
    commit: str = ""
    commit_url: str = ""
    run: str = ""
    run_url: str = ""


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
    headline: Headline | None = None
    grids: list[Grid] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)  # `changed_workloads`

    @property
    def issues(self) -> list[KnownIssue]:
        """Every known issue any section shows, once."""
        seen: dict[str, KnownIssue] = {}
        for s in self.sections:
            for issue in s.issues:
                seen.setdefault(issue.id, issue)
        return list(seen.values())

    @property
    def environments(self) -> list[tuple[str, list[tuple[str, str]]]]:
        """A fleet's environment facts once: (field, [('', value)]) where every environment
        agrees, else (field, [(column, value), ...]): the key differences."""
        out: dict[str, list[tuple[str, str]]] = {}
        for s in self.sections:
            for name, value in s.env:
                out.setdefault(name, []).append((s.name, value))
        return [
            (name, [("", seen[0][1])] if len({v for _, v in seen}) == 1 else seen)
            for name, seen in out.items()
        ]

    @property
    def disable_line(self) -> bool:
        """Whether "Where no alternative fits..." belongs in the report (said once)."""
        return any(recommendations.DISABLE_LINE in s.advice for s in self.sections)

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


def torch_text(version: str) -> str:
    """The torch version as the context table shows it: a release newer than the newest
    tested says so (the notice `fxcache verify` printed), never more."""
    if not version:
        return "–"
    newer = torch_support.newer_than_tested(version) is not None
    return f"{version} (newer than tested: {torch_support.NEWEST_TESTED})" if newer else version


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
        ("torch", torch_text(str(fp.get("torch_version") or ""))),
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


def cache_line(heading: str, safe: list[str], ran: int, nothing: str) -> TopLine:
    """'✅ Cache: 56/60 safe; all but:' (the lines after it list the exceptions) or, where the
    safe ones are the fewer, '✅ Cache: 3/60 safe: a, b, c'."""
    if not safe:
        return TopLine(TOP_LINES[0][0], heading, [nothing])
    if len(safe) == ran:
        return TopLine(TOP_LINES[0][0], heading, [], f"all {ran} combinations safe")
    if len(safe) > ran - len(safe):
        return TopLine(TOP_LINES[0][0], heading, [], f"{len(safe)}/{ran} safe; all but:")
    return TopLine(TOP_LINES[0][0], heading, _short(safe), f"{len(safe)}/{ran} safe:")


def grouped(rows: list[Row]) -> list[str]:
    """'a, b (why)' per distinct why, in the order of the rows: a reason shared by eight
    combinations is said once."""
    labels_by_why: dict[str, list[str]] = {}
    for r in rows:
        labels_by_why.setdefault(r.why, []).append(r.label)
    return [f"{', '.join(names)} ({why})" for why, names in labels_by_why.items()]


def top_lines(rows: list[Row]) -> list[TopLine]:
    """At most three lines: what to cache, what not to cache and why, what to check and why."""
    safe = [r.label for r in rows if r.verdict == "safe"]
    out = [cache_line("Cache", safe, len(rows), "nothing passed verification")]
    for emoji, heading, verdicts in TOP_LINES[1:]:
        entries = grouped([r for r in rows if r.verdict in verdicts])
        if entries:
            out.append(TopLine(emoji, heading, _short(entries), sep="; "))
    return out


def _advice_lines(rows: list[Row]) -> list[str]:
    """Each piece of advice once, with every combination it serves (in the rows' order)."""
    served: dict[str, list[Row]] = {}
    for r in rows:
        if r.advice:
            served.setdefault(r.advice, []).append(r)
    lines = []
    for advice, group in served.items():
        verdicts = "/".join(dict.fromkeys(r.verdict for r in group))
        lines.append(f"{', '.join(r.label for r in group)} ({verdicts}): {advice}")
    if any(r.advice and r.cause not in labels.COMPILER_CAUSES for r in rows):
        lines.append(recommendations.DISABLE_LINE)
    return lines


def set_advice(
    section: Section, combos: list[dict[str, Any]], unsafe_elsewhere: dict[str, list[str]]
) -> None:
    """Each problem row's advice: the best alternative verified safe here, preferring one safe
    on every other environment too (`unsafe_elsewhere`: label -> where it is not safe); one
    that is not says where."""
    safe_by_model = recommendations.group_safe(combos)

    def elsewhere(c: dict[str, Any]) -> list[str]:
        return unsafe_elsewhere.get(labels.combo_label(c, section.varying), [])

    for row in section.rows:
        row.advice = ""
        if row.verdict in PROBLEMS:
            alt = recommendations.best_alternative(row.combo, safe_by_model, elsewhere)
            alt_label = labels.short_label(alt) if alt else ""  # the same model, always
            row.advice = recommendations.advice(
                row.combo, row.cause, alt, alt_label, elsewhere(alt) if alt else []
            )
    section.advice = _advice_lines(section.rows)


def _chart(rows: list[Row]) -> tuple[list[Row], int]:
    """The bars (the fastest safe rows) when a chart adds something to the table: a few bars,
    labels Mermaid can show, no bar a sliver beside the longest. Else no chart."""
    safe = sorted(
        (r for r in rows if r.verdict == "safe" and r.shows_speedup),
        key=lambda r: -float(r.combo["speedup"]),
    )
    bars = safe[:CHART_MAX_BARS]
    speeds = [float(r.combo["speedup"]) for r in bars]
    if (
        len(bars) < 2
        or any(len(r.label) > CHART_MAX_LABEL for r in bars)
        or min(speeds) <= 0
        or max(speeds) / min(speeds) > CHART_MAX_SPREAD
    ):
        return [], len(safe)
    return bars, len(safe)


def _jobs(group: Group) -> tuple[int, int]:
    """(runners whose --fail-on policy these verdicts fail, runners that state a policy)."""
    failing = judged = 0
    for shard in group.shards:
        fail_on = (shard.doc.get("settings") or {}).get("fail_on")
        if fail_on in causes.FAIL_ON:
            judged += 1
            failing += bool(causes.failing(shard.combos, str(fail_on)))
    return failing, judged


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
    for r in runner_rows:
        r.group = labels.group_label(r.combo, varying)
        r.short = labels.short_label(r.combo)
    own_row = {id(r.combo): r for r in runner_rows}  # the worst runner's row, reused
    rows = [
        replace(own_row[id(c)], disagreement=note, order=position)
        for position, (c, _, note) in enumerate(worst.values())
    ]
    rows.sort(key=lambda r: (VERDICT_ORDER[r.verdict], r.order))
    counts = {v: 0 for v in VERDICT_ORDER}
    for r in rows:
        counts[r.verdict] += 1
    shown = [r for r in rows if r.verdict != "skipped"]
    failing, judged = _jobs(group)
    chart, chart_of = _chart(shown)
    section = Section(
        title=title,
        arch=arch,
        heading=labels.constant_heading(next(iter(ran or combos), None), varying),
        env=_environment_rows(group),
        runners=[s.runner_name for s in group.shards],
        rows=shown,
        skipped=[r for r in rows if r.verdict == "skipped"],
        runner_rows=runner_rows,
        top=top_lines(shown),
        advice=[],
        counts=counts,
        varying=varying,
        gpu=_gpu_summary(group.fingerprint)[0],
        failing_jobs=failing,
        judged_jobs=judged,
        chart=chart,
        chart_of=chart_of,
    )
    set_advice(section, combos, {})
    return section


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
    """Rows = combination, columns = environment (identical runners already share a column),
    sorted by the worst verdict across the columns, then plan order."""
    cells: dict[str, dict[int, tuple[str, bool]]] = {}
    first: dict[str, Row] = {}
    for index, section in enumerate(sections):
        for row in section.rows + section.skipped:
            cells.setdefault(row.label, {})[index] = (row.verdict, bool(row.issues))
            first.setdefault(row.label, row)
    rows = [
        (label, [by_col.get(i, ("", False)) for i in range(len(sections))])
        for label, by_col in cells.items()
    ]

    def worst(item: tuple[str, list[tuple[str, bool]]]) -> tuple[int, int]:
        ranks = [VERDICT_ORDER[v] for v, _ in item[1] if v] or [len(VERDICT_ORDER)]
        return (min(ranks), first[item[0]].order)

    rows.sort(key=worst)
    return FleetMatrix(
        columns=[s.name for s in sections],
        rows=rows,
        groups={label: first[label].group for label in cells},
        short={label: first[label].short for label in cells},
    )


def not_safe_where(sections: list[Section]) -> dict[str, list[str]]:
    """Per combination label: the environments (column names) that ran it and found it not safe."""
    out: dict[str, list[str]] = {}
    for section in sections:
        for row in section.rows:
            if row.verdict != "safe":
                out.setdefault(row.label, []).append(section.name)
    return out


def fleet_top(sections: list[Section], matrix: FleetMatrix) -> list[TopLine]:
    """The fleet's one top line: what is safe on every environment that ran it; the problems
    table right below lists the exceptions, each once."""
    ran = [lab for lab, cells in matrix.rows if any(v and v != "skipped" for v, _ in cells)]
    bad = not_safe_where(sections)
    safe = [lab for lab in ran if lab not in bad]
    line = cache_line("Cache everywhere it ran", safe, len(ran), "nothing passed on every runner")
    if line.lead.endswith("all but:"):
        line.lead = line.lead.removesuffix(" all but:") + " the exceptions are in the table below."
    return [line]


def _grid_cell(per_mech: dict[str, list[Row | None]], columns: list[str], fleet: bool) -> str:
    """One grid cell: the combinations of every mechanism at this dtype and dynamic mode, per
    environment. Where they all agree, one symbol (with the speedup where safe, on one
    environment; with where it is not safe, in a fleet); else one entry per mechanism."""
    if not any(r for rows in per_mech.values() for r in rows):
        return "–"

    def worst(rows: list[Row | None]) -> str:
        found = [r.verdict for r in rows if r]
        return min(found, key=lambda v: VERDICT_ORDER[v]) if found else ""

    def ran(rows: list[Row | None]) -> list[Row | None]:
        """A skipped combination says nothing here unless nothing ran (the arch lines count it)."""
        return [r if r and r.verdict != "skipped" else None for r in rows]

    def entry(rows: list[Row | None], speed_rows: list[Row | None]) -> str:
        verdict = worst(rows)
        text = labels.EMOJI.get(verdict, "–")
        if fleet:
            bad = [c for c, r in zip(columns, rows, strict=True) if r and r.verdict in PROBLEMS]
            return f"{text} {', '.join(bad)}" if bad and len(bad) < len(columns) else text
        speeds = sorted(float(r.combo["speedup"]) for r in speed_rows if r and r.shows_speedup)
        if verdict == "safe" and speeds:
            lo, hi = labels.fmt_speedup(speeds[0]), labels.fmt_speedup(speeds[-1])
            text += " " + (lo if lo == hi else lo.removesuffix("x") + "–" + hi)
        return text

    present = {m: ran(rows) for m, rows in per_mech.items() if any(ran(rows))}
    if not present:
        return labels.EMOJI["skipped"]
    # Mechanisms agree when they have the same worst verdict, on the same environments.
    patterns = {
        (worst(rows), tuple(bool(r and r.verdict in PROBLEMS) for r in rows))
        for rows in present.values()
    }
    if len(patterns) == 1:
        first = next(iter(present.values()))
        return entry(first, [r for rows in present.values() for r in rows])
    return " · ".join(f"{m} {entry(rows, rows)}" for m, rows in present.items())


def grids(sections: list[Section], fleet: bool) -> list[Grid]:
    """Per workload (heading group): rows = dtypes, columns = dynamic modes; a cell names its
    mechanisms only where their verdicts differ."""
    columns = [s.name for s in sections]
    found: dict[str, dict[tuple[str, str, str], list[Row | None]]] = {}
    order: dict[str, list[Row]] = {}
    for index, section in enumerate(sections):
        for row in section.rows + section.skipped:
            key = (str(row.combo["dtype"]), str(row.combo["dynamic"]), str(row.combo["mechanism"]))
            cell = found.setdefault(row.group, {}).setdefault(key, [None] * len(sections))
            if cell[index] is None:
                cell[index] = row
            order.setdefault(row.group, []).append(row)
    out = []
    for group, cells in found.items():
        rows = sorted(order[group], key=lambda r: r.order)
        mechs = list(dict.fromkeys(str(r.combo["mechanism"]) for r in rows))
        dtypes = list(dict.fromkeys(str(r.combo["dtype"]) for r in rows))
        dyns = sorted({str(r.combo["dynamic"]) for r in rows}, key=labels.dynamic_rank)
        table = [
            (
                labels.short_dtype(d),
                [
                    _grid_cell(
                        {m: cells[(d, y, m)] for m in mechs if (d, y, m) in cells}, columns, fleet
                    )
                    for y in dyns
                ],
            )
            for d in dtypes
        ]
        out.append(Grid(group, mechs, [labels.dynamic_word(y) for y in dyns], table))
    return out


def ci_run(results: Results) -> dict[str, str]:
    """The commit and run the results came from (`ci`, recorded by verify and merge inside
    GitHub Actions): the merged document's own, else the first shard's. Fields that do not
    look exactly like GitHub's are dropped, so no link is built from anything else."""
    docs = [results.doc, *(s.doc for g in results.groups for s in g.shards)]
    ci: dict[str, Any] = next((d["ci"] for d in docs if isinstance(d.get("ci"), dict)), {})

    def ok(name: str) -> str:
        value = ci.get(name)
        return value if isinstance(value, str) and CI_PATTERNS[name].fullmatch(value) else ""

    return {name: ok(name) for name in CI_PATTERNS}


def headline(results: Results, sections: list[Section], matrix: FleetMatrix | None) -> Headline:
    """The status line: worst verdict, problem counts, safe/total, where, the job, commit, run."""
    counts = {v: sum(s.counts[v] for s in sections) for v in VERDICT_ORDER}
    if matrix is None:
        safe, ran = sections[0].counts["safe"], sections[0].ran
        where = sections[0].where
    else:
        bad = not_safe_where(sections)
        ran_labels = [
            lab for lab, cells in matrix.rows if any(v and v != "skipped" for v, _ in cells)
        ]
        safe, ran = sum(lab not in bad for lab in ran_labels), len(ran_labels)
        unique = len({s.arch for s in sections}) == len(sections)
        where = f"{len(sections)} {'architectures' if unique else 'environments'}"
    emoji = next(
        (labels.EMOJI[v] for v in PROBLEMS if counts[v]),
        labels.EMOJI["safe" if safe else "skipped"],
    )
    failing = sum(s.failing_jobs for s in sections)
    judged = sum(s.judged_jobs for s in sections)
    if judged == 1:
        job = "job fails" if failing else "job passes"
    elif judged:
        job = f"{failing}/{judged} jobs fail" if failing else f"all {judged} jobs pass"
    else:
        job = ""
    ci = ci_run(results)
    base = f"{ci['server_url']}/{ci['repository']}" if ci["server_url"] and ci["repository"] else ""
    # No break after "run"; a word joiner after '#': GitHub would link a bare '#123'.
    run = f"run\u00a0#\u2060{ci['run_number']}" if ci["run_number"] else ""
    run = run or (f"run\u00a0{ci['run_id']}" if ci["run_id"] else "")
    return Headline(
        emoji=emoji,
        problems=[(v, counts[v]) for v in PROBLEMS if counts[v]],
        safe=safe,
        ran=ran,
        everywhere=matrix is not None,
        where=where,
        job=job,
        commit=ci["sha"][:7],
        commit_url=f"{base}/commit/{ci['sha']}" if base and ci["sha"] else "",
        run=run,
        run_url=f"{base}/actions/runs/{ci['run_id']}" if base and ci["run_id"] and run else "",
    )


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


def changed_workloads(rows: list[Row]) -> list[str]:
    """One entry per workload whose model changed since its recorded reference (verify judged
    it cold and hot again): `name (what changed)`, in row order."""
    found: dict[str, list[str]] = {}
    for row in rows:
        why = labels.changed_why(row.combo)
        if why is not None and labels.changed_unchecked(row.combo):
            why = f"could not be compared: {why}"
        if why is not None:
            whys = found.setdefault(str(row.combo.get("workload") or "?"), [])
            if why not in whys:
                whys.append(why)
    return [f"{name} ({'; '.join(whys)})" for name, whys in found.items()]


def build(results: Results, issues: list[KnownIssue]) -> Report:
    """The report for a document of either schema."""
    varying = None
    if results.is_fleet:  # one vocabulary across environments, so rows line up in the matrix
        varying = labels.varying_fields(
            [c for g in results.groups for s in g.shards for c in s.combos]
        )
    built = [(build_section(g, issues, varying), g) for g in results.groups]
    built.sort(key=lambda sg: (labels.arch_key(sg[0].arch), sg[0].title))  # sm80, sm90, sm100, gfx
    sections = [s for s, _ in built]
    for section, name in zip(sections, column_names(sections), strict=True):
        section.name = name
    counts = {v: sum(s.counts[v] for s in sections) for v in VERDICT_ORDER}
    matrix = None
    if results.is_fleet:
        matrix = fleet_matrix(sections)
        elsewhere = not_safe_where(sections)
        from ci_fxcache.report import job_line

        # The merged document's groups, in the order the reader built its own from them.
        jobs = {
            id(g): gdoc.get("job_stats")
            for g, gdoc in zip(results.groups, results.doc["groups"], strict=True)
        }
        for section, group in built:
            section.chart = []  # the matrix and the grid are a fleet's summary
            section.job = job_line.fleet_line(jobs.get(id(group)))
            combos = [c for c, _, _ in _worst_per_combo(group).values()]
            set_advice(section, combos, elsewhere)
    return Report(
        report_id=results.report_id,
        fleet=results.is_fleet,
        sections=sections,
        matrix=matrix,
        top=fleet_top(sections, matrix) if matrix else sections[0].top,
        key_diffs=key_diff_lines(results.doc) if results.is_fleet else [],
        counts=counts,
        created_at=str(results.doc.get("created_at") or ""),
        headline=headline(results, sections, matrix),
        grids=grids(sections, results.is_fleet),
        changed=changed_workloads([r for s in sections for r in s.runner_rows]),
    )
