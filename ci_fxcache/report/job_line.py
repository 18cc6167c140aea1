"""The job's own compiles (`fxcache-stats/1`, ci_fxcache.jobstats) rendered: one line for the
PR comment and the job summary, the detail, and the scope's history as a mermaid chart and a
compact table. Every value from the trace goes through the report's escaping."""

from __future__ import annotations

from typing import Any

from ci_fxcache.report.render import html_text, md_text, plain

NAMES_SHOWN = 3
ONE_STEP = "set TORCH_TRACE for the job, not one step"


def _n(count: int, word: str) -> str:
    if count == 1:
        return f"{count} {word}"
    if word.endswith("entry"):
        return f"{count} {word[:-1]}ies"
    return f"{count} {word}{'es' if word.endswith('s') else 's'}"


def duration(seconds: float) -> str:
    """`42 s`, `3.5 min`."""
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def changed_names(doc: dict[str, Any]) -> list[str]:
    """The key components named by the job's key-changed misses, most frequent first."""
    counts: dict[str, int] = {}
    for miss in doc.get("misses") or []:
        for change in miss.get("changed") or []:
            counts[str(change["component"])] = counts.get(str(change["component"]), 0) + 1
    return sorted(counts, key=lambda n: (-counts[n], n))


def observed(doc: dict[str, Any]) -> bool:
    """Whether the job's trace held anything: a job that compiled nothing writes none, and
    then its line is noise where it is not asked for (`fxcache save`)."""
    return any(t.get("files") for t in doc.get("trace") or [])


def _read_nothing(doc: dict[str, Any]) -> bool:
    return not observed(doc)


def headline(doc: dict[str, Any]) -> str:
    """The job's line, plain text (escape it where it goes)."""
    untraced = int(doc.get("untraced_entries") or 0)
    if _read_nothing(doc):
        if untraced:
            wrote = _n(untraced, "new FX graph entry")
            return (
                f"your job: no trace of its compiles, yet it wrote {wrote}: a TORCH_TRACE set "
                f"for one step sends its trace elsewhere ({ONE_STEP})"
            )
        return ("your job: no trace of its compiles (nothing compiled, TORCH_TRACE was off, or "
                f"a step set its own: {ONE_STEP})")  # fmt: skip
    graphs, hits = int(doc.get("graphs") or 0), int((doc.get("fxgraph") or {}).get("hit") or 0)
    if graphs == 0:
        return "your job: torch.compile built no Inductor graph"
    parts = [f"your job: {hits} of {_n(graphs, 'graph')} from the cache"]
    causes = doc.get("miss_causes") or {}
    if causes.get("key changed"):
        names = changed_names(doc)
        more = f" (+{len(names) - NAMES_SHOWN})" if len(names) > NAMES_SHOWN else ""
        shown = ", ".join(names[:NAMES_SHOWN]) + more
        parts.append(f"{causes['key changed']} key changed" + (f": {shown}" if shown else ""))
    if causes.get("new graph"):
        parts.append(_n(int(causes["new graph"]), "new graph"))
    if causes.get("entry gone"):
        gone = int(causes["entry gone"])
        parts.append(f"{gone} {'entry' if gone == 1 else 'entries'} gone")
    if causes.get("compiled at once"):
        at_once = max((int(m.get("processes") or 2) for m in doc.get("misses") or []
                       if m.get("cause") == "compiled at once"), default=2)  # fmt: skip
        parts.append(f"{int(causes['compiled at once'])} compiled by {at_once} processes at once")
    cross = int(doc.get("cross_rank_misses") or 0)
    if cross:
        parts.append(f"{cross} AOTAutograd {'hit' if cross == 1 else 'hits'} dropped because "
                     "another rank missed")  # fmt: skip
    if untraced:
        parts.append(f"{_n(untraced, 'new entry')} from processes without this trace ({ONE_STEP})")
    bypass = int((doc.get("fxgraph") or {}).get("bypass") or 0)
    if bypass:
        parts.append(f"{bypass} bypassed")
    recompiles = int((doc.get("recompiles") or {}).get("count") or 0)
    if recompiles:
        parts.append(_n(recompiles, "recompile"))
    line = ", ".join(parts)
    ranks = processes(doc)
    if ranks:
        line += f"; {ranks}"
    saved = float(doc.get("saved_s") or 0)
    if saved >= 1:
        line += f"; the cache saved about {duration(saved)} of compile"
        total = float(doc.get("saved_sum_s") or 0)
        if doc.get("ranks") and total > saved + 0.5:
            line += (f" on the slowest rank ({duration(total)} summed over "
                     f"{int(doc.get('processes') or 0)} processes)")  # fmt: skip
    return line


