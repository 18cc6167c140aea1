"""Renderers: markdown (jinja2 templates in the package), aligned text, JUnit XML."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ci_fxcache.errors import UsageError
from ci_fxcache.report.model import Report, Row

# GitHub rejects issue comments longer than 65,536 characters; leave room for the marker.
COMMENT_LIMIT = 65_536
DEFAULT_MAX_CHARS = 65_000


@dataclass(frozen=True)
class Detail:
    """How much the markdown shows; the size limiter steps down through these."""

    environment: bool = True
    chart: bool = True
    logs: bool = True
    log_chars: int = 3000
    max_rows: int = 100_000
    max_chart: int = 40
    problems_only: bool = False
    recommendations: bool = True
    note: str = ""


def _cell(value: Any) -> str:
    text = "" if value is None else str(value)
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def _mermaid(value: Any) -> str:
    return re.sub(r'["\[\]\n\r]', "'", str(value))


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def _tail(text: str, limit: int) -> str:
    text = _ANSI.sub("", text)
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
        if not path.is_file():
            raise UsageError(f"--template {template}: no such file")
        loader: jinja2.BaseLoader = jinja2.FileSystemLoader(str(path.parent))
        name = path.name
    else:
        loader = jinja2.PackageLoader("ci_fxcache.report", "templates")
        name = "report.md.j2"
    env = jinja2.Environment(
        loader=loader,
        autoescape=False,  # markdown, not HTML: cells are escaped by the `cell` filter
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=False,
    )
    env.filters.update(cell=_cell, mermaid=_mermaid, tail=_tail, fence=_fence)
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
    lean = Detail(logs=False, chart=False, environment=False)
    out.append(replace(lean, problems_only=True))
    out.append(replace(lean, problems_only=True, recommendations=False))
    cap = 200
    while cap < rows:
        cap *= 2
    while cap >= 10:
        out.append(replace(lean, problems_only=True, recommendations=False, max_rows=cap))
        cap //= 2
    return out


def _dropped(level: Detail) -> str:
    parts = []
    if not level.logs:
        parts.append("log tails")
    elif level.log_chars < Detail().log_chars:
        parts.append("most of each log tail")
    if not level.chart:
        parts.append("the chart")
    if not level.environment:
        parts.append("the environment tables")
    if level.problems_only:
        parts.append("the safe rows (the top line names them)")
    if not level.recommendations:
        parts.append("the recommendations")
    if level.max_rows < Detail().max_rows:
        parts.append(f"rows past the first {level.max_rows} per environment")
    return ", ".join(parts)


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

    def render(level: Detail) -> str:
        try:
            return str(tpl.render(report=report, opts=asdict(level)))
        except jinja2.TemplateError as exc:
            raise UsageError(f"template {name}: {exc}") from None

    text = ""
    for level in _levels(report):
        if level != Detail():
            note = (
                f"Shortened to fit {max_chars:,} characters (GitHub comments allow "
                f"{COMMENT_LIMIT:,}): left out {_dropped(level)}. The JSON results have "
                "everything."
            )
            level = replace(level, note=note)
        text = _squeeze(render(level))
        if len(text) <= max_chars:
            return text
    # Last resort: the answer alone (one top line per environment), then a hard cut.
    lines = [f"## fxcache: {'fleet report' if report.fleet else 'cache verification'}", ""]
    lines += [f"- {s.top_line}" for s in report.sections]
    note = (
        f"\n> [!NOTE]\n> Only the summary fits in {max_chars:,} characters; the table, "
        "recommendations and logs are in the job summary and the JSON results.\n"
    )
    text = "\n".join(lines) + "\n" + note
    if len(text) <= max_chars:
        return text
    return text[: max(0, max_chars - len(note))] + note


def _squeeze(text: str) -> str:
    """Collapse the blank lines that template control blocks leave behind."""
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


# ---- text --------------------------------------------------------------------------------------

_COLOURS = {"safe": "32", "no-gain": "33", "unsafe": "31", "error": "35", "skipped": "2"}


def use_colour(stream: Any = None) -> bool:
    """Colour only on a TTY and only when NO_COLOR is unset."""
    stream = stream or sys.stdout
    return bool(getattr(stream, "isatty", lambda: False)()) and "NO_COLOR" not in os.environ


def text(report: Report, colour: bool = False) -> str:
    """An aligned plain-text table per environment, problems first."""
    headers = (
        "verdict",
        "workload",
        "device",
        "dtype",
        "dynamic",
        "mechanism",
        "training",
        "runner",
        "cold s",
        "hot s",
        "speedup",
        "hits/misses",
        "err hot",
        "err eager",
    )
    right = {"cold s", "hot s", "speedup", "hits/misses", "err hot", "err eager"}
    out: list[str] = []
    for section in report.sections:
        out.append(section.top_line)
        out.append("")
        rows: list[Row] = section.rows + section.skipped
        table = [
            (
                r.verdict,
                str(r.combo["workload"]),
                str(r.combo["device"]),
                str(r.combo["dtype"]),
                r.dynamic,
                str(r.combo["mechanism"]),
                r.training,
                r.runner,
                r.cold_s,
                r.hot_s,
                r.speedup,
                r.hits_misses,
                r.err_hot,
                r.err_eager,
            )
            for r in rows
        ]
        widths = [max([len(h)] + [len(t[i]) for t in table]) for i, h in enumerate(headers)]

        def line(cells: tuple[str, ...], widths: list[int] = widths) -> str:
            return "  ".join(
                c.rjust(w) if h in right else c.ljust(w)
                for c, w, h in zip(cells, widths, headers, strict=True)
            ).rstrip()

        out.append(line(headers))
        out.append(line(tuple("-" * w for w in widths)))
        for r, cells in zip(rows, table, strict=True):
            rendered = line(cells)
            if colour:
                code = _COLOURS.get(r.verdict, "0")
                v = cells[0]
                rendered = f"\033[{code}m{v}\033[0m" + rendered[len(v) :]
            out.append(rendered)
        notes = [f"  {r.combo['id']}: {r.reason}" for r in section.skipped if r.reason]
        if notes:
            out.append("")
            out.append("skipped:")
            out.extend(notes)
        if section.recommendation_lines:
            out.append("")
            out.append("recommendations (only from what this run verified):")
            out.extend(f"  - {line}." for line in section.recommendation_lines)
        if section.issues:
            out.append("")
            out.append("known upstream issues:")
            out.extend(f"  - {i.title}: {i.url}" for i in section.issues)
        out.append("")
    if report.fleet_lines:
        out.append("per combination across environments:")
        out.extend(f"  {line_}" for line_ in report.fleet_lines)
        out.append("")
    return "\n".join(out).rstrip() + "\n"


# ---- JUnit -------------------------------------------------------------------------------------


def junit(report: Report) -> str:
    """JUnit XML: one testsuite per environment and runner, one testcase per combination."""
    import xml.etree.ElementTree as ET

    root = ET.Element("testsuites", name=f"fxcache {report.report_id}")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for section in report.sections:
        for runner in section.runners:
            rows = [r for r in section.rows + section.skipped if r.runner == runner]
            counts = {
                "tests": len(rows),
                "failures": sum(r.verdict == "unsafe" for r in rows),
                "errors": sum(r.verdict == "error" for r in rows),
                "skipped": sum(r.verdict == "skipped" for r in rows),
            }
            for k, v in counts.items():
                totals[k] += v
            attrs = {k: str(v) for k, v in counts.items()}
            attrs["name"] = f"fxcache {section.title} @ {runner}"
            attrs["time"] = f"{sum(_seconds(r) for r in rows):.3f}"
            suite = ET.SubElement(root, "testsuite", attrs)
            for r in rows:
                case = ET.SubElement(
                    suite,
                    "testcase",
                    name=str(r.combo["id"]),
                    classname=f"fxcache.{section.arch}.{r.combo['workload']}",
                    time=f"{_seconds(r):.3f}",
                )
                message = f"{r.problem}: {r.reason}" if r.reason else r.problem
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
    """Drop characters XML 1.0 cannot hold (ANSI escapes in logs, NULs)."""
    return _XML_BAD.sub("", text)


def _seconds(row: Row) -> float:
    total = 0.0
    for name in ("cold", "hot"):
        value = row.phase(name).get("wall_s")
        if isinstance(value, int | float):
            total += float(value)
    return total
