"""The fleet report's job lines: each runner's own job figures (`fxcache stats --json`), given
to `fxcache merge --job-stats`, shown as one line per architecture, escaped, and the 4 x 60
fleet comment with them under its 20,000-character budget (issue 41, items 4 and 8)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ci_fxcache.errors import UsageError
from ci_fxcache.fleet import merge
from ci_fxcache.report import job_line, model, render
from tests.conftest import RunFxcache
from tests.data import make_results
from tests.test_comment_escaping import _signature

ARCHS = ("gfx942", "sm100", "sm80", "sm90")
# Long, real-looking Inductor settings: the job line names the first three changed ones.
LONG = [
    "inductor_config[triton.cudagraph_trees_history_recording]",
    "inductor_config[max_autotune_gemm_search_space]",
    "inductor_config[epilogue_fusion]",
    "example_inputs[0]",
]


def stats(scope_key: str, hits: int, graphs: int, changed: list[str]) -> dict[str, Any]:
    """One runner's figures as `fxcache stats --json` writes them (docs/contracts.md)."""
    new = graphs - hits - len(changed)
    return {
        "schema": "fxcache-stats/1",
        "scope_key": scope_key,
        "at": "2026-12-04T10:00:00Z",
        "job_id": "20261204T100000Z-abcd1234",
        "trace": [{"dir": "/tmp/x", "job_private": True, "files": 2, "bytes": 9, "records": 9}],
        "processes": 2,
        "graphs": graphs,
        "fxgraph": {"hit": hits, "miss": graphs - hits, "bypass": 0},
        "aotautograd": {"hit": hits, "miss": graphs - hits, "bypass": 0},
        "miss_causes": {"new graph": new, "key changed": len(changed), "entry gone": 0},
        "misses": [
            {
                "key": f"f{i:051d}",
                "graph": "g",
                "process": "p",
                "cause": "key changed",
                "changed": [{"component": c, "label": c, "was": "True", "now": "False"}],
                "changed_count": 1,
            }
            for i, c in enumerate(changed)
        ],
        "recompiles": {"count": 0, "reasons": []},
        "saved_s": 250.0,
        "history": [],
    }


def _write_shards(tmp_path: Path) -> dict[str, tuple[Path, dict[str, Any]]]:
    out = {}
    for arch in ARCHS:
        shard = make_results.fleet_shard(arch)
        path = tmp_path / f"{arch}.json"
        path.write_text(json.dumps(shard), encoding="utf-8")
        out[arch] = (path, shard)
    return out


def _write(path: Path, doc: dict[str, Any]) -> str:
    path.write_text(json.dumps(doc), encoding="utf-8")
    return str(path)


def _section_block(md: str, arch: str) -> list[str]:
    """The fleet report's bullet for `arch` and the lines nested under it."""
    lines = md.splitlines()
    (start,) = [i for i, line in enumerate(lines) if line.startswith(f"- **{arch}**")]
    block = [lines[start]]
    for line in lines[start + 1 :]:
        if not line.startswith("  "):
            break
        block.append(line)
    return block


def test_merge_shows_one_job_line_per_architecture(tmp_path: Path, run_fxcache: RunFxcache) -> None:
    shards = _write_shards(tmp_path)
    figures = [
        _write(
            tmp_path / "sm90-job.json", stats(shards["sm90"][1]["scope_key"], 35, 38, LONG[2:3])
        ),
        _write(tmp_path / "sm80-job.json", stats(shards["sm80"][1]["scope_key"], 12, 12, [])),
        # Another scope: no shard of this fleet, named in a warning and left out.
        _write(tmp_path / "stray.json", stats("fxcache-v1-" + "0" * 32, 1, 2, [])),
    ]
    out = tmp_path / "all.json"
    args = ["merge", *(str(p) for p, _ in shards.values()), "-o", str(out)]
    for f in figures:
        args += ["--job-stats", f]
    proc = run_fxcache(*args)
    assert proc.returncode == 0, proc.stderr
    assert "match no shard's environment" in proc.stdout + proc.stderr
    md = run_fxcache("report", str(out), "--format", "md")
    assert md.returncode == 0, md.stderr
    sm90 = _section_block(md.stdout, "sm90")
    assert sm90[1:] == [
        "  - your job: 35 of 38 graphs from the cache, 1 key changed: inductor\\_<wbr>config\\"
        "[epilogue\\_<wbr>fusion\\], 2 new graphs; the cache saved about 4.2 min of compile"
    ], sm90
    assert _section_block(md.stdout, "sm80")[1:] == [
        "  - your job: 12 of 12 graphs from the cache; the cache saved about 4.2 min of compile"
    ]
    # A runner that sent no figures: no line, nothing invented.
    assert _section_block(md.stdout, "sm100")[1:] == []
    assert _section_block(md.stdout, "gfx942")[1:] == []
    summary = json.loads(run_fxcache("report", str(out), "--format", "json").stdout)
    lines = {e["arch"]: e["job_line"] for e in summary["environments"]}
    assert lines["sm90"].startswith("your job: 35 of 38 graphs") and lines["sm100"] is None
    text = run_fxcache("report", str(out), "--format", "text").stdout
    assert "\nsm90: your job: 35 of 38 graphs from the cache, 1 key changed" in text
    # A merge of the merged document keeps the lines.
    again = tmp_path / "again.json"
    assert run_fxcache("merge", str(out), "-o", str(again)).returncode == 0
    md2 = run_fxcache("report", str(again), "--format", "md").stdout
    assert _section_block(md2, "sm90") == sm90