def processes(doc: dict[str, Any]) -> str:
    """`2 processes (ranks 0, 1)` for a job whose processes are ranks; '' otherwise."""
    ranks = [int(r) for r in doc.get("ranks") or [] if isinstance(r, int)]
    if not ranks:
        return ""
    shown = ", ".join(map(str, ranks[:8])) + (
        f", … {len(ranks) - 8} more" if len(ranks) > 8 else ""
    )
    word = "rank" if len(ranks) == 1 else "ranks"
    return f"{_n(int(doc.get('processes') or 0), 'process')} ({word} {shown})"


def _times(doc: dict[str, Any]) -> str:
    """`compile 80 s (summed over processes), saved about 20 s (the slowest rank; 40 s summed
    over processes)`."""
    compile_s, saved = float(doc.get("compile_s") or 0), float(doc.get("saved_s") or 0)
    many = int(doc.get("processes") or 0) > 1
    text = f"compile {duration(compile_s)}" + (" (summed over processes)" if many else "")
    text += f", saved about {duration(saved)}"
    total = float(doc.get("saved_sum_s") or 0)
    if doc.get("ranks") and total > saved:
        text += f" (the slowest rank; {duration(total)} summed over processes)"
    return text


def _who(miss: dict[str, Any]) -> str:
    """The process a miss happened in: its rank where it had one, else its trace file."""
    rank = miss.get("rank")
    return f"rank {rank}" if isinstance(rank, int) else str(miss.get("process") or "?")


def _reasons(title: str, block: dict[str, Any]) -> list[str]:
    if not block.get("count"):
        return []
    lines = [f"**{md_text(title)}: {int(block['count'])}**", ""]
    lines += [f"- {int(r['count'])}× {md_text(r['reason'])}" for r in block.get("reasons") or []]
    return [*lines, ""]


def _miss_row(miss: dict[str, Any]) -> str:
    changes = "; ".join(
        f"{c['component']} {c['was']} -> {c['now']}" for c in miss.get("changed") or []
    )
    more = int(miss.get("changed_count") or 0) - len(miss.get("changed") or [])
    if more > 0:
        changes += f" (+{more} more)"
    if miss.get("cause") == "compiled at once":
        changes = f"{int(miss.get('processes') or 2)} processes compiled this key at once"
    return (f"| {md_text(miss['cause'])} | {md_text(miss['key'])} | {md_text(_who(miss))} | "
            f"{md_text(changes or '-')} |")  # fmt: skip


# The phase of a warm start -> (mechanism, what it skips): advice given only where this run's
# matrix verified the mechanism safe for the model (report.safe_mechanisms).
ADVICE = {
    "Dynamo tracing": (("aot", "skips tracing"), ("precompile", "skips tracing")),
    "AOTAutograd tracing": (("aot", "skips tracing"), ("precompile", "skips tracing")),
    "guard building": (("aot", "loads the compiled function with its guards"),),
}
PHASES_SHOWN = 4


