"""`fxcache report`: render a results document as markdown, text, JUnit XML or JSON.

Inside GitHub Actions it also appends the markdown to the job summary, writes step outputs
(`safe-combos`, `unsafe-count`, `report-markdown`) and annotates each unsafe / no-gain combination.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

from ci_fxcache import gha, userfiles
from ci_fxcache.errors import UsageError

FORMATS = ("md", "text", "junit", "json")


def register(sub: Any, parent: argparse.ArgumentParser) -> None:
    """Add the `report` subcommand."""
    parser = sub.add_parser(
        "report",
        parents=[parent],
        help="render verification results (markdown, text table, JUnit XML, JSON)",
        description="Render a results document (fxcache-results/2 from 'fxcache verify --json', "
        "or fxcache-merged/2 from 'fxcache merge'). Inside GitHub Actions the markdown also "
        "goes to the job summary and step outputs are written.",
    )
    parser.add_argument("results", metavar="RESULTS", help="results JSON file")
    parser.add_argument(
        "--format",
        dest="output_format",
        choices=FORMATS,
        default=None,
        help="output format (default: text on a terminal, md otherwise)",
    )
    parser.add_argument(
        "--template",
        metavar="T",
        help="a jinja2 template that replaces the markdown one (default: the built-in one)",
    )
    parser.add_argument("-o", "--output", metavar="FILE", help="write here (default: stdout)")
    parser.add_argument(
        "--max-chars",
        type=int,
        default=None,
        metavar="N",
        help="markdown size limit (default 65000: fits a GitHub comment)",
    )
    parser.set_defaults(func=run)


def _summary_json(report: Any, safe: list[str]) -> str:
    from ci_fxcache.report import render

    doc = {
        "schema": "fxcache-report/1",
        "report_id": report.report_id,
        "fleet": report.fleet,
        "headline": render.headline_text(report),
        "counts": report.counts,
        "safe_combos": safe,
        "environments": [
            {
                "title": s.title,
                "arch": s.arch,
                "runners": s.runners,
                "top_line": s.top_line,
                "job_line": s.job or None,  # a fleet's runners' own jobs (merge --job-stats)
                "counts": s.counts,
                "recommendations": [
                    {"id": r.combo["id"], "runner": r.runner, "cause": r.cause, "text": r.advice}
                    for r in s.rows
                    if r.advice
                ],
                "known_issues": [{"id": i.id, "title": i.title, "url": i.url} for i in s.issues],
            }
            for s in report.sections
        ],
        "per_combination": (
            {
                "columns": report.matrix.columns,
                "rows": [
                    {"combination": label, "verdicts": [v or None for v, _ in cells]}
                    for label, cells in report.matrix.rows
                ],
            }
            if report.matrix
            else None
        ),
    }
    return json.dumps(doc, indent=2) + "\n"


def _markdown_path(results_path: str, output: str | None, fmt: str) -> Path:
    if output and fmt == "md":
        return Path(output)
    src = Path(results_path)
    return src.with_name(src.stem + ".md") if src.suffix == ".json" else Path(f"{src}.md")


def _annotate(report: Any) -> None:
    """One annotation per problem and a folded log group per combination, all on stderr."""
    for row in report.all_rows:
        where = f" on {row.runner}" if report.fleet else ""
        if row.verdict == "unsafe":
            gha.annotate(
                "error",
                f"{row.label}{where}: {row.why}. {row.reason}",
                title=f"fxcache unsafe: {row.combo['id']}",
            )
        elif row.verdict == "no-gain":
            gha.annotate(
                "warning",
                f"{row.label}{where}: {row.why}. {row.reason}",
                title=f"fxcache no gain: {row.combo['id']}",
            )
    with contextlib.redirect_stdout(sys.stderr):
        for row in report.all_rows:
            with gha.group(f"fxcache {row.emoji} {row.verdict}: {row.combo['id']} ({row.runner})"):
                gha.print_untrusted(row.reason + "\n" + (row.log + "\n" if row.log else ""))


def run(
    *,
    results: str,
    output_format: str | None,
    template: str | None,
    output: str | None,
    max_chars: int | None,
) -> int:
    """Render; inside Actions also the summary, outputs and annotations."""
    from ci_fxcache import report as report_pkg
    from ci_fxcache.report import render

    if max_chars is not None and max_chars < 1000:
        raise UsageError("--max-chars must be at least 1000")
    limit = max_chars or render.DEFAULT_MAX_CHARS
    if output:
        userfiles.output_file(output, "-o")
    _, report = report_pkg.build(results)
    fmt = output_format or ("text" if sys.stdout.isatty() and not output else "md")
    safe = report_pkg.safe_combo_ids(report)

    md: str | None = None
    if fmt == "md" or gha.in_actions():
        md = render.markdown(report, template, limit)
    if fmt == "md":
        out = md or ""
    elif fmt == "text":
        out = render.text(report, colour=not output and render.use_colour())
    elif fmt == "junit":
        out = render.junit(report)
    else:
        out = _summary_json(report, safe)

    if output:
        userfiles.write_output(output, out, "-o")
    else:
        gha.print_untrusted(out)

    if gha.in_actions() and md is not None:
        md_path = _markdown_path(results, output, fmt)
        if not (output and fmt == "md"):
            try:
                md_path.write_text(md, encoding="utf-8")
            except OSError as exc:
                raise UsageError(f"cannot write {md_path}: {exc.strerror}") from None
        gha.append_summary(md)
        gha.set_output("safe-combos", json.dumps(safe))
        gha.set_output("unsafe-count", str(report.unsafe_count))
        gha.set_output("report-markdown", str(md_path.resolve()))
        _annotate(report)
    return 0
