"""The markdown report as a reader sees it: rendered like GitHub renders a PR comment, offline.

GFM by cmarkgfm (GitHub's cmark fork, raw HTML allowed as on GitHub), GitHub's markdown CSS
and Mermaid 11 from tests/browser/node_modules (`npm ci --prefix tests/browser`), Debian's
chromium headless, the content 880 px wide (a PR comment's width). Checked in the laid-out
page: the main table and the fleet matrix do not overflow horizontally, the verdict column is
on screen, the chart's labels do not overlap. Screenshots are kept under
test-artifacts/browser/ (FXCACHE_ARTIFACTS overrides the folder).

Skips, with the reason, only where chromium or the npm packages are missing; under CI
(`CI` set) a missing one fails instead, so CI always runs it.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ci_fxcache.report import render
from tests.test_report import DATA, SHARDS, build

ROOT = Path(__file__).resolve().parents[1]
MODULES = Path(__file__).parent / "browser" / "node_modules"
CSS = MODULES / "github-markdown-css" / "github-markdown-light.css"
MERMAID = MODULES / "mermaid" / "dist" / "mermaid.min.js"
WIDTH = 880  # content width of a PR comment
ARTIFACTS = Path(os.environ.get("FXCACHE_ARTIFACTS") or ROOT / "test-artifacts") / "browser"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--allow-file-access-from-files",
    "--virtual-time-budget=5000",
)

# Runs in the page once Mermaid has drawn: what a reader would see, as JSON in #fxcache-result.
MEASURE = """
function box(e) { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; }
function overlap(a, b) {
  const w = Math.min(a[2], b[2]) - Math.max(a[0], b[0]);
  const h = Math.min(a[3], b[3]) - Math.max(a[1], b[1]);
  return w > 0.5 && h > 0.5;
}
function measure(error) {
  const article = document.querySelector('article');
  const right = article.getBoundingClientRect().right;
  const tables = [...article.querySelectorAll('table')].map(t => {
    const first = t.querySelector('th');
    const cells = [...t.querySelectorAll('tr > :first-child')];
    return {
      header: first ? first.textContent.trim() : '',
      overflow: t.scrollWidth - t.clientWidth,
      right: t.getBoundingClientRect().right,
      width: t.getBoundingClientRect().width,
      top: t.getBoundingClientRect().top,
      first_column_hidden: cells.filter(c => c.getBoundingClientRect().right > right + 0.5
        || c.getBoundingClientRect().width < 1).length,
    };
  });
  const charts = [...article.querySelectorAll('pre.mermaid svg, div.mermaid svg, svg[id^=mermaid]')]
    .map(svg => {
      const texts = [...svg.querySelectorAll('text')].filter(t => t.textContent.trim());
      const boxes = texts.map(box);
      const clashes = [];
      for (let i = 0; i < boxes.length; i++)
        for (let j = i + 1; j < boxes.length; j++)
          if (overlap(boxes[i], boxes[j]))
            clashes.push([texts[i].textContent, texts[j].textContent]);
      // the bar series' rectangles (mermaid's xychart draws each in a g.bar-plot-N)
      const bars = [...svg.querySelectorAll('g[class^="bar-plot"] rect')].map(r => {
        const b = box(r); return {top: b[1], width: b[2] - b[0], height: b[3] - b[1]}; });
      return {texts: texts.map(t => t.textContent), clashes: clashes, bars: bars,
              right: svg.getBoundingClientRect().right, width: svg.getBoundingClientRect().width};
    });
  const first = article.firstElementChild;
  const lists = [...article.querySelectorAll(':scope > ul')].map(u => ({
    items: [...u.querySelectorAll(':scope > li')].map(li => li.textContent.trim()),
    bottom: u.getBoundingClientRect().bottom,
  }));
  const result = {error: error ? String(error) : null, right: right, tables: tables,
                  first: first ? {tag: first.tagName.toLowerCase(), text: first.textContent.trim(),
                                  height: first.getBoundingClientRect().height} : null,
                  lists: lists,
                  charts: charts, mermaid_blocks: article.querySelectorAll('pre.mermaid').length,
                  height: Math.ceil(document.documentElement.scrollHeight)};
  const pre = document.createElement('pre');
  pre.id = 'fxcache-result';
  pre.textContent = JSON.stringify(result);
  document.body.appendChild(pre);
  document.body.setAttribute('data-done', '1');
}
mermaid.initialize({startOnLoad: false, securityLevel: 'strict', theme: 'default'});
mermaid.run({querySelector: 'pre.mermaid'}).then(() => measure(null), e => measure(e));
"""


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    _missing("chromium is not installed (the README's test command installs Debian's chromium)")
    return ""


def _missing(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI must run the browser test")
    pytest.skip(reason)


def _page(md: str) -> str:
    import cmarkgfm
    from cmarkgfm.cmark import Options

    body = cmarkgfm.github_flavored_markdown_to_html(
        md, options=Options.CMARK_OPT_UNSAFE | Options.CMARK_OPT_GITHUB_PRE_LANG
    )

    # GitHub turns ```mermaid blocks into diagrams; Mermaid reads the block's text.
    def diagram(m: re.Match[str]) -> str:
        return f'<pre class="mermaid">{html.escape(html.unescape(m.group(1)))}</pre>'

    body = re.sub(r'<pre lang="mermaid"><code>(.*?)</code></pre>', diagram, body, flags=re.S)
    return f"""<!doctype html>