def where_time_went(doc: dict[str, Any], verified: frozenset[str] = frozenset()) -> str:
    """`where the compile time went: Inductor compiling 58 s, ...; re-tracing ...`: the parts
    from the trace's timed events (summed over processes), the largest named with the
    process that spent most on it, and advice only for a mechanism this run verified safe."""
    raw = doc.get("phases")
    phases: dict[str, Any] = raw if isinstance(raw, dict) else {}
    job = {str(k): float(v) for k, v in _dict(phases.get("job")).items()
           if isinstance(v, int | float) and v >= 0.5}  # fmt: skip
    if not job:
        return ""
    parts = sorted(job, key=lambda k: -job[k])[:PHASES_SHOWN]
    text = "where the compile time went: " + ", ".join(f"{k} {duration(job[k])}" for k in parts)
    largest = phases.get("largest")
    if largest in job and int(doc.get("processes") or 0) > 1:
        most = float(phases.get("per_process_s") or 0)
        text += f" ({largest}: {duration(most)} in the process that spent most)"
    for mechanism, skips in ADVICE.get(str(largest), ()):
        if mechanism in verified:
            text += (f"; {largest} took {duration(float(phases.get('per_process_s') or 0))} "
                     f"per process: `{mechanism}` is verified safe for this model here and "
                     f"{skips}")  # fmt: skip
            break
    return text


def detail(
    doc: dict[str, Any], misses_shown: int = 50, verified: frozenset[str] = frozenset()
) -> str:
    """The job's figures as markdown (the first `misses_shown` misses); `verified`: the
    mechanisms this run's matrix found safe (advice on the largest part of the compile)."""
    fx, aot = doc.get("fxgraph") or {}, doc.get("aotautograd") or {}
    lines = [
        "| | hits | misses | bypasses |",
        "|---|--:|--:|--:|",
        f"| FX graph | {fx.get('hit', 0)} | {fx.get('miss', 0)} | {fx.get('bypass', 0)} |",
        f"| AOTAutograd | {aot.get('hit', 0)} | {aot.get('miss', 0)} | {aot.get('bypass', 0)} |",
        "",
        f"{int(doc.get('frames') or 0)} frames compiled in "
        f"{md_text(processes(doc) or _n(int(doc.get('processes') or 0), 'process'))}, "
        f"{int(doc.get('cpp_builds') or 0)} C++ builds; {md_text(_times(doc))}",
        "",
    ]
    went = where_time_went(doc, verified)
    if went:
        lines += [md_text(went), ""]
    misses = doc.get("misses") or []
    if misses:
        lines += ["| miss | key | process | what changed (was -> now) |", "|---|---|---|---|"]
        lines += [_miss_row(m) for m in misses[:misses_shown]]
        if len(misses) > misses_shown:
            lines.append(f"| … {len(misses) - misses_shown} more | | | |")
        lines.append("")
    bypass = {
        "count": fx.get("bypass", 0) + aot.get("bypass", 0),
        "reasons": doc.get("bypass_reasons"),
    }
    lines += _reasons("bypassed", bypass)
    lines += _reasons("recompiles", doc.get("recompiles") or {})
    lines += _reasons("graph breaks", doc.get("graph_breaks") or {})
    lines += _reasons("failed compiles", doc.get("failures") or {})
    skipped = [t for t in doc.get("trace") or [] if t.get("stopped") or t.get("skipped_lines")]
    for t in skipped:
        why = "; ".join(t.get("stopped") or []) or f"{t['skipped_lines']} overlong line(s) skipped"
        lines += [f"trace read with limits: {md_text(why)}", ""]
    return "\n".join(lines)


def _mermaid_label(value: Any) -> str:
    return "".join(ch if ch.isalnum() or ch in " -:.()" else "'" for ch in plain(value))


def run_labels(rows: list[dict[str, Any]]) -> list[str]:
    """One label per run, none twice (mermaid's x axis is categorical: runs sharing a label
    share one bar, as runs of the same minute did): its run number (`57`, `57.2` for a second
    attempt), or the end of its job id where it has none (`ab05`); a label already taken gets
    its place (`57 (3)`). The chart is horizontal: a vertical one's labels overprinted each
    other from twenty five-digit run numbers on (tests/test_report_browser.py); the table has
    the times."""
    out: list[str] = []
    for index, row in enumerate(rows, 1):
        run = row.get("run")
        label = _mermaid_label(str(run) if run else str(row.get("id"))[-4:])
        out.append(f"{label} ({index})" if label in out else label)
    return out


