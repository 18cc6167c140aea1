"""Renderers: markdown (jinja2 templates in the package), aligned text, JUnit XML."""

from __future__ import annotations

import functools
import html
import math
import os
import re
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ci_fxcache import userfiles
from ci_fxcache.errors import UsageError
from ci_fxcache.report import labels, recommendations, text_table
from ci_fxcache.report.model import Report, Row
from ci_fxcache.verify import verdict_kinds

_MIN_ROW_CHARS = 40  # no table row renders shorter than this
# GitHub rejects issue comments longer than 65,536 characters; leave room for the marker.
COMMENT_LIMIT = 65_536
DEFAULT_MAX_CHARS = 65_000
# A fleet's comment, whatever its model names: a comment that long is read, not scrolled past;
# the JSON results and the job summary have the rest (issue 46).
FLEET_COMMENT_CHARS = 20_000


@dataclass(frozen=True)
class Detail:
    """How much the markdown shows; the size limiter steps down through these."""

    environment: bool = True
    chart: bool = True
    grid: bool = True
    logs: bool = True
    log_chars: int = 3000
    max_rows: int = 100_000
    max_chart: int = 40
    problems_only: bool = False
    recommendations: bool = True
    # a fleet's per-environment tables (its problems matrix names every problem everywhere)
    sections: bool = True
    note: str = ""


_ZWSP = "\u200b"  # breaks mentions, issue references and autolinks without a visible change
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
# What changes what a reader sees without being seen: bidi embeddings, overrides, isolates and
# marks (a fork's text could reorder the words around it), zero-width and other invisible
# format characters, Unicode tag characters, C1 controls, line and paragraph separators.
_INVISIBLE = re.compile(
    "[\u0080-\u009f\u00ad\u061c\u115f\u1160\u180e\u200b-\u200f\u2028-\u202e"
    "\u2060-\u206f\u3164\ufeff\uffa0\ufff9-\ufffb\U000e0000-\U000e0fff]+"
)
_MD_PUNCT = re.compile(r"([\\`*_\[\]|~])")
_LIST_MARKER = re.compile(r"^([-+]|\d{1,9}[.)])(?=\s|$)")
_AUTOLINK = re.compile(r"(://|(?i:www)\.)")
# Not `\b`: `_` is a word character, and the `wbr` filter's break after `_` starts a text node
# GitHub links (`_GH-7`).
_GH_REFERENCE = re.compile(r"(?<![A-Za-z0-9])(gh)(?=-\d)", re.I)


def visible(text: str) -> str:
    """`text` without the characters that change what a reader sees without being seen
    (_INVISIBLE): every escape of free text (markdown, HTML, log blocks, JUnit) goes through
    here, so what a reader sees is the order the text has."""
    return _INVISIBLE.sub("", text)


def plain(value: Any) -> str:
    """Free text on one line: control characters (newlines, ANSI escapes) become spaces,
    invisible ones go (visible)."""
    text = visible(_ANSI.sub("", "" if value is None else str(value)))
    return _CONTROL.sub(" ", text).strip()


def _neutralise(text: str) -> str:
    """No mention (`@x`), issue reference (`#1`, `GH-1`) or bare URL survives GitHub's
    linkers."""
    text = text.replace("@", "@" + _ZWSP).replace("#", "#" + _ZWSP)
    text = _GH_REFERENCE.sub("\\1" + _ZWSP, text)
    return _AUTOLINK.sub(lambda m: m.group(1)[:-1] + _ZWSP + m.group(1)[-1], text)


def md_text(value: Any) -> str:
    """Free text from results, safe anywhere inline in markdown (table cells included):
    no HTML, link, image, emphasis, code span, mention or list marker survives."""
    return _md_text("" if value is None else str(value))