def test_several_runners_of_one_architecture_are_summed(tmp_path: Path) -> None:
    shards = _write_shards(tmp_path)
    key = shards["sm90"][1]["scope_key"]
    figures = [
        _write(tmp_path / "a.json", stats(key, 35, 38, LONG[2:3])),
        _write(tmp_path / "b.json", stats(key, 30, 38, LONG[:2])),
    ]
    doc = merge.merge([str(p) for p, _ in shards.values()], job_stats=figures)
    report = model.build(_load(doc), [])
    (sm90,) = [s for s in report.sections if s.name == "sm90"]
    assert sm90.job.startswith("your 2 jobs: 65 of 76 graphs from the cache, 3 key changed: ")
    assert "8.3 min" in sm90.job


def _load(doc: dict[str, Any]) -> Any:
    from ci_fxcache.results import reader

    return reader.from_document(doc, "test")


def test_job_figures_that_are_not_figures_are_refused(tmp_path: Path) -> None:
    shards = _write_shards(tmp_path)
    wrong = _write(tmp_path / "wrong.json", shards["sm90"][1])  # a results shard, not figures
    with pytest.raises(UsageError, match="not the job's figures"):
        merge.merge([str(p) for p, _ in shards.values()], job_stats=[wrong])


def test_hostile_job_figures_are_bounded_and_escaped(tmp_path: Path) -> None:
    """Figures come from the runner's job (a fork's, maybe), and a merged document from an
    artifact: every value is typed and bounded, every name escaped."""
    shards = _write_shards(tmp_path)
    key = shards["sm90"][1]["scope_key"]
    bad = stats(key, 3, 5, ["<img src=x> @acme/security-team GH-12 #3 [x](https://e.example)"])
    bad["graphs"] = "5; DROP"  # not a count: 0
    bad["saved_s"] = float("1e300")
    bad["misses"] += [{"changed": [{"component": "z" * 10_000}]}] * 500
    doc = merge.merge([str(p) for p, _ in shards.values()], job_stats=[_write(tmp_path / "b", bad)])
    (group,) = [g for g in doc["groups"] if g["shards"][0]["scope_key"] == key]
    (kept,) = group["job_stats"]
    assert len(kept["misses"]) == job_line.FLEET_MISSES
    assert max(len(c["component"]) for m in kept["misses"] for c in m["changed"]) == 80
    assert kept["graphs"] == 0 and kept["saved_s"] == 0.0
    # A hand-edited merged document is read through the same bounds.
    group["job_stats"] = [{**bad, "graphs": 5}, "not a dict", None]
    md = render.markdown(model.build(_load(doc), []))
    (line,) = _section_block(md, "sm90")[1:]
    assert "<img" not in line and "&lt;img" in line
    assert "@\u200bacme" in line and "GH\u200b-12" in line and "#\u200b3" in line
    elements, links = _signature(line)
    assert set(elements) <= {"<ul []>", "<li []>"} and links == 0, (elements, links)
    assert "saved" not in line  # 1e300 seconds is no figure


def test_headline_text_escapes_every_part() -> None:
    """The status line's text form (the last-resort markdown starts with it)."""
    report = model.build(_load(make_results.fleet_shard("sm90")), [])
    assert report.headline is not None
    report.headline.job = "<b>job</b> @team"
    report.headline.commit = "[abc](https://x.example)"
    line = render.headline_text(report, render.md_text)
    assert "<b>" not in line and "@\u200bteam" in line
    assert "[abc]" not in line and "\\[abc\\]" in line and "https://" not in line


def test_the_4x60_fleet_comment_with_job_lines_fits_20000_characters(tmp_path: Path) -> None:
    """Issue 41's budget: four architectures x 60 combinations with long model names, each
    with its job line naming long settings, under 20,000 characters, every unsafe combination
    still there."""
    shards = _write_shards(tmp_path)
    figures = [
        _write(tmp_path / f"{arch}-job.json", stats(shard["scope_key"], 30, 38, LONG))
        for arch, (_, shard) in shards.items()
    ]
    doc = merge.merge([str(p) for p, _ in shards.values()], job_stats=figures)
    md = render.markdown(model.build(_load(doc), []), max_chars=render.COMMENT_LIMIT - 200)
    assert len(md) < 20_000, len(md)
    assert "Shortened" not in md
    for arch in ARCHS:
        (line,) = _section_block(md, arch)[1:]
        assert line.startswith("  - your job: 30 of 38 graphs from the cache, 4 key changed: ")
        assert "(+1)" in line
    unsafe = {
        (c["workload"], c["dtype"], c["dynamic"], c["mechanism"])
        for _, shard in shards.values()
        for c in shard["combos"]
        if c["verdict"] == "unsafe"
    }
    assert unsafe
    report = model.build(_load(doc), [])
    assert report.matrix is not None
    for label, cells in report.matrix.rows:
        if any(v == "unsafe" for v, _ in cells):
            assert render.break_points(render.md_text(report.matrix.short[label])) in md, label