def history(rows: list[dict[str, Any]]) -> str:
    """The scope's last runs: a mermaid chart (hit rate, one bar per run, labelled by
    `run_labels`) and a compact table."""
    if not rows:
        return ""
    rates = [_rate(r) for r in rows]
    labels = ", ".join(f'"{label}"' for label in run_labels(rows))
    chart = [
        "```mermaid",
        "xychart-beta horizontal",
        f'    title "FX graphs from the cache, last {len(rows)} runs (%)"',
        f'    x-axis "run" [{labels}]',
        '    y-axis "hit rate (%)" 0 --> 100',
        f"    bar [{', '.join(map(str, rates))}]",
        "```",
        "",
    ]
    table = [
        "| run | at (UTC) | hit rate | new graph | key changed | entry gone | compile | saved |",
        "|---|---|--:|--:|--:|--:|--:|--:|",
    ]
    for r, rate, label in zip(rows, rates, run_labels(rows), strict=True):
        m = r.get("misses") or {}
        table.append(
            f"| {md_text(label)} | {md_text(r['at'])} | {rate} % | {m.get('new graph', 0)} | "
            f"{m.get('key changed', 0)} | {m.get('entry gone', 0)} | "
            f"{duration(float(r['compile_s']))} | {duration(float(r['saved_s']))} |"
        )
    return "\n".join([*chart, *table, ""])


def summary(doc: dict[str, Any], verified: frozenset[str] = frozenset()) -> str:
    """The job summary's section: the line, the detail collapsed (advice only for the
    mechanisms in `verified`, those this run's matrix found safe), the history."""
    return "\n".join(
        [
            f"**{md_text(headline(doc))}**",
            "",
            f"<details><summary>{html_text('detail of the job')}</summary>",
            "",
            detail(doc, verified=verified),
            "</details>",
            "",
            history(doc.get("history") or []),
        ]
    )


def text(doc: dict[str, Any]) -> str:
    """For the terminal: the line, the counts, each miss with its cause (plain, one line each)."""
    fx, aot = doc.get("fxgraph") or {}, doc.get("aotautograd") or {}
    lines = [
        plain(headline(doc)),
        f"  FX graph: {fx.get('hit', 0)} hit, {fx.get('miss', 0)} miss, "
        f"{fx.get('bypass', 0)} bypass; AOTAutograd: {aot.get('hit', 0)} hit, "
        f"{aot.get('miss', 0)} miss, {aot.get('bypass', 0)} bypass",
        f"  {int(doc.get('frames') or 0)} frames, "
        f"{processes(doc) or _n(int(doc.get('processes') or 0), 'process')}, "
        f"{int(doc.get('cpp_builds') or 0)} C++ builds, {_times(doc)}",
    ]
    went = where_time_went(doc)
    if went:
        lines.append(plain(f"  {went}"))
    for miss in doc.get("misses") or []:
        changes = "; ".join(
            f"{c['component']} {c['was']} -> {c['now']}" for c in miss.get("changed") or []
        )
        lines.append(
            plain(
                f"  miss {miss['key']} ({_who(miss)}): {miss['cause']}"
                + (f": {changes}" if changes else "")
            )
        )
    for title in ("recompiles", "graph_breaks", "failures"):
        for r in (doc.get(title) or {}).get("reasons") or []:
            lines.append(plain(f"  {title.replace('_', ' ')}: {r['count']}x {r['reason']}"))
    for r in doc.get("bypass_reasons") or []:
        lines.append(plain(f"  bypassed: {r['count']}x {r['reason']}"))
    return "\n".join(lines) + "\n" + history_text(doc.get("history") or [])


def _rate(row: dict[str, Any]) -> int:
    return round(100 * row["hits"] / row["graphs"]) if row["graphs"] else 0


def history_text(rows: list[dict[str, Any]]) -> str:
    """The scope's last runs for the terminal, one line each."""
    lines = [f"history (last {len(rows)} runs of the scope):"] if rows else ["no history yet"]
    for row in rows:
        m = row.get("misses") or {}
        lines.append(
            plain(
                f"  {row['at']}  {_rate(row):3d} % of {row['graphs']} graphs; misses: "
                f"{m.get('new graph', 0)} new, {m.get('key changed', 0)} key changed, "
                f"{m.get('entry gone', 0)} gone; compile {duration(float(row['compile_s']))}, "
                f"saved {duration(float(row['saved_s']))}"
            )
        )
    return "\n".join(lines) + "\n"