@functools.lru_cache(maxsize=65_536)  # reports repeat the same labels and words many times
def _md_text(value: str) -> str:
    text = _neutralise(plain(value))
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = _MD_PUNCT.sub(r"\\\1", text)
    # A list marker at the start would nest a list inside a list item.
    return _LIST_MARKER.sub(lambda m: m.group(1)[:-1] + "\\" + m.group(1)[-1], text)


def html_text(value: Any) -> str:
    """Free text inside raw HTML (`<summary>`), where markdown escapes do not apply."""
    return html.escape(_neutralise(plain(value)), quote=True)


def _nowrap(word: str) -> str:
    """A verdict word that a narrow table cell does not break at its hyphen (`no-gain`)."""
    return word.replace("-", "\u2011")


def chart_top(value: Any) -> float:
    """The axis' end, near the largest value: it rounded up to the next of 1, 1.2, 1.5, 2, 2.5,
    3, 4, 5, 6, 8 times a power of ten (276.7 -> 300, 9.2 -> 10), so no bar is a sliver."""
    v = max(float(value or 0), 1.0)
    scale = 10 ** math.floor(math.log10(v))
    steps = (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10)
    return round(next(m * scale for m in steps if m * scale >= v * 1.02), 6)


_BREAK_AFTER = re.compile(r"(\\_|_|[:/]|\.(?!\d))(?=[^\s<])")


def break_points(escaped: str) -> str:
    """Already escaped text (`md` or `html`) with a `<wbr>` after `.`, `:`, `_` and `/`, so a
    long name (`myorg.models.big:build_model`) can wrap in a narrow table cell. `<wbr>` is
    not copied with the text and takes no part in links or mentions."""
    return _BREAK_AFTER.sub(lambda m: m.group(1) + "<wbr>", escaped)


def keep_refs(escaped: str) -> str:
    """An issue reference in a known issue's title (`pytorch#155332`, package data, already
    escaped) joined by a word joiner instead of the escaper's zero-width space, which is a
    line-break opportunity: both keep GitHub from linking it."""
    return re.sub("#\u200b(?=[0-9])", "#\u2060", escaped)


def group_in_order(rows: list[Any], attribute: str) -> list[tuple[str, list[Any]]]:
    """(value, rows) per distinct `attribute`, in the order of each value's first row."""
    out: dict[str, list[Any]] = {}
    for row in rows:
        out.setdefault(str(getattr(row, attribute)), []).append(row)
    return list(out.items())


def _speedup_cell(cell: str) -> str:
    """`1.0x&nbsp;· 6&nbsp;rebuilt`: the cell wraps, if at all, only after its `·`."""
    return re.sub(r" (rebuilt)$", r"&nbsp;\1", cell.replace("x · ", "x&nbsp;· "))


def _mermaid(value: Any) -> str:
    return re.sub(r'["\[\]<>&#;`]', "'", plain(value))


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def _tail(text: str, limit: int) -> str:
    text = visible(_ANSI.sub("", text))
    if len(text) <= limit:
        return text
    cut = text[-limit:]
    cut = cut.split("\n", 1)[1] if "\n" in cut else cut
    return f"[… {len(text) - len(cut)} earlier characters left out]\n{cut}"


def _fence(text: str) -> str:
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}text\n{text}\n{ticks}"


def _environment(template: str | None) -> tuple[Any, str]:
    import jinja2

    if template:
        path = Path(template)
        userfiles.read_text(path, f"--template {template}")  # a missing or binary file: exit 2
        loader: jinja2.BaseLoader = jinja2.FileSystemLoader(str(path.parent))
        name = path.name
    else:
        loader = jinja2.PackageLoader("ci_fxcache.report", "templates")
        name = "report.md.j2"
    env = jinja2.Environment(
        loader=loader,
        autoescape=False,  # markdown, not HTML: free text goes through the `md` filter
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=False,
    )
    env.filters.update(
        md=md_text,
        html=html_text,
        mermaid=_mermaid,
        tail=_tail,
        fence=_fence,
        field=labels.field_word,
        short_dtype=labels.short_dtype,
        dynamic_word=labels.dynamic_word,
        chart_top=chart_top,
        nowrap=_nowrap,
        wbr=break_points,
        refs=keep_refs,
        groupby_first=group_in_order,
        nowrap_num=_speedup_cell,
    )
    env.globals["emoji"] = labels.EMOJI
    env.globals["verdict_legend"] = verdict_kinds.legend()
    env.globals["disable_line"] = recommendations.DISABLE_LINE
    env.globals["changed_heading"] = labels.CHANGED_HEADING
    return env, name


