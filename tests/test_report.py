"""`fxcache report` and `fxcache merge`: golden files, JUnit, Actions outputs, size limits.

Golden files live in tests/golden/; regenerate them after an intended change with
`FXCACHE_UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/test_report.py` and review the diff.
"""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ci_fxcache.errors import UsageError
from ci_fxcache.report import known_issues, labels, model, recommendations, render
from ci_fxcache.results import reader, writer
from tests.conftest import RunFxcache

DATA = Path(__file__).parent / "data"
GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("FXCACHE_UPDATE_GOLDEN") == "1"
SHARDS = [DATA / f"shard_{n}.json" for n in ("t4", "a100", "h200")]


def check_golden(name: str, actual: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.parent.mkdir(exist_ok=True)
        path.write_text(actual, encoding="utf-8")
    expected = path.read_text(encoding="utf-8")
    assert actual == expected, f"{name} differs; FXCACHE_UPDATE_GOLDEN=1 regenerates it"


def build(doc_or_path: Any) -> model.Report:
    if isinstance(doc_or_path, Path):
        loaded = reader.load(doc_or_path)
    else:
        loaded = reader.from_document(doc_or_path, "test")
    return model.build(loaded, known_issues.load_builtin())


TABLE_HEADER = re.compile(r"^\| verdict \|.*\|$", re.M)


def _top_lines(md: str) -> list[str]:
    return [line for line in md.splitlines() if re.match(r"^(✅|❌|🟡) \*\*", line)]


def test_markdown_golden_every_verdict(run_fxcache: RunFxcache) -> None:
    doc = json.loads((DATA / "results_h200.json").read_text())
    assert {c["verdict"] for c in doc["combos"]} == set(reader.VERDICTS)
    proc = run_fxcache("report", str(DATA / "results_h200.json"), "--format", "md")
    assert proc.returncode == 0, proc.stderr
    check_golden("report_h200.md", proc.stdout)
    md = proc.stdout
    # The status line first: worst verdict, counts, where, the job, commit and run linked.
    assert md.splitlines()[0] == (
        "### fxcache: ❌ 2 unsafe · 2 error · 1 no-gain · 7/12 safe · H200 sm90 · job fails · "
        "[abc1234](https://github.com/acme-ml/train-stack/commit/"
        "abc1234def5678901234567890abcdef12345678) · "
        "[run\u00a0#\u2060123](https://github.com/acme-ml/train-stack/actions/runs/12941873650)"
    )
    # At most three short top lines: 7/12 safe, all but the exceptions, each once with why.
    top = _top_lines(md)
    assert [line.split(" **")[1].split(":**")[0] for line in top] == [
        "Cache",
        "Do not cache",
        "Check",
    ]
    assert top[0] == "✅ **Cache:** 7/12 safe; all but: \\"
    assert "bf16 dynamic precompile (wrong values on hot load)" in top[1]
    assert "fp16 dynamic precompile (crashed on hot load, SIGSEGV)" in top[1]
    assert "bf16 dynamic mega (hit, but 6 kernel files rebuilt)" in top[2]
    assert "fp16 static fxgraph (compiled differs from eager: compiler, not cache)" in top[2]
    # The grid: rows = dtypes, columns = dynamic modes, mechanisms named where they differ.
    assert "| dtype | static | dynamic | mark\\_<wbr>dynamic |" in md
    assert "| bf16 | ✅ 9.1–266.7x | fxgraph ✅ 6.2x · precompile ❌ · mega 🟡 | – |" in md
    assert "| fp16 | 💥 | ❌ | 💥 |" in md
    # The table: verdict first, seven columns, problems first, no speedup on unsafe rows.
    (header,) = TABLE_HEADER.findall(md)
    assert header.count("|") - 1 == 7 and "| compile&nbsp;s (cold&nbsp;→&nbsp;hot) |" in header
    rows = [line for line in md.splitlines() if re.match(r"^\| (✅|🟡|❌|💥)&nbsp;", line)]
    verdicts = [row.split("&nbsp;")[1].split(" |")[0].replace("\u2011", "-") for row in rows]
    order = [reader.VERDICT_ORDER[v] for v in verdicts]
    assert order == sorted(order) and verdicts[0] == "unsafe"
    for row in rows:
        if "unsafe" in row.split("|")[1]:
            assert row.split(" | ")[5] == "–", row  # the speedup cell
    assert "320.0x" not in md  # the unsafe row's speedup is nowhere
    # A no-gain cell says why next to its speedup.
    assert "| 1.0x&nbsp;· 6&nbsp;rebuilt |" in md
    assert "⏭️ 1 skipped</summary>" in md and "no Redis URL" in md
    # No chart: 6.2x beside 276.7x would be a sliver, and it only repeats the speedup column.
    assert "```mermaid" not in md
    # An issue reference in a known issue's title does not break at a zero-width space.
    assert "pytorch#\u2060155332" in md and "pytorch#\u200b155332" not in md
    # Logs only for rows that are not safe.
    logs = re.findall(r"<summary>Log: (\S+) ", md)
    assert logs and "✅" not in logs
    assert "\x1b" not in md  # ANSI colour codes from logs are stripped


def test_recommendations_one_line_per_alternative_and_none_for_the_compiler() -> None:
    report = build(DATA / "results_h200.json")
    section = report.sections[0]
    problems = [r for r in section.rows if r.verdict in ("unsafe", "no-gain", "error")]
    # Each piece of advice once, naming every combination it serves.
    assert len(section.advice) == len({r.advice for r in problems}) + 1 < len(problems) + 1
    assert section.advice[2] == (
        f"fp16 mark_dynamic fxgraph, fp16 static fxgraph (error): {recommendations.NOT_THE_CACHE}"
    )
    assert section.advice[-1] == recommendations.DISABLE_LINE
    assert sum("disable the cache" in line for line in section.advice) == 1
    by_label = {r.label: r.advice for r in problems}
    assert by_label["bf16 dynamic precompile"] == (
        "use bf16 static precompile (verified safe, 266.7x); changes how the model runs "
        "(static shapes: each new input shape recompiles), not only the cache"
    )
    assert by_label["bf16 dynamic mega"] == "use bf16 dynamic fxgraph (verified safe, 6.2x)"
    for label in ("fp16 mark_dynamic fxgraph", "fp16 static fxgraph"):  # cold-error, compiler
        assert by_label[label] == recommendations.NOT_THE_CACHE
        assert "use " not in by_label[label]
    # Each problem row names a single alternative.
    assert all(line.count("verified safe") <= 1 for line in section.advice)


def test_report_switches_on_cause_not_on_reason_wording() -> None:
    doc = json.loads((DATA / "results_h200.json").read_text())
    for c in doc["combos"]:
        c["reason"] = "words that mention nothing: differ, missed, recompile, crash"
    by_id = {c["id"]: c for c in doc["combos"]}
    rows = {r.combo["id"]: r for r in build(doc).sections[0].rows}
    for cid, row in rows.items():
        assert row.cause == by_id[cid]["cause"]
    crash = rows["sin_matmul-cuda-float16-dynamic-precompile-train"]
    assert crash.why == "crashed on hot load, SIGSEGV"
    # Changing only the cause changes what the report says.
    by_id["sin_matmul-cuda-bfloat16-dynamic-precompile-train"]["cause"] = "recompile"
    row = next(
        r
        for r in build(doc).sections[0].rows
        if r.combo["id"] == "sin_matmul-cuda-bfloat16-dynamic-precompile-train"
    )
    assert row.why == "recompiled on hot load"


def test_version_1_documents_get_a_cause_from_their_evidence() -> None:
    doc = json.loads((DATA / "verify_real_cpu.json").read_text())
    assert doc["schema"] == "fxcache-results/1" and all("cause" not in c for c in doc["combos"])
    causes = {r.cause for r in build(doc).all_rows}
    assert causes <= {"rebuilt", "no-device", "unsupported", "hit", "miss", "slow"}
    assert "rebuilt" in causes
    assert model.cause_of({"verdict": "unsafe", "hot": {"status": "crash"}}) == "crash"
    assert model.cause_of({"verdict": "error", "cold": {"status": "error"}}) == "cold-error"
    assert model.cause_of({"verdict": "safe", "cause": "partial-hit"}) == "partial-hit"


def test_text_table_golden(run_fxcache: RunFxcache) -> None:
    proc = run_fxcache("report", str(DATA / "results_h200.json"), "--format", "text")
    assert proc.returncode == 0, proc.stderr
    assert "\x1b[" not in proc.stdout  # not a TTY: no colour
    check_golden("report_h200.txt", proc.stdout)
    header = next(line for line in proc.stdout.splitlines() if line.startswith("verdict"))
    rows = [line for line in proc.stdout.splitlines() if line.startswith(("unsafe", "safe "))]
    # Aligned: every numeric column ends at the same offset as its header.
    end = header.index("cold s") + len("cold s")
    assert all(row[end - 1] != " " for row in rows)


@pytest.mark.parametrize("name", ["results_h200.json", "results_cpu.json", "fleet"])
def test_text_fits_100_columns(name: str, run_fxcache: RunFxcache, tmp_path: Path) -> None:
    path = DATA / name
    if name == "fleet":
        path = tmp_path / "all.json"
        assert run_fxcache("merge", *map(str, SHARDS), "-o", str(path)).returncode == 0
    proc = run_fxcache("report", str(path), "--format", "text")
    assert proc.returncode == 0, proc.stderr
    widths = [len(line) for line in proc.stdout.splitlines()]
    assert max(widths) <= 100, max(widths)


def test_text_colour_only_on_tty_without_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty:
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    assert render.use_colour(Tty())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not render.use_colour(Tty())
    report = build(DATA / "results_h200.json")
    assert "\x1b[31munsafe\x1b[0m" in render.text(report, colour=True)


def test_junit_parses_with_junitparser(run_fxcache: RunFxcache, tmp_path: Path) -> None:
    from junitparser import Error, Failure, JUnitXml, Skipped

    out = tmp_path / "junit.xml"
    proc = run_fxcache(
        "report", str(DATA / "results_h200.json"), "--format", "junit", "-o", str(out)
    )
    assert proc.returncode == 0, proc.stderr
    xml = JUnitXml.fromfile(str(out))
    cases = {case.name: case for suite in xml for case in suite}
    doc = json.loads((DATA / "results_h200.json").read_text())
    assert set(cases) == {c["id"] for c in doc["combos"]}
    for combo in doc["combos"]:
        kinds = {type(r) for r in cases[combo["id"]].result}
        expected = {
            "unsafe": {Failure},
            "error": {Error},
            "skipped": {Skipped},
            "safe": set(),
            "no-gain": set(),
        }[combo["verdict"]]
        assert kinds == expected, combo["id"]
    suite = next(iter(xml))
    assert (suite.tests, suite.failures, suite.errors, suite.skipped) == (13, 2, 2, 1)
    assert "\x1b" not in out.read_text()


def test_other_schema_version_is_one_clear_error(run_fxcache: RunFxcache, tmp_path: Path) -> None:
    doc = json.loads((DATA / "results_cpu.json").read_text())
    doc["schema"] = "fxcache-results/9"
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    for command in ("report", "comment", "merge"):
        argv = [command, str(path)] + (
            ["-o", str(tmp_path / "m.json")] if command == "merge" else []
        )
        proc = run_fxcache(*argv)
        assert proc.returncode == 2, (command, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert (
            len(lines) == 1 and "fxcache-results/9" in lines[0] and "Traceback" not in proc.stderr
        )
        assert "expected" in lines[0]


@pytest.mark.parametrize(
    "mutate, words",
    [
        (lambda p: p.write_text('{"schema": "fxcache-results/1", "combos": ['), "not valid JSON"),
        (lambda p: p.unlink(), "no such results file"),
        (
            lambda p: p.write_text('{"schema": "fxcache-results/1", "combos": [{"id": 1}]}'),
            "'fingerprint' must be an object or null",
        ),
    ],
)
def test_bad_results_files(
    run_fxcache: RunFxcache, tmp_path: Path, mutate: Any, words: str
) -> None:
    path = tmp_path / "r.json"
    path.write_text((DATA / "results_cpu.json").read_text())
    mutate(path)
    proc = run_fxcache("report", str(path))
    assert proc.returncode == 2 and words in proc.stderr and "Traceback" not in proc.stderr


def _with_speedup(value: object) -> Any:
    def mutate(path: Path) -> None:
        doc = json.loads(path.read_text())
        doc["combos"][0]["speedup"] = value
        path.write_text(json.dumps(doc))

    return mutate


@pytest.mark.parametrize(
    "mutate, words",
    [
        (lambda p: p.write_bytes(b"\xff\xfe" + p.read_bytes()), "r.json: not UTF-8 text"),
        (lambda p: p.write_text("[" * 100_000 + "]" * 100_000), "r.json: nested too deeply"),
        (_with_speedup("fast"), "has speedup 'fast'; expected a finite number or null"),
        (_with_speedup(True), "has speedup True; expected a finite number or null"),
        (_with_speedup({"x": 1}), "has speedup {'x': 1}; expected a finite number or null"),
    ],
    ids=["non-utf8", "nested", "speedup-text", "speedup-bool", "speedup-object"],
)
def test_hostile_results_files_are_one_line_for_report_and_merge(
    run_fxcache: RunFxcache, tmp_path: Path, mutate: Any, words: str
) -> None:
    """Issue 10 §6: whatever a results file holds, report and merge say what is wrong in one
    line and exit 2."""
    path = tmp_path / "r.json"
    path.write_text((DATA / "results_cpu.json").read_text())
    mutate(path)
    for argv in (["report", str(path)], ["merge", str(path), "-o", str(tmp_path / "m.json")]):
        proc = run_fxcache(*argv)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, (argv, proc.stderr)
        assert len(lines) == 1 and words in lines[0], (argv, lines)
        assert "Traceback" not in proc.stderr
    assert not (tmp_path / "m.json").exists()


@pytest.mark.parametrize(
    "target, words",
    [
        ("missing/out", "folder {tmp}/missing does not exist; create it first"),
        ("adir", "{tmp}/adir is a directory; give a file name"),
        ("afile/out", "{tmp}/afile is not a folder"),
    ],
    ids=["missing-folder", "directory", "under-a-file"],
)
def test_outputs_that_cannot_be_written_are_one_line(
    run_fxcache: RunFxcache, tmp_path: Path, target: str, words: str
) -> None:
    """Issue 10 §6: `-o` of report and merge (and verify's --json, checked before any
    compile) into a missing folder, onto a directory or under a file: one line, exit 2."""
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("x")
    out = str(tmp_path / target)
    results = str(DATA / "results_cpu.json")
    for argv, label in (
        (["report", results, "-o", out], "-o"),
        (["merge", results, "-o", out], "-o"),
        (["report", results, "--format", "junit", "-o", out], "-o"),
    ):
        proc = run_fxcache(*argv)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, (argv, proc.stderr)
        assert lines == [f"fxcache: error: {label}: " + words.format(tmp=tmp_path)], argv
    if target != "missing/out":  # verify makes a missing --json folder
        proc = run_fxcache("verify", "--device", "cpu", "--json", out)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and lines == [
            "fxcache: error: --json: " + words.format(tmp=tmp_path)
        ], proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "afile"]
    assert list((tmp_path / "adir").iterdir()) == []


def test_nothing_safe_says_so() -> None:
    report = build(DATA / "results_nothing_safe.json")
    section = report.sections[0]
    assert section.top[0].entries == ["nothing passed verification"]
    assert [r.advice for r in section.rows] == [recommendations.NOTHING_SAFE] * 2
    assert section.advice[-1] == recommendations.DISABLE_LINE


_VERDICTS = st.sampled_from(reader.VERDICTS)


@settings(max_examples=60, deadline=None)
@given(verdicts=st.lists(_VERDICTS, min_size=13, max_size=13))
def test_recommendations_only_name_verified_safe_combos(verdicts: list[str]) -> None:
    doc = json.loads((DATA / "results_h200.json").read_text())
    for combo, verdict in zip(doc["combos"], verdicts, strict=True):
        combo["verdict"] = verdict
        if verdict == "skipped":  # the schema: a skipped combination ran no hot phase
            combo["hot"] = None
        combo["cause"] = reader.v1_cause(combo)
    section = build(doc).sections[0]
    safe_labels = {r.label for r in section.rows if r.verdict == "safe"}
    for row in section.rows:
        if row.verdict not in ("unsafe", "no-gain", "error"):
            assert not row.advice
            continue
        if row.cause in labels.COMPILER_CAUSES:
            assert row.advice == recommendations.NOT_THE_CACHE
            continue
        m = re.fullmatch(
            r"use (.+?)(?::.*)? \(verified safe, [^)]*\)(?:; changes how .*)?|(.+)", row.advice
        )
        assert m is not None
        if m[1] is not None:
            assert m[1] in safe_labels, (m[1], safe_labels)
        else:
            assert row.advice == recommendations.NOTHING_SAFE
    problems = [r for r in section.rows if r.advice]
    needs_disable = any(r.cause not in labels.COMPILER_CAUSES for r in problems)
    assert section.advice.count(recommendations.DISABLE_LINE) == int(needs_disable)


def test_merge_three_shards_keeps_environments_apart(
    run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    out = tmp_path / "all.json"
    proc = run_fxcache("merge", *map(str, SHARDS), str(DATA / "shard_h200_b.json"), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    merged = json.loads(out.read_text())
    assert merged["schema"] == reader.MERGED_SCHEMA
    assert [g["arch"] for g in merged["groups"]] == ["sm75", "sm80", "sm90"]
    assert [g["runners"] for g in merged["groups"]][2] == ["gpu-h200-01", "gpu-h200-02"]
    # Shards are carried verbatim: nothing averaged.
    shard_a100 = json.loads((DATA / "shard_a100.json").read_text())
    assert merged["groups"][1]["shards"] == [shard_a100]
    assert merged["summary"] == {"safe": 10, "no-gain": 0, "unsafe": 1, "error": 0, "skipped": 1}

    proc = run_fxcache("report", str(out), "--format", "md")
    assert proc.returncode == 0, proc.stderr
    md = proc.stdout
    check_golden("report_fleet.md", md)
    lines = md.splitlines()
    # The status line first, then one line per architecture, before any table.
    assert (
        lines[0]
        == "### fxcache: ❌ 1 unsafe · 2/3 safe everywhere · 3 architectures · 1/4 jobs fail"
    )
    assert lines[2:5] == [
        "- **sm75** Tesla T4, 2.13.0+cu128: 2 ✅ · 1 ⏭️",
        "- **sm80** A100-SXM4-80GB, 2.13.0+cu128: 1 ❌ · 2 ✅",
        "- **sm90 ×2** H200, 2.13.0+cu128: 3 ✅",
    ]
    assert md.index("- **sm90 ×2**") < md.index("|")
    # The grid: where it is not safe, which architecture.
    assert "| bf16 | – | ❌ sm80 |" in md
    # A problems-only matrix: one column per environment, identical runners collapsed; the
    # all-green rows folded.
    problems = md.split("**Problems: 1 of 3 combinations**")[1].split("<details>")[0]
    assert "| combination | sm75 | sm80 | sm90 ×2 |" in problems
    # Safe on sm90, yet marked: a known upstream issue concerns it there.
    assert "| bf16 dynamic precompile | ⏭️ | ❌⚠️ | ✅⚠️ |" in problems
    assert "fp32 static precompile" not in problems
    green = md.split("<summary>✅ 2 combinations with no problem anywhere</summary>")[1]
    assert "| fp32 static precompile | ✅ | ✅ | ✅ |" in green.split("</details>")[0]
    top = _top_lines(md)
    assert top == [
        "✅ **Cache everywhere it ran:** 2/3 safe; the exceptions are in the table below."
    ]
    # Sections show only their problems: nothing for the all-safe H200s.
    assert "#### sm90" not in md
    # A100's recommendation names only what the A100 itself verified, and says the dtype
    # change is a change to the model.
    a100 = md.split("#### sm80")[1]
    assert (
        "bf16 dynamic precompile (unsafe): use fp32 dynamic precompile (verified safe, 200.0x); "
        "changes how the model runs (runs in fp32), not only the cache" in a100
    )
    # Said once: the known issue paragraph and "disable the cache".
    assert md.count("**Known upstream issues:**") == 1
    assert md.count(recommendations.DISABLE_LINE) == 1


def test_runners_that_disagree_count_as_the_worst(tmp_path: Path) -> None:
    a = json.loads((DATA / "shard_h200.json").read_text())
    b = copy.deepcopy(a)
    b["runner"]["name"] = "gpu-h200-02"
    bad = next(c for c in b["combos"] if c["dtype"] == "bfloat16")
    bad["verdict"], bad["reason"] = "unsafe", "hot-loaded outputs differ from the cold compile"
    bad["cause"] = "hot-mismatch"
    from ci_fxcache.fleet import merge

    paths = []
    for i, d in enumerate((a, b)):
        p = tmp_path / f"s{i}.json"
        p.write_text(json.dumps(d))
        paths.append(str(p))
    report = build(merge.merge(paths))
    section = report.sections[0]
    assert section.counts["unsafe"] == 1 and section.counts["safe"] == 2
    cache, do_not = section.top[0], section.top[1]
    assert do_not.heading == "Do not cache" and do_not.entries[0].startswith("bf16 dynamic")
    assert not any(e.startswith("bf16 dynamic") for e in cache.entries)
    assert len(section.rows) == 3  # one row per combination, the worst runner's
    row = next(r for r in section.rows if r.verdict == "unsafe")
    assert "runners disagree: safe on gpu-h200-01, unsafe on gpu-h200-02" in row.disagreement


def _fleet(n: int, log_lines: int) -> model.Report:
    base = json.loads((DATA / "results_h200.json").read_text())
    groups = []
    for i in range(n):
        doc = copy.deepcopy(base)
        doc["runner"]["name"] = f"gpu-{i:02d}"
        doc["scope_key"] = doc["scope_key"][:-12] + f"{i:012x}"
        for c in doc["combos"]:
            for phase in ("cold", "hot"):
                if c.get(phase):
                    c[phase]["log_tail"] = "x" * 60 + "\n" + "line\n" * log_lines
        groups.append({"key": str(i), "shards": [doc]})
    return build({"schema": reader.MERGED_SCHEMA, "report_id": "big", "groups": groups})


@pytest.mark.parametrize(
    "n, log_lines, dropped",
    [
        (4, 3000, "left out most of each log tail."),
        (16, 400, "left out log tails."),
        (24, 10, "left out log tails, the evidence and environment tables."),
        (32, 10, "the safe rows (the grid shows them). The JSON"),
        (40, 10, "the safe rows (the grid shows them), the recommendations."),
        # a fleet's last step before the summary alone: the problems matrix, every problem
        (48, 10, "each environment's table (the problems matrix names every problem)"),
    ],
)
def test_size_limit_steps_down_and_keeps_the_answer(n: int, log_lines: int, dropped: str) -> None:
    report = _fleet(n, log_lines)
    full = render.markdown(report, max_chars=10**8)
    assert len(full) > render.DEFAULT_MAX_CHARS and "Shortened" not in full
    md = render.markdown(report, max_chars=render.DEFAULT_MAX_CHARS)
    assert len(md) <= render.DEFAULT_MAX_CHARS < render.COMMENT_LIMIT
    assert dropped in md
    # The answer survives shortening: the status line first, a line per environment, and
    # the note that says what was left out right below them, before any table.
    assert md.startswith(f"### fxcache (big): ❌ {2 * n} unsafe · {2 * n} error")
    arch_lines = [line for line in md.splitlines() if re.match(r"- .*: \d+ (✅|❌)", line)]
    assert len(arch_lines) == n, arch_lines
    note = md.index("[!NOTE]")
    assert note < (md.index("|") if "|" in md else len(md))
    assert md.count("<details>") == md.count("</details>")  # no block cut in half


def test_user_template_replaces_builtin(run_fxcache: RunFxcache, tmp_path: Path) -> None:
    tpl = tmp_path / "mine.md.j2"
    tpl.write_text(
        "{% for s in report.sections %}{{ s.top_line }}{% endfor %} [{{ report.unsafe_count }}]\n"
    )
    proc = run_fxcache(
        "report", str(DATA / "results_h200.json"), "--format", "md", "--template", str(tpl)
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(
        "Cache: 7/12 safe; all but. Do not cache: bf16 dynamic precompile"
    )
    assert proc.stdout.endswith("[2]\n")
    tpl.write_text("{{ report.nope }}")
    proc = run_fxcache(
        "report", str(DATA / "results_h200.json"), "--format", "md", "--template", str(tpl)
    )
    assert proc.returncode == 2 and "template mine.md.j2" in proc.stderr


@pytest.mark.parametrize(
    "content, words",
    [
        (bytes(range(256)), "not UTF-8 text (byte 128); is it a binary file?"),
        (None, "is a directory, not a file"),
    ],
    ids=["binary", "directory"],
)
def test_a_template_that_is_not_text_is_one_line(
    run_fxcache: RunFxcache, tmp_path: Path, content: bytes | None, words: str
) -> None:
    tpl = tmp_path / "mine.md.j2"
    if content is None:
        tpl.mkdir()
    else:
        tpl.write_bytes(content)
    proc = run_fxcache("report", str(DATA / "results_h200.json"), "--template", str(tpl))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"fxcache: error: --template {tpl}: {words}"]


def _read_outputs(path: Path) -> dict[str, str]:
    out, lines = {}, path.read_text().splitlines()
    i = 0
    while i < len(lines):
        name, delim = lines[i].split("<<", 1)
        end = lines.index(delim, i + 1)
        out[name] = "\n".join(lines[i + 1 : end])
        i = end + 1
    return out


def test_inside_actions(run_fxcache: RunFxcache, tmp_path: Path) -> None:
    src = tmp_path / "results.json"
    src.write_text((DATA / "results_h200.json").read_text())
    summary, outputs = tmp_path / "summary.md", tmp_path / "output"
    summary.write_text("earlier step\n")
    env = {
        "GITHUB_ACTIONS": "true",
        "GITHUB_STEP_SUMMARY": str(summary),
        "GITHUB_OUTPUT": str(outputs),
    }
    proc = run_fxcache(
        "report", str(src), "--format", "junit", "-o", str(tmp_path / "j.xml"), env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""  # stdout stays clean; annotations go to stderr
    values = _read_outputs(outputs)
    doc = json.loads(src.read_text())
    assert json.loads(values["safe-combos"]) == sorted(
        c["id"] for c in doc["combos"] if c["verdict"] == "safe"
    )
    assert values["unsafe-count"] == "2"
    md_path = Path(values["report-markdown"])
    assert md_path == (tmp_path / "results.md").resolve()
    md = md_path.read_text()
    assert summary.read_text() == "earlier step\n" + md
    errors = [line for line in proc.stderr.splitlines() if line.startswith("::error")]
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("::warning")]
    assert len(errors) == 2 and "bf16 dynamic precompile" in errors[0]
    assert len(warnings) == 1 and "mega" in warnings[0]
    assert proc.stderr.count("::group::") == proc.stderr.count("::endgroup::") == 13

    # With --format md -o FILE, that file is the one named in the output.
    outputs.unlink()
    proc = run_fxcache("report", str(src), "--format", "md", "-o", str(tmp_path / "r.md"), env=env)
    assert proc.returncode == 0 and proc.stdout == ""
    assert _read_outputs(outputs)["report-markdown"] == str((tmp_path / "r.md").resolve())


def test_known_issue_ranges() -> None:
    assert known_issues.version_in_range("2.13.0+cu128", ">=2.8")
    assert not known_issues.version_in_range("2.7.1", ">=2.8")
    assert known_issues.version_in_range("2.8.0a0+git1234", ">=2.8,<2.14")
    assert not known_issues.version_in_range("2.14.0", ">=2.8,<2.14")
    (disabled,) = [i for i in known_issues.load_builtin() if i.id.startswith("disabled")]
    combo = {"device": "cuda", "dtype": "bfloat16", "dynamic": "true", "mechanism": "precompile"}
    assert disabled.applies({**combo, "verdict": "unsafe"}, "2.13.0+cu128")
    assert not disabled.applies({**combo, "dtype": "float32", "verdict": "unsafe"}, "2.13.0")
    assert not disabled.applies({**combo, "verdict": "unsafe"}, "2.5.1")


def test_json_summary_and_safe_combos_of_a_fleet(run_fxcache: RunFxcache, tmp_path: Path) -> None:
    merged = tmp_path / "all.json"
    shards = [*map(str, SHARDS), str(DATA / "shard_h200_b.json")]
    assert run_fxcache("merge", *shards, "-o", str(merged)).returncode == 0
    proc = run_fxcache("report", str(merged), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["schema"] == "fxcache-report/1" and doc["fleet"] is True
    assert doc["headline"].startswith(
        "fxcache: ❌ 1 unsafe · 2/3 safe everywhere · 3 architectures"
    )
    # bf16 dynamic is unsafe on sm80: not safe for the fleet, though safe on sm90.
    assert doc["safe_combos"] == [
        "sin_matmul-cuda-float32-dynamic-precompile-train",
        "sin_matmul-cuda-float32-static-precompile-train",
    ]
    assert [e["arch"] for e in doc["environments"]] == ["sm75", "sm80", "sm90"]
    assert doc["counts"]["unsafe"] == 1
    matrix = doc["per_combination"]
    assert matrix["columns"] == ["sm75", "sm80", "sm90 ×2"]
    assert {
        "combination": "bf16 dynamic precompile",
        "verdicts": ["skipped", "unsafe", "safe"],
    } in (matrix["rows"])
    (a100,) = [e for e in doc["environments"] if e["arch"] == "sm80"]
    assert a100["recommendations"] == [
        {
            "id": "sin_matmul-cuda-bfloat16-dynamic-precompile-train",
            "runner": "gpu-a100-01",
            "cause": "hot-mismatch",
            "text": "use fp32 dynamic precompile (verified safe, 200.0x); changes how the "
            "model runs (runs in fp32), not only the cache",
        }
    ]


def test_renders_a_captured_verify_document(run_fxcache: RunFxcache, tmp_path: Path) -> None:
    """tests/data/verify_real_cpu.json is the unedited output of a real `fxcache verify --json`
    run on this CPU machine (sin_matmul, fp32/bf16 static, fxgraph/mega, cpu+cuda)."""
    from junitparser import JUnitXml, Skipped

    path = DATA / "verify_real_cpu.json"
    proc = run_fxcache("report", str(path), "--format", "md")
    assert proc.returncode == 0, proc.stderr
    md = proc.stdout
    assert "\n\n✅ **Cache:** nothing passed verification \\\n" in md
    assert (
        "🟡 **Check:** fp32 static fxgraph, bf16 static fxgraph (hit, but 1 kernel file "
        "rebuilt); fp32 static mega, bf16 static mega (hit, but 13 kernel files rebuilt)"
    ) in md
    assert "⏭️ 4 skipped" in md and "no CUDA device" in md
    assert recommendations.NOTHING_SAFE in md
    junit = tmp_path / "j.xml"
    assert run_fxcache("report", str(path), "--format", "junit", "-o", str(junit)).returncode == 0
    cases = [case for suite in JUnitXml.fromfile(str(junit)) for case in suite]
    assert len(cases) == 8
    assert sum(any(isinstance(r, Skipped) for r in case.result) for case in cases) == 4


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("*.json")))
def test_fixtures_follow_verifys_json_schema(name: str) -> None:
    """The hand-made fixtures must be documents `fxcache verify` could have written."""
    import jsonschema

    schema = json.loads(writer.SCHEMA_FILE.read_text())
    doc = json.loads((DATA / name).read_text())
    assert doc["schema"] in reader.RESULTS_SCHEMAS
    validator = jsonschema.Draft202012Validator(schema)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]
    assert errors == []


def test_environment_line_reads_a_real_restore_state(
    run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    from tests.conftest import TORCH_PYTHON

    state = tmp_path / "state.json"
    proc = run_fxcache(
        "restore",
        "--python",
        TORCH_PYTHON,
        "--root",
        str(tmp_path / "root"),
        "--json",
        "--state-file",
        str(state),
    )
    assert proc.returncode == 0, proc.stderr
    restored = json.loads(proc.stdout)
    doc = json.loads((DATA / "verify_real_cpu.json").read_text())
    doc["cache"] = restored  # what `verify --cache-state` embeds verbatim
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    proc = run_fxcache("report", str(path), "--format", "md")
    assert proc.returncode == 0, proc.stderr
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("| cache |")]
    key = render.md_text(restored["scope_key"])
    assert f"not found (miss): cold start; key {key}; nothing stale" in line


HOSTILE = {
    "workload": "</details><img src=x onerror=alert(1)>",
    "reason": "see [x](http://evil.example/a) by @org/team, #123, www.evil.example <b>bold</b>",
    "runner": "@octocat <script>alert(1)</script>",
    "report_id": "[click](https://evil.example)",
    "note": "![img](http://evil.example/i.png) `code` *em* | pipe",
    "log": "```\n</details>\n<!-- @org -->",
}


def _hostile_doc() -> dict[str, Any]:
    doc = json.loads((DATA / "results_h200.json").read_text())
    doc["report_id"] = HOSTILE["report_id"]
    doc["runner"]["name"] = HOSTILE["runner"]
    for i, c in enumerate(doc["combos"]):
        if i % 2:
            c["workload"] = HOSTILE["workload"]
        c["reason"] = HOSTILE["reason"]
        # A note's kind is one of the schema's words (the reader refuses any other).
        c["notes"] = [{"kind": "carried", "text": HOSTILE["note"]}]
        for phase in ("cold", "hot"):
            if c.get(phase):
                c[phase]["log_tail"] = HOSTILE["log"]
    return doc


@pytest.mark.parametrize("fleet", [False, True])
def test_free_text_from_results_is_escaped(fleet: bool) -> None:
    """Workload names, reasons, runner names, report id and notes cannot inject markdown:
    rendered as GitHub renders (GFM, raw HTML allowed), no mention, link or tag survives."""
    import cmarkgfm
    from cmarkgfm.cmark import Options

    doc = _hostile_doc()
    if fleet:
        other = json.loads((DATA / "shard_a100.json").read_text())
        doc = {
            "schema": reader.MERGED_SCHEMA,
            "report_id": HOSTILE["report_id"],
            "groups": [{"key": "a", "shards": [doc]}, {"key": "b", "shards": [other]}],
            "key_diffs": [{"a": HOSTILE["runner"], "b": "sm80", "differs": [HOSTILE["workload"]]}],
        }
    report = build(doc)
    md = render.markdown(report, max_chars=10**7)
    html = cmarkgfm.github_flavored_markdown_to_html(md, options=Options.CMARK_OPT_UNSAFE)
    # Only our own links: the known upstream issues, the commit and run of the `ci` fields.
    ours = {i.url.replace("&", "&amp;") for i in known_issues.load_builtin()}
    assert report.headline is not None
    ours |= {report.headline.commit_url, report.headline.run_url}
    assert set(re.findall(r'<a href="([^"]*)"', html)) <= ours
    # Only our own tags; every <details> closed where we close it.
    tags = set(re.findall(r"<([a-z][a-z0-9]*)[\s>/]", html))
    assert tags <= {"h2", "h3", "p", "strong", "table", "thead", "tbody", "tr", "th", "td"} | {
        "details",
        "summary",
        "ul",
        "li",
        "pre",
        "code",
        "a",
        "sub",
        "br",
        "em",
        "blockquote",
        "wbr",
        "h4",
    }, tags
    assert "<img" not in html and "<script" not in html and "<b>" not in html
    assert html.count("<details>") == html.count("</details>") == md.count("<details>")
    # No mention, issue reference or bare URL that GitHub would link (it links none inside
    # code blocks, where the log tails are).
    outside_code = re.sub(r"<pre>.*?</pre>|<code>.*?</code>", "", html, flags=re.S)
    text = re.sub(r"<[^>]+>", "", outside_code)
    assert not re.search(r"(?<![\w\u200b])@[A-Za-z0-9]", text)
    assert not re.search(r"#[0-9]", text)
    assert "http://evil" not in text and "https://evil" not in text and "www.evil" not in text
    # The text itself is still there for a reader.
    assert "&lt;/details&gt;&lt;img src=x" in html.replace("<wbr>", "")  # <wbr> is invisible
    assert "\u200borg/team" in text


def test_key_diffs_render_one_line_per_pair(tmp_path: Path) -> None:
    from ci_fxcache.fleet import merge

    merged = merge.merge([str(p) for p in SHARDS])
    merged["key_diffs"] = [
        {"a": "sm80", "b": "sm90", "differs": [{"component": "gpu_name"}, {"component": "arch"}]},
        {"a": "sm75", "b": "sm90", "differs": ["triton_version"]},
        {"pair": ["gpu-t4-01", "gpu-a100-01"], "keyed": [{"field": "cuda_version"}]},
        "not an object",
    ]
    report = build(merged)
    assert report.key_diffs == [
        "sm80 vs sm90: gpu_name, arch",
        "sm75 vs sm90: triton_version",
        "gpu-t4-01 vs gpu-a100-01: cuda_version",
    ]
    md = render.markdown(report)
    assert "- sm80 vs sm90: gpu\\_<wbr>name, arch\n- sm75 vs sm90: triton\\_<wbr>version\n" in md
    assert "<details><summary>Cache keys differ between environments (3)</summary>" in md
    assert "keys differ: sm80 vs sm90: gpu_name, arch" in render.text(report)


def _safe_doc(speedups: list[float], workload: str = "sin_matmul") -> dict[str, Any]:
    doc = json.loads((DATA / "results_cpu.json").read_text())
    template = next(c for c in doc["combos"] if c["verdict"] == "safe")
    doc["combos"] = []
    for i, speedup in enumerate(speedups):
        c = copy.deepcopy(template)
        c["id"] = f"{workload}-{i}"
        c["workload"] = workload
        c["dtype"] = ["float32", "bfloat16", "float16", "bfloat16-autocast"][i % 4]
        c["dynamic"] = ["false", "true", "mark"][(i // 4) % 3]
        c["mechanism"] = ["fxgraph", "mega", "precompile"][i // 12 % 3]
        c["speedup"] = speedup
        doc["combos"].append(c)
    return doc


def test_chart_only_where_it_adds_something() -> None:
    """Few bars with short labels, none a sliver: a chart, every bar labelled with its value,
    the axis near the maximum, 'top N of M' when capped. Otherwise none."""
    md = render.markdown(build(_safe_doc([2.0 + i * 0.1 for i in range(13)])))
    chart = md.split("```mermaid\n")[1].split("```")[0]
    assert '"showDataLabel": true' in chart
    assert "top 12 of 13 safe" in chart
    assert chart.count('", "') == 11  # 12 labels
    assert 'y-axis "speedup (x)" 0 --> 4' in chart  # max 3.2x: the axis ends at 4, not 5 or 10
    assert render.chart_top(276.7) == 300 and render.chart_top(9.2) == 10
    # A sliver: 6x beside 280x.
    assert "```mermaid" not in render.markdown(build(_safe_doc([6.0, 280.0, 7.0])))
    # A label Mermaid would drop (a real model name): no chart.
    long_name = "myorg.models.very_long_module_name:build_model_factory"
    two_models = _safe_doc([2.0, 3.0])
    other = copy.deepcopy(two_models["combos"][0])
    other.update(id="other", workload=long_name)
    two_models["combos"].append(other)
    assert "```mermaid" not in render.markdown(build(two_models))


def test_the_status_line_names_commit_and_run_only_from_githubs_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """verify and merge record GITHUB_SHA/... as `ci`; a value that is not GitHub's is not
    recorded, and a document carrying one anyway gets no link from it."""
    monkeypatch.setenv("GITHUB_SHA", "abc1234def5678901234567890abcdef12345678")
    monkeypatch.setenv("GITHUB_SERVER_URL", "https://ghe.example.com/")
    monkeypatch.setenv("GITHUB_REPOSITORY", "acme-ml/train-stack")
    monkeypatch.setenv("GITHUB_RUN_ID", "99")
    monkeypatch.setenv("GITHUB_RUN_NUMBER", "7) [x](javascript:alert(1)")
    doc = writer.document(
        fingerprint=None, scope_key=None, cache=None, settings={}, matrix={}, combos=[]
    )
    assert doc["ci"] == {
        "sha": "abc1234def5678901234567890abcdef12345678",
        "server_url": "https://ghe.example.com",
        "repository": "acme-ml/train-stack",
        "run_id": "99",
    }
    for name in writer.CI_VARIABLES.values():
        monkeypatch.delenv(name)
    assert writer.ci_from_env() is None
    # A document edited by hand: the reader refuses it (the schema's patterns) ...
    hostile = json.loads((DATA / "results_h200.json").read_text())
    hostile["ci"]["repository"] = "x/y)[evil](https://evil.example"
    hostile["ci"]["run_number"] = "1\n## injected"
    with pytest.raises(UsageError, match=r"ci\.repository"):
        build(hostile)
    # ... and the report's own check holds behind it: the bad fields build no link, the
    # others still do (the document is validated first, then damaged, then rendered).
    loaded = reader.from_document(json.loads((DATA / "results_h200.json").read_text()), "test")
    loaded.doc["ci"].update(hostile["ci"])
    first = render.markdown(model.build(loaded, known_issues.load_builtin())).splitlines()[0]
    assert "evil" not in first and "injected" not in first and "](" not in first
    assert first.endswith("· job fails · abc1234 · run\u00a012941873650")


def _fleet_4x60_report() -> model.Report:
    from ci_fxcache.fleet import merge
    from tests.data import make_results

    shards = [make_results.fleet_shard(a) for a in ("gfx942", "sm100", "sm90", "sm80")]
    doc = {"schema": reader.MERGED_SCHEMA, "report_id": "fxcache", "groups": []}
    for shard in shards:
        doc["groups"].append({"key": shard["scope_key"], "shards": [shard]})
    doc["key_diffs"] = merge.key_diffs(doc["groups"])
    return build(doc)


def test_a_fleet_answers_per_architecture_problems_first() -> None:
    report = _fleet_4x60_report()
    assert report.matrix is not None
    # Columns in natural order, not as text (gfx942, sm100, sm80, sm90).
    assert report.matrix.columns == ["sm80", "sm90", "sm100", "gfx942"]
    # Rows sorted by their worst verdict across the columns: every problem before any
    # all-green row, unsafe first.
    ranks = [min(reader.VERDICT_ORDER[v] for v, _ in cells if v) for _, cells in report.matrix.rows]
    assert ranks == sorted(ranks) and ranks[:4] == [0, 0, 0, 1] and report.matrix.problem_count == 5
    # The sm80 row's smallest change (bf16 static precompile) is unsafe on gfx942: the
    # advice takes one safe on every architecture instead.
    (sm80,) = [s for s in report.sections if s.name == "sm80"]
    (advice,) = [r.advice for r in sm80.rows if r.advice]
    assert advice == "use bf16 dynamic fxgraph (verified safe, 3.6x)"
    md = render.markdown(report)
    assert len(md) < 20_000 and "Shortened" not in md
    # Text: within 100 columns, long names under their heading, both ends of a label kept.
    text = render.text(report)
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "[myorg.models.very_long_module_name:build_model_factory]" in text
    from ci_fxcache.report import text_table

    short = text_table.shorten_middle("myorg.models.very_long_module_name:build_model", 30)
    assert short == "myorg.models.ve…me:build_model" and len(short) == 30


def test_advice_marks_where_an_alternative_is_not_safe() -> None:
    """When no alternative is safe on every architecture, the advice says where it is not."""
    a100 = json.loads((DATA / "shard_a100.json").read_text())
    h200 = json.loads((DATA / "shard_h200.json").read_text())
    for c in h200["combos"]:
        if c["dtype"] == "float32":
            c["verdict"], c["cause"] = "unsafe", "hot-mismatch"
    doc = {
        "schema": reader.MERGED_SCHEMA,
        "groups": [{"key": "a", "shards": [a100]}, {"key": "b", "shards": [h200]}],
    }
    report = build(doc)
    (sm80,) = [s for s in report.sections if s.name == "sm80"]
    (advice,) = [r.advice for r in sm80.rows if r.advice]
    assert advice.startswith(
        "use fp32 dynamic precompile (verified safe, 200.0x; not safe on sm90)"
    )


def test_a_why_shared_by_many_combinations_is_said_once() -> None:
    """The "Check:" line of a CPU's first run: eight mega / precompile rows rebuilt the same
    kernels; the clause is said once, after the combinations it concerns."""
    from ci_fxcache.report.model import Row, top_lines

    def row(dtype: str, dynamic: str, mechanism: str, verdict: str, built: int = 12) -> Row:
        combo = {
            "dtype": dtype, "dynamic": dynamic, "mechanism": mechanism, "verdict": verdict,
            "cause": "rebuilt" if verdict == "no-gain" else "hit",
            "hot": {"kernels_built": built},
        }  # fmt: skip
        return Row(combo, "r", f"{dtype} {dynamic} {mechanism}")

    rows = [row("fp32", d, "fxgraph", "safe", 0) for d in ("static", "dynamic")]
    rows += [row(t, d, m, "no-gain") for m in ("mega", "precompile") for t in ("fp32", "bf16")
             for d in ("static", "dynamic")]  # fmt: skip
    rows.append(row("bf16", "static", "remote", "no-gain", built=3))
    check = top_lines(rows)[-1]
    assert check.heading == "Check"
    text = check.text
    assert text.count("hit, but 12 kernel files rebuilt") == 1, text
    assert text.startswith("fp32 static mega, fp32 dynamic mega, bf16 static mega"), text
    assert text.endswith("; bf16 static remote (hit, but 3 kernel files rebuilt)"), text


def test_a_speedup_below_its_floor_never_reads_as_the_floor() -> None:
    """1.98x below a 2.0 floor printed as "2.0x · slow" reads as a contradiction."""
    from ci_fxcache.commands.verify import line
    from ci_fxcache.report import labels
    from ci_fxcache.report.model import why_text

    assert labels.fmt_speedup_why(1.98, "no-gain", "slow") == "1.98x · slow"
    assert labels.fmt_speedup_why(1.98, "safe", "hit") == "2.0x"  # no floor concerns it
    combo = {
        "workload": "sin_matmul", "device": "cpu", "dtype": "float32", "dynamic": "false",
        "mechanism": "fxgraph", "training": True, "verdict": "no-gain", "cause": "slow",
        "speedup": 1.98, "reason": "r", "cold": {"compile_s": 1.98}, "hot": {"compile_s": 1.0},
    }  # fmt: skip
    assert why_text(combo, "slow").endswith(": 1.98x")
    assert " 1.98x " in line(combo) and "2.0x" not in line(combo)