FLEET_MISSES = 50  # misses whose changed components a fleet keeps per runner
FLEET_RUNNERS = 64  # runners' figures read per environment
_CAUSES = ("new graph", "key changed", "entry gone", "compiled at once")


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _seconds(value: Any) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < 1e9
    return float(value) if ok else 0.0


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any, most: int) -> list[Any]:
    return value[:most] if isinstance(value, list) else []


def for_fleet(doc: Any) -> dict[str, Any]:
    """What a fleet's job line needs of one runner's figures (`fxcache-stats/1`), typed and
    bounded: a runner's figures come from its job's own trace (a fork's, maybe), and a merged
    document from an artifact. `headline` reads the result as it reads the figures."""
    doc = _dict(doc)
    fx, causes = _dict(doc.get("fxgraph")), _dict(doc.get("miss_causes"))
    misses = []
    for miss in _list(doc.get("misses"), FLEET_MISSES):
        changed = _list(_dict(miss).get("changed"), 5)
        names = [str(_dict(c).get("component"))[:80] for c in changed if _dict(c).get("component")]
        if names:
            misses.append({"changed": [{"component": n} for n in names]})
    return {
        "scope_key": str(doc.get("scope_key") or "")[:300],
        "trace": [
            {"files": sum(_count(_dict(t).get("files")) for t in _list(doc.get("trace"), 8))}
        ],
        "graphs": _count(doc.get("graphs")),
        "fxgraph": {k: _count(fx.get(k)) for k in ("hit", "miss", "bypass")},
        "miss_causes": {k: _count(causes.get(k)) for k in _CAUSES},
        "misses": misses,
        "recompiles": {"count": _count(_dict(doc.get("recompiles")).get("count"))},
        "saved_s": _seconds(doc.get("saved_s")),
    }


def combined(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """Several runners' `for_fleet` figures of one environment as one (counts summed)."""
    docs = [for_fleet(d) for d in docs]
    return {
        "trace": [{"files": sum(d["trace"][0]["files"] for d in docs)}],
        "graphs": sum(d["graphs"] for d in docs),
        "fxgraph": {k: sum(d["fxgraph"][k] for d in docs) for k in ("hit", "miss", "bypass")},
        "miss_causes": {k: sum(d["miss_causes"][k] for d in docs) for k in _CAUSES},
        "misses": [m for d in docs for m in d["misses"]][:FLEET_MISSES],
        "recompiles": {"count": sum(d["recompiles"]["count"] for d in docs)},
        "saved_s": sum(d["saved_s"] for d in docs),
    }


def fleet_line(docs: Any) -> str:
    """One environment's line from its runners' figures (`your job: ...`; `your 2 jobs: ...`
    where several runners of it sent theirs), or '' when none did."""
    runners = [d for d in _list(docs, FLEET_RUNNERS) if isinstance(d, dict)]
    if not runners:
        return ""
    line = headline(combined(runners))
    if len(runners) > 1:
        line = line.replace("your job:", f"your {len(runners)} jobs:", 1)
    return line


COMMENT_MISSES = 10


def under_status(body: str, doc: dict[str, Any], verified: frozenset[str] = frozenset()) -> str:
    """A rendered PR comment with the job's line under its status line (the first) and the
    job's detail collapsed; the body unchanged when the figures cannot be rendered."""
    try:
        section = [
            f"**{md_text(headline(doc))}**",
            "",
            f"<details><summary>{html_text('your job: detail')}</summary>",
            "",
            detail(doc, COMMENT_MISSES, verified),
            "</details>",
            "",
        ]
    except (KeyError, TypeError, ValueError, AttributeError):
        return body
    status, _, rest = body.partition("\n")
    return "\n".join([status, "", *section]) + rest