def _levels(report: Report) -> list[Detail]:
    rows = max((len(s.rows) for s in report.sections), default=0)
    out = [
        Detail(),
        Detail(log_chars=800),
        Detail(logs=False),
        Detail(logs=False, chart=False),
        Detail(logs=False, chart=False, environment=False),
    ]
    if not _has_chart(report):
        out.remove(Detail(logs=False, chart=False))  # the same text as the level before
    lean = Detail(logs=False, chart=False, environment=False)
    out.append(replace(lean, problems_only=True))
    out.append(replace(lean, problems_only=True, recommendations=False))
    lean = replace(lean, grid=False)
    out.append(replace(lean, problems_only=True, recommendations=False))
    cap = 200
    while cap < rows:
        cap *= 2
    while cap >= 10:
        out.append(replace(lean, problems_only=True, recommendations=False, max_rows=cap))
        cap //= 2
    if report.fleet:
        # Last before the summary alone: the matrix keeps every problem row, unsafe ones
        # included, on every environment; what goes is each environment's table of them.
        out.append(replace(out[-1], sections=False))
    return out


def _has_chart(report: Report) -> bool:
    """Whether any section draws a chart (the model draws one only where it adds something;
    fleet reports never: the matrix and the grid are their summary)."""
    return any(s.chart for s in report.sections)


def _dropped(level: Detail, report: Report) -> str:
    parts = []
    if not level.logs:
        parts.append("log tails")
    elif level.log_chars < Detail().log_chars:
        parts.append("most of each log tail")
    if not level.chart and _has_chart(report):
        parts.append("the chart")
    if not level.environment:
        parts.append("the evidence and environment tables")
    if not level.grid:
        parts.append("the dtype × dynamic grid")
    if level.problems_only:
        parts.append("the safe rows (the grid shows them)")
    if not level.recommendations:
        parts.append("the recommendations")
    if level.max_rows < Detail().max_rows and level.sections:
        parts.append(f"rows past the first {level.max_rows} per environment")
    if not level.sections:
        parts.append("each environment's table (the problems matrix names every problem)")
    return ", ".join(parts)


def comment_budget(report: Report, limit: int) -> int:
    """The characters a pull-request comment of `report` may take: `limit`, and for a fleet
    at most FLEET_COMMENT_CHARS."""
    return min(limit, FLEET_COMMENT_CHARS) if report.fleet else limit