<html><head><meta charset="utf-8">
<link rel="stylesheet" href="{CSS.as_uri()}">
<style>
body {{ margin: 0; background: #fff; }}
.markdown-body {{ box-sizing: content-box; width: {WIDTH}px; margin: 0; padding: 16px; }}
#fxcache-result {{ display: none; }}
</style></head>
<body><article class="markdown-body">{body}</article>
<script src="{MERMAID.as_uri()}"></script>
<script>{MEASURE}</script>
</body></html>
"""


def _chrome(browser: str, page: Path, *extra: str, height: int = 1200) -> str:
    proc = subprocess.run(
        [browser, *FLAGS, f"--window-size={WIDTH + 120},{height}", *extra, page.as_uri()],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def see(md: str, name: str, tmp_path: Path) -> dict:
    """Lay `md` out in chromium; return the measurements and keep a full-page screenshot."""
    browser = _chromium()
    if not (CSS.is_file() and MERMAID.is_file()):
        _missing("tests/browser/node_modules is missing: run 'npm ci --prefix tests/browser'")
    page = tmp_path / f"{name}.html"
    page.write_text(_page(md), encoding="utf-8")
    dom = _chrome(browser, page, "--dump-dom")
    found = re.search(r'<pre id="fxcache-result">(.*?)</pre>', dom, flags=re.S)
    assert found, "the page never finished measuring (Mermaid did not load?)"
    result = json.loads(html.unescape(found.group(1)))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / f"{name}.png"
    _chrome(browser, page, f"--screenshot={shot}", height=min(result["height"], 16_000))
    assert shot.is_file() and shot.stat().st_size > 10_000
    result["screenshot"] = str(shot)
    return result


def _report_md(path: Path) -> str:
    return render.markdown(build(path))


def _fleet_md() -> str:
    from ci_fxcache.fleet import merge

    return render.markdown(
        build(merge.merge([str(p) for p in [*SHARDS, DATA / "shard_h200_b.json"]]))
    )


def _check_tables(seen: dict, main_header: str) -> None:
    assert seen["error"] is None, seen["error"]
    main = [t for t in seen["tables"] if t["header"] == main_header]
    assert main, [t["header"] for t in seen["tables"]]
    for table in main:
        assert table["overflow"] <= 1, f"{main_header} table overflows by {table['overflow']} px"
        assert table["right"] <= seen["right"] + 0.5
        assert table["first_column_hidden"] == 0  # the verdict (or combination) column shows


def _check_charts(seen: dict, labels: list[str]) -> None:
    assert seen["mermaid_blocks"] == len(seen["charts"]) == 1, seen
    (chart,) = seen["charts"]
    assert chart["clashes"] == [], chart["clashes"]
    assert chart["right"] <= seen["right"] + 0.5
    for label in labels:
        assert label in chart["texts"], (label, chart["texts"])


@pytest.mark.parametrize("name", ["results_h200", "results_cpu", "verify_real_cpu"])
def test_single_runner_report_reads_at_comment_width(name: str, tmp_path: Path) -> None:
    report = build(DATA / f"{name}.json")
    seen = see(render.markdown(report), name, tmp_path)
    _check_tables(seen, "verdict")
    assert seen["first"]["tag"] == "h3" and seen["first"]["text"].startswith("fxcache: ")
    chart = report.sections[0].chart
    if chart:
        # Every bar labelled: its combination and its value.
        _check_charts(seen, [r.label for r in chart] + [str(r.combo["speedup"]) for r in chart])
    else:
        assert seen["mermaid_blocks"] == 0


def test_fleet_report_reads_at_comment_width(tmp_path: Path) -> None:
    seen = see(_fleet_md(), "fleet", tmp_path)
    _check_tables(seen, "combination")
    _check_tables(seen, "verdict")
    assert seen["mermaid_blocks"] == 0  # the matrix is the fleet's summary


def test_the_check_catches_an_overflowing_table_and_clashing_labels(tmp_path: Path) -> None:
    """The measurements can fail: a 14-column table overflows, a crowded chart overprints."""
    wide = "| verdict |" + " long column heading |" * 14 + "\n|---|" + "---|" * 14 + "\n"
    wide += "| ✅ safe |" + " 123456789.123 |" * 14 + "\n"
    crowded = ", ".join(f'"bf16-autocast dynamic precompile {i}"' for i in range(9))
    chart = (
        f"```mermaid\nxychart-beta\n    x-axis [{crowded}]\n    bar [{', '.join('1' * 9)}]\n```\n"
    )
    seen = see(wide + "\n" + chart, "negative-control", tmp_path)
    (table,) = seen["tables"]
    assert table["overflow"] > 100
    (drawn,) = seen["charts"]
    assert drawn["clashes"], drawn["texts"]


def _fleet_4x60() -> tuple[str, list[dict]]:
    """Four architectures (sm80, sm90, sm100, gfx942) x 60 combinations of five real-looking
    model factories, merged as `fxcache merge` merges them (tests/data/make_results.py)."""
    import tempfile

    from ci_fxcache.fleet import merge
    from tests.data import make_results

    shards = [make_results.fleet_shard(arch) for arch in ("gfx942", "sm100", "sm80", "sm90")]
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for shard in shards:
            path = Path(tmp) / f"{shard['runner']['name']}.json"
            path.write_text(json.dumps(shard), encoding="utf-8")
            paths.append(str(path))
        merged = merge.merge(paths)
    return render.markdown(build(merged)), shards


def test_a_real_fleet_reads_at_comment_width(tmp_path: Path) -> None:
    """The issue-27 fleet: 4 architectures x 60 combinations with long model names."""
    from ci_fxcache.report import labels
    from ci_fxcache.report.model import cause_of, why_text

    md, shards = _fleet_4x60()
    # Said once: under 20,000 characters with every problem and its cause there, under its
    # architecture's heading and its model's.
    assert len(md) < 20_000, len(md)
    assert "Shortened" not in md
    for shard in shards:
        arch = shard["fingerprint"]["gpu_archs"][0]
        section = md.split(f"\n#### {arch}: ")
        problems = [c for c in shard["combos"] if c["verdict"] in ("unsafe", "error", "no-gain")]
        assert problems or len(section) == 1
        for c in problems:
            body = section[1].split("\n#### ")[0]
            why = render.md_text(why_text(c, cause_of(c)))
            row = (
                f"| {render.md_text(labels.short_dtype(c['dtype']))} | "
                f"{render.break_points(render.md_text(labels.dynamic_word(c['dynamic'])))} | "
                f"{c['mechanism']} |"
            )
            assert row in body, (arch, c["id"])
            assert render.break_points(why) in body, (arch, c["id"], why)
            assert render.break_points(render.md_text(c["workload"])) in body
    seen = see(md, "fleet-4x60", tmp_path)
    assert seen["error"] is None, seen["error"]
    # The status line first.
    assert seen["first"]["tag"] == "h3"
    assert seen["first"]["text"].startswith("fxcache: ❌ 4 unsafe · 1 error · 1 no-gain · 55/60")
    # One line per architecture, in natural order, before any table.
    arch_list = seen["lists"][0]["items"]
    assert [item.split()[0] for item in arch_list] == ["sm80", "sm90", "sm100", "gfx942"]
    assert seen["lists"][0]["bottom"] <= min(t["top"] for t in seen["tables"])
    # The grid is there; no table is wider than the comment, nor hides its first column.
    assert any(t["header"] == "dtype" for t in seen["tables"])
    for table in seen["tables"]:
        assert table["width"] <= WIDTH + 0.5, table
        assert table["overflow"] <= 1, table
        assert table["first_column_hidden"] == 0, table
    # A fleet draws no chart (the matrix and the grid are its summary).
    assert seen["mermaid_blocks"] == 0


def test_one_runner_with_real_model_names_reads_at_comment_width(tmp_path: Path) -> None:
    """One sm100 runner, 60 combinations of five long model names: rows under a heading per
    model, nothing wider than the comment, no chart (its labels would be dropped)."""
    from tests.data import make_results

    report = build(make_results.fleet_shard("sm100"))
    md = render.markdown(report)
    assert "| workload |" not in md and "**myorg.<wbr>models.<wbr>very\\_<wbr>long" in md
    seen = see(md, "sm100-long-names", tmp_path)
    assert seen["error"] is None, seen["error"]
    assert seen["first"]["text"].startswith("fxcache: ❌ 2 unsafe · 1 error · 1 no-gain · 56/60")
    assert any(t["header"] == "dtype" for t in seen["tables"])
    for table in seen["tables"]:
        assert table["width"] <= WIDTH + 0.5, table
        assert table["overflow"] <= 1 and table["first_column_hidden"] == 0, table
    assert seen["mermaid_blocks"] == 0


def test_the_job_history_chart_draws_one_bar_per_run(tmp_path: Path) -> None:
    """Issue 47: six runs, three pairs of them in the same minute, two at 0 %: mermaid's x axis
    is categorical, so labels that repeat drew three bars and hid the 0 % runs. Each run gets
    its own bar and its own label."""
    from ci_fxcache.report import job_line

    rows = [
        {"id": f"20261206T0107{i:02d}Z-0000ab{i:02d}", "run": str(50 + i),
         "at": f"2026-12-06T01:0{7 + i // 2}:{i:02d}Z", "graphs": 4,
         "hits": [4, 0, 2, 0, 4, 3][i], "misses": {}, "bypasses": 0,
         "compile_s": 1.0, "saved_s": 2.0}
        for i in range(6)
    ]  # fmt: skip
    rows[5]["run"] = None  # a run outside Actions: told apart by its job id
    labels = job_line.run_labels(rows)
    assert labels == ["50", "51", "52", "53", "54", "ab05"]
    seen = see(job_line.history(rows), "job-history", tmp_path)
    assert seen["error"] is None, seen["error"]
    _check_charts(seen, labels)
    (chart,) = seen["charts"]
    bars = chart["bars"]
    assert len(bars) == 6, bars
    assert job_line.history(rows).count("| 2026-12-06T01:0") == 6  # the table: one row each
    tops = [b["top"] for b in bars]  # the chart is horizontal: one bar per line, in order
    assert tops == sorted(tops) and len({round(y) for y in tops}) == 6
    assert all(b["height"] > 5 for b in bars)
    widths = [b["width"] for b in bars]
    zero, full = widths[1], widths[0]  # mermaid draws a 0 % bar a few pixels long
    assert widths[3] == zero and abs(widths[4] - full) < 0.5 and full > zero + 100
    for index, rate in ((2, 0.5), (5, 0.75)):  # each bar its own run's rate
        assert abs((widths[index] - zero) / (full - zero) - rate) < 0.02, widths


def test_a_full_history_of_long_run_numbers_keeps_its_labels_apart(tmp_path: Path) -> None:
    """Twenty runs of a busy repository (run 10400, second attempts): a vertical chart's
    labels overprinted each other from five digits on; the horizontal one stacks them."""
    from ci_fxcache.jobstats import history
    from ci_fxcache.report import job_line

    rows = [
        {"id": f"j{i}", "run": f"{10400 + i}.2", "at": "2026-12-06T01:07:00Z", "graphs": 3,
         "hits": i % 4, "misses": {}, "bypasses": 0, "compile_s": 1.0, "saved_s": 1.0}
        for i in range(history.ROWS)
    ]  # fmt: skip
    seen = see(job_line.history(rows), "job-history-full", tmp_path)
    _check_charts(seen, job_line.run_labels(rows))
    assert len(seen["charts"][0]["bars"]) == history.ROWS