def markdown(
    report: Report, template: str | None = None, max_chars: int = DEFAULT_MAX_CHARS
) -> str:
    """The markdown report, stepped down (logs, chart, rows) until it fits in `max_chars`."""
    import jinja2

    env, name = _environment(template)
    try:
        tpl = env.get_template(name)
    except jinja2.TemplateError as exc:
        raise UsageError(f"template {name}: {exc}") from None

    # No more rows than could fit: every rendering stays bounded, so a huge document costs
    # one pass to build and a few bounded renderings, not one full rendering per level.
    fit = max(10, max_chars // _MIN_ROW_CHARS)

    def render(level: Detail) -> str:
        level = replace(level, max_rows=min(level.max_rows, fit))
        try:
            opts = {**asdict(level), "chart": level.chart and _has_chart(report)}
            return str(tpl.render(report=report, opts=opts))
        except jinja2.TemplateError as exc:
            raise UsageError(f"template {name}: {exc}") from None

    levels = _levels(report)
    rendered: dict[int, str] = {}

    def attempt(index: int) -> str:
        if index not in rendered:
            level = levels[index]
            if level != Detail():
                note = (
                    f"Shortened to fit {max_chars:,} characters (GitHub comments allow "
                    f"{COMMENT_LIMIT:,}): left out {_dropped(level, report)}. The JSON results "
                    "have everything."
                )
                level = replace(level, note=note)
            rendered[index] = _squeeze(render(level))
        return rendered[index]

    # Levels only ever leave more out, so the first that fits is found by bisection.
    low, high = 0, len(levels)
    while low < high:
        mid = (low + high) // 2
        if len(attempt(mid)) <= max_chars:
            high = mid
        else:
            low = mid + 1
    if low < len(levels) and len(attempt(low)) <= max_chars:
        return attempt(low)
    # Last resort: the headline, the note, and the answer alone, then a hard cut.
    head = "### " + headline_text(report, md_text) + "\n\n"
    note = (
        f"> [!NOTE]\n> Only the summary fits in {max_chars:,} characters; the table, "
        "recommendations and logs are in the job summary and the JSON results.\n\n"
    )
    lines = []
    if report.changed:
        lines.append(f"- {labels.CHANGED_HEADING}: {md_text('; '.join(report.changed))}")
    if report.fleet:
        lines += [
            f"- {md_text(s.name)}: {_counts(s.counts)}" + (f"; {md_text(s.job)}" if s.job else "")
            for s in report.sections
        ]
    lines += [f"- {md_text(t.heading)}: {md_text(t.text)}" for t in report.top]
    body = "\n".join(lines) + "\n"
    text = head + note + body
    if len(text) <= max_chars:
        return text
    return (head + note)[:max_chars] + body[: max(0, max_chars - len(head) - len(note))]


def _counts(counts: dict[str, int]) -> str:
    return " · ".join(f"{n} {labels.EMOJI[v]}" for v, n in counts.items() if n)


def headline_text(report: Report, escape: Any = None) -> str:
    """The status line as plain text (`escape` applied to free text): the last-resort
    markdown and the text format start with it."""
    esc = escape or plain
    h = report.headline
    rid = f" ({esc(report.report_id)})" if report.report_id != "fxcache" else ""
    if h is None:
        return f"fxcache{rid}"
    bits = [" · ".join(f"{n} {v}" for v, n in h.problems)] if h.problems else []
    bits.append(f"{h.safe}/{h.ran} safe" + (" everywhere" if h.everywhere else ""))
    run = h.run if escape else h.run.replace("\u2060", "").replace("\u00a0", " ")
    bits += [esc(h.where), esc(h.job), esc(h.commit), run]
    return f"fxcache{rid}: {h.emoji} " + " · ".join(b for b in bits if b)


def _squeeze(text: str) -> str:
    """Collapse the blank lines that template control blocks leave behind."""
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


# ---- text --------------------------------------------------------------------------------------


def use_colour(stream: Any = None) -> bool:
    """Colour only on a TTY and only when NO_COLOR is unset."""
    stream = stream or sys.stdout
    return bool(getattr(stream, "isatty", lambda: False)()) and "NO_COLOR" not in os.environ


TEXT_WIDTH = 100
LABEL_WIDTH = 40  # a combination column never takes more
_TEXT_HEADERS = ("verdict", "combination", "cold s", "hot s", "speedup", "why")
_TEXT_RIGHT = {2, 3, 4}  # cold s, hot s, speedup


def _wrapped(text_: str, indent: str = "  ") -> list[str]:
    import textwrap

    return textwrap.wrap(
        plain(text_), TEXT_WIDTH, subsequent_indent=indent, break_on_hyphens=False
    ) or [""]


def _grouped(rows: list[Row]) -> list[tuple[str, list[Row]]]:
    return group_in_order(rows, "group")


def _text_table(rows: list[Row], colour: bool) -> list[str]:
    """Rows under a heading per workload (where workloads vary); the label shortened in the
    middle, the why wrapped onto lines of its own column, never past 100 columns."""
    import textwrap

    cells = [
        (
            r.verdict,
            text_table.shorten_middle(plain(r.short or r.label), LABEL_WIDTH),
            r.cold_s,
            r.hot_s,
            plain(r.speedup_cell),
            (plain(r.why) + _issue_flag(r)).strip(),
        )
        for r in rows
    ]
    widths = text_table.widths([_TEXT_HEADERS, *cells])
    # The last column takes what is left of the line; longer text wraps within it.
    widths[-1] = max(8, TEXT_WIDTH - sum(widths[:-1]) - 2 * (len(widths) - 1))
    offset = TEXT_WIDTH - widths[-1]
    out = text_table.lines([_TEXT_HEADERS], column_widths=widths, rule=True)
    by_row = {id(r): c for r, c in zip(rows, cells, strict=True)}
    for group, members in _grouped(rows):
        if group:
            out.extend(_wrapped(f"[{group}]"))
        for r in members:
            row = by_row[id(r)]
            why = textwrap.wrap(row[-1], widths[-1], break_on_hyphens=False) or [""]
            line = text_table.lines([(*row[:-1], why[0])], right=_TEXT_RIGHT, column_widths=widths)[
                0
            ]
            if colour:
                code = verdict_kinds.get(r.verdict).colour
                line = f"\033[{code}m{row[0]}\033[0m" + line[len(row[0]) :]
            out.append(line)
            out.extend(" " * offset + more for more in why[1:])
    return out


ISSUE_FLAG = "[issue]"
ISSUE_LEGEND = f"{ISSUE_FLAG} a known upstream issue concerns this combination (listed below)"


def _issue_flag(row: Row) -> str:
    return f" {ISSUE_FLAG}" if row.issues else ""


def _matrix_lines(report: Report) -> list[str]:
    """The fleet matrix, problems only (worst first, under a heading per workload)."""
    assert report.matrix is not None
    matrix = report.matrix
    cols = [plain(c) for c in matrix.columns]
    problems = matrix.grouped(True)
    out = []
    if problems:
        labels_ = [plain(matrix.short.get(lab, lab)) for _, rows in problems for lab, _ in rows]
        label_w = min(LABEL_WIDTH, max([len("combination"), *map(len, labels_)]))
        out.append("")
        out.extend(
            text_table.lines(
                [["combination", *cols]], column_widths=[label_w, *(max(len(c), 9) for c in cols)]
            )
        )
        for group, rows in problems:
            if group:
                out.extend(_wrapped(f"[{group}]"))
            out.extend(
                text_table.lines(
                    [
                        [
                            text_table.shorten_middle(plain(matrix.short.get(lab, lab)), label_w),
                            *(
                                (verdict_kinds.get(v).word if v else "–") + ("*" if issue else "")
                                for v, issue in cells
                            ),
                        ]
                        for lab, cells in rows
                    ],
                    column_widths=[label_w, *(max(len(c), 9) for c in cols)],
                )
            )
        out.append("(* a known upstream issue concerns this combination)")
    others = len(matrix.rows) - matrix.problem_count
    if others:
        out.append(
            f"{others} more combination(s) have no problem anywhere (--format md lists them)."
        )
    return out


def text(report: Report, colour: bool = False) -> str:
    """Plain text within 100 columns: the status line, a line per architecture (fleet), the
    problems, a table per environment, what to do, known issues."""
    out = _wrapped(headline_text(report))
    if report.changed:
        out.extend(_wrapped(f"{labels.CHANGED_HEADING}: {'; '.join(report.changed)}", "    "))
    if report.fleet:
        for s in report.sections:
            counts = " · ".join(f"{n} {v}" for v, n in s.counts.items() if n)
            out.extend(_wrapped(f"  {plain(s.name)} {plain(s.gpu)}: {counts}", "    "))
            if s.job:
                out.extend(_wrapped(f"{plain(s.name)}: {s.job}", "    "))
        for t in report.top:
            out.extend(_wrapped(f"{t.heading}: {t.text}"))
        out.extend(_matrix_lines(report))
        for line_ in report.key_diffs:
            out.extend(_wrapped(f"keys differ: {line_}"))
    for section in report.sections:
        rows = section.problem_rows if report.fleet else section.rows + section.skipped
        if report.fleet and not rows:
            continue
        out.append("")
        heading = f"{section.title} · {section.heading}" if section.heading else section.title
        out.extend(_wrapped((f"== {section.name}: " if report.fleet else "") + heading))
        if not report.fleet:
            for t in section.top:
                out.extend(_wrapped(f"{t.heading}: {t.text}"))
        out.append("")
        out.extend(_text_table(rows, colour))
        if any(r.issues for r in rows):
            out.append(ISSUE_LEGEND)
        advice = [
            a for a in section.advice if not (report.fleet and a == recommendations.DISABLE_LINE)
        ]
        if advice:
            out.append("")
            out.append("what to do (only alternatives this run verified):")
            for line_ in advice:
                out.extend(_wrapped(f"  - {line_}", "    "))
    if report.fleet and report.disable_line:
        out.append("")
        out.append(recommendations.DISABLE_LINE)
    if report.issues:
        out.append("")
        out.append("known upstream issues (links: fxcache report --format json):")
        for i in report.issues:
            out.extend(_wrapped(f"  - {i.id}: {i.title}", "    "))
    return "\n".join(out).rstrip() + "\n"


# ---- JUnit -------------------------------------------------------------------------------------


def junit(report: Report) -> str:
    """JUnit XML: one testsuite per environment and runner, one testcase per combination."""
    import xml.etree.ElementTree as ET

    root = ET.Element("testsuites", name=_xml(f"fxcache {report.report_id}"))
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for section in report.sections:
        for runner in section.runners:
            rows = [r for r in section.runner_rows if r.runner == runner]
            counts = {
                "tests": len(rows),
                "failures": sum(r.verdict == "unsafe" for r in rows),
                "errors": sum(r.verdict == "error" for r in rows),
                "skipped": sum(r.verdict == "skipped" for r in rows),
            }
            for k, v in counts.items():
                totals[k] += v
            attrs = {k: str(v) for k, v in counts.items()}
            attrs["name"] = _xml(f"fxcache {section.title} @ {runner}")
            attrs["time"] = f"{sum(_seconds(r) for r in rows):.3f}"
            suite = ET.SubElement(root, "testsuite", attrs)
            for r in rows:
                case = ET.SubElement(
                    suite,
                    "testcase",
                    name=_xml(str(r.combo["id"])),
                    classname=_xml(f"fxcache.{section.arch}.{r.combo['workload']}"),
                    time=f"{_seconds(r):.3f}",
                )
                message = f"{r.why}: {r.reason}" if r.reason else r.why
                if r.verdict == "unsafe":
                    el = ET.SubElement(case, "failure", message=_xml(message), type="unsafe")
                    el.text = _xml(r.log or r.reason)
                elif r.verdict == "error":
                    el = ET.SubElement(case, "error", message=_xml(message), type="compile-error")
                    el.text = _xml(r.log or r.reason)
                elif r.verdict == "skipped":
                    ET.SubElement(case, "skipped", message=_xml(r.reason or "skipped"))
                else:
                    out = ET.SubElement(case, "system-out")
                    out.text = _xml(f"{r.verdict}: {r.reason}")
    for k, v in totals.items():
        root.set(k, str(v))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


_XML_BAD = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _xml(text: str) -> str:
    """Drop characters XML 1.0 cannot hold (ANSI escapes in logs, NULs) and invisible ones."""
    return _XML_BAD.sub("", visible(text))


def _seconds(row: Row) -> float:
    total = 0.0
    for name in ("cold", "hot"):
        value = row.phase(name).get("wall_s")
        if isinstance(value, int | float):
            total += float(value)
    return total
