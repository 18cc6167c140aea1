"""Untrusted input to the job's figures (issue 47 §6).

- The local store root's history file is not signed: a keyed job signs and publishes the
  history inside its entry record, so rows planted there (dated 9999) became the history on
  every runner and pushed the real rows out for good.
- Figures given to `fxcache comment --job-stats` (and the figures file the save keeps, which
  the action's post step hands to the same code) are a file anyone may write: counts that are
  text reached the comment as they were.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from tests.test_comment_escaping import _signature
from tests.test_job_stats import MARKUP, Job

KEY = {"FXCACHE_SIGNING_KEY": "a-test-signing-key"}


def _planted(at: str = "9999-12-31T23:59:59Z") -> list[dict[str, Any]]:
    return [
        {"id": f"planted-{i}", "at": at, "graphs": 9, "hits": 9, "misses": {},
         "bypasses": 0, "compile_s": 0.0, "saved_s": 999.0}
        for i in range(25)
    ]  # fmt: skip


def _record(root: Path, job_id: str) -> dict[str, Any]:
    """The record file job `job_id` committed (named by the job's id: two jobs of the same
    second do not sort by time)."""
    (path,) = root.glob(f"*/inductor/fxcache-jobs/{job_id}.json")
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def test_planted_local_rows_never_reach_the_signed_history(tmp_path: Path) -> None:
    from ci_fxcache.jobstats import history

    first = Job(tmp_path / "a", "first", KEY)
    first.env["FXCACHE_ROOT"] = str(tmp_path / "root")
    first.restore()
    first.traced("f1")
    first.save()
    key = first.stats()["scope_key"]
    real = first.stats()["job_id"]
    local = history.local_file(tmp_path / "root", key)
    local.write_text(json.dumps(_planted()))  # unsigned, as anyone with the root can write

    second = Job(tmp_path / "b", "second", KEY)
    second.env["FXCACHE_ROOT"] = str(tmp_path / "root")
    second.restore()
    second.traced("f2")  # a new graph: the save commits a record file, signed
    second.save()
    assert len(list((tmp_path / "root").glob("*/inductor/fxcache-jobs/*.json"))) == 2
    signed = _record(tmp_path / "root", second.stats()["job_id"])
    ids = [row["id"] for row in signed["history"]]
    assert ids == [real, second.stats()["job_id"]], ids
    shown = [row["id"] for row in second.stats()["history"]]
    assert not any(i.startswith("planted") for i in shown), shown
    # the local file the keyed job wrote back is signed, and holds the real rows only
    kept = json.loads(local.read_text())
    assert kept["signature"]["alg"] == "hmac-sha256"
    assert [row["id"] for row in kept["rows"]] == ids


def test_rows_from_the_future_or_without_a_time_are_dropped() -> None:
    from ci_fxcache.jobstats import history

    assert history.checked(_planted()[0]) is None
    assert history.checked({**_planted()[0], "at": "<b>yesterday</b>"}) is None
    row = history.checked({**_planted()[0], "at": "2026-12-01T10:00:00Z"})
    assert row is not None and row["at"] == "2026-12-01T10:00:00Z"


def test_a_forged_signature_on_the_local_history_is_refused(tmp_path: Path) -> None:
    from ci_fxcache.jobstats import history

    rows = [history.checked({**_planted()[0], "at": "2026-12-01T10:00:00Z"})]
    history.save_local(tmp_path, "scope", rows, "right-key")
    assert history.rows(tmp_path, "scope", None, None, "right-key") == rows
    assert history.rows(tmp_path, "scope", None, None, "other-key") == []
    # another scope's signed rows are not this scope's
    path = history.local_file(tmp_path, "scope")
    path.rename(history.local_file(tmp_path, "elsewhere"))
    assert history.rows(tmp_path, "elsewhere", None, None, "right-key") == []
    history.local_file(tmp_path, "plain").write_text(json.dumps(rows))  # unsigned
    assert history.rows(tmp_path, "plain", None, None, "right-key") == []
    assert history.rows(tmp_path, "plain", None, None, None) == rows  # an unkeyed store


def _figures() -> dict[str, Any]:
    return {
        "schema": "fxcache-stats/1",
        "trace": [{"files": 2, "skipped_lines": 0, "stopped": []}],
        "graphs": 38, "frames": 4, "processes": 1, "cpp_builds": 3,
        "compile_s": 12.0, "saved_s": 150.0,
        "fxgraph": {"hit": 35, "miss": 3, "bypass": 1},
        "aotautograd": {"hit": 17, "miss": 2, "bypass": 0},
        "miss_causes": {"new graph": 2, "key changed": 1, "entry gone": 0},
        "misses": [
            {"key": "fabc", "cause": "key changed", "changed_count": 2, "changed": [
                {"component": "inductor_config[epilogue_fusion]", "was": "True", "now": "False"}
            ]},
        ],
        "bypass_reasons": [{"count": 1, "reason": "unsupported"}],
        "recompiles": {"count": 1, "reasons": [{"count": 1, "reason": "size"}]},
        "graph_breaks": {"count": 0, "reasons": []},
        "failures": {"count": 0, "reasons": []},
        "history": [
            {"id": "j1", "at": "2026-12-01T10:00:00Z", "graphs": 3, "hits": 1,
             "misses": {"new graph": 2}, "bypasses": 0, "compile_s": 1.0, "saved_s": 0.5}
        ],
    }  # fmt: skip


def _numbers(doc: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The paths of every number in the figures."""
    if isinstance(doc, dict):
        return [p for k, v in doc.items() for p in _numbers(v, (*path, k))]
    if isinstance(doc, list):
        return [p for i, v in enumerate(doc) for p in _numbers(v, (*path, i))]
    return [path] if isinstance(doc, int | float) and not isinstance(doc, bool) else []


def _with(doc: dict[str, Any], value: str) -> dict[str, Any]:
    """`doc` with every number replaced by `value`."""
    changed = copy.deepcopy(doc)
    for path in _numbers(doc):
        target = changed
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value
    return changed


def _comment(fake_github: Any, run_fxcache: Any, tmp_path: Path, figures: dict[str, Any]) -> str:
    from tests.test_comment import PR, RESULTS, _env

    path = tmp_path / "figures.json"
    path.write_text(json.dumps(figures), encoding="utf-8")
    done = run_fxcache(
        "comment", RESULTS, "--job-stats", str(path), env=_env(fake_github, tmp_path)
    )
    assert done.returncode == 0, done.stderr
    (body,) = [str(c["body"]) for c in fake_github.comments[PR]]
    return body


def test_job_figures_reach_the_comment_validated_and_escaped(
    fake_github: Any, run_fxcache: Any, tmp_path: Path
) -> None:
    from tests.test_comment import PR

    fake_github.add_pull(PR)
    good = _comment(fake_github, run_fxcache, tmp_path, _with(_figures(), "7"))
    bad = _comment(fake_github, run_fxcache, tmp_path, _with(_figures(), MARKUP))
    assert "<img" not in bad and "[a](http" not in bad
    good_elements, good_links = _signature(good)
    bad_elements, bad_links = _signature(bad)
    assert not bad_elements - good_elements, bad_elements - good_elements
    assert bad_links <= good_links
    assert "your job:" in bad  # the line is still there, from what could be read


@pytest.mark.parametrize("path", _numbers(_figures()), ids=lambda p: ".".join(map(str, p)))
def test_each_count_that_is_text_renders_no_markup(path: tuple[Any, ...], tmp_path: Path) -> None:
    """One count at a time is hostile: the line and the detail still render (the other
    figures are read), and the hostile one adds no element, link or mention."""
    from ci_fxcache.report import pr_comment

    def render(value: Any) -> str:
        doc = _figures()
        target = doc
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value
        figures = tmp_path / "figures.json"
        figures.write_text(json.dumps(doc), encoding="utf-8")
        return pr_comment._with_job("### fxcache: status\n\nthe report\n", str(figures), 10**6)

    good, bad = render(7), render(MARKUP)
    assert "your job:" in bad
    good_elements, good_links = _signature(good)
    bad_elements, bad_links = _signature(bad)
    assert not bad_elements - good_elements, bad_elements - good_elements
    assert bad_links <= good_links


_EVENT_HEADER = (
    "V1206 01:09:07.059000 1002 torch/_inductor/compile_fx.py:1449] "
    '{"chromium_event": {}, "rank": 0, "frame_id": 0, "frame_compile_id": 0}\n'
)


@pytest.mark.parametrize("written", ["where torch writes it", "after the phase"])
def test_event_times_torch_never_writes_give_no_event_and_finite_figures(
    tmp_path: Path, written: str
) -> None:
    """A trace is a file any step may write. Times no clock gives (1e999, a 400-digit
    integer, NaN, negative, true) used to become `Infinity` in `fxcache stats --json` (not
    JSON to jq or a browser) and "inf min" in the text, or crash it (OverflowError): each
    such event is dropped, the rest counted, the figures finite."""
    from ci_fxcache.jobstats import count, trace

    def event(name: str, ts: str, ph: str) -> str:
        if written == "where torch writes it":  # read where it lies (the fast way)
            body = f'{{\n"name": "{name}",\n"ts": {ts},\n"args": {{}},\n"ph": "{ph}"\n}}'
        else:  # the time after the phase: read the general way, or decoded
            body = f'{{"name": "{name}", "ph": "{ph}", "ts": {ts}}}'
        return _EVENT_HEADER + "".join(f"\t{line}\n" for line in body.split("\n"))

    bad = ["1e999", "1" + "0" * 400, "NaN", "-5", "true", "1e17"]
    lines = [event("dynamo", "1000000", "B")]
    lines += [event("dynamo", ts, "E") for ts in bad]
    lines.append(event("dynamo", "3000000", "E"))
    lines.append("V1206 01:09:07.059000 1002 torch/_dynamo/x.py:1] {\"compilation_metrics\": "
                 '{"compile_id": "0/0", "entire_frame_compile_time_s": 2.0}}\n')  # fmt: skip
    lines.append(event("next", "4000000", "B"))  # not last in its block: read where it lies
    (tmp_path / "rank_0.log").write_text("".join(lines))
    got, _notes = trace.read(tmp_path)
    events = [r for r in got if isinstance(r, trace.Event)]
    assert [(e.name, e.ph, e.ts) for e in events] == [
        ("dynamo", "B", 1e6), ("dynamo", "E", 3e6), ("next", "B", 4e6)
    ]  # fmt: skip
    tally = count.Tally()
    for record in got:
        tally.add(record)
    figures = tally.figures(tally.lookups())
    text = json.dumps(figures, allow_nan=False)  # raises on Infinity or NaN
    assert figures["phases"]["job"]["Dynamo tracing"] == 2.0, text


HUGE = ["1e999", "-1e999", "NaN", "1" + "0" * 400]


@pytest.mark.parametrize("value", HUGE)
def test_numbers_no_count_or_clock_gives_count_as_nothing_and_never_stop_the_stats(
    tmp_path: Path, value: str
) -> None:
    """A compile time, a lookup's times and a history row's counts written as 1e999, NaN or
    a 400-digit integer: each counts as 0 (jobstats.numbers, one rule for all three), where
    they gave Infinity in the JSON or stopped `fxcache stats` with a traceback
    (OverflowError converting to int)."""
    from ci_fxcache.jobstats import count, history, trace

    (tmp_path / "rank_0.log").write_text(
        'V1206 01:09:07.059000 1002 torch/_dynamo/x.py:1] {"compilation_metrics": '
        f'{{"compile_id": "0/0", "entire_frame_compile_time_s": {value}}}}}\n'
        'V1206 01:09:07.059000 1002 torch/_inductor/x.py:1] {"artifact": {"name": '
        '"fx_graph_cache_miss", "encoding": "json"}, "frame_id": 0, "frame_compile_id": 0}\n'
        f'\t{{"key": "fabc", "components": [], "cache_event_time": {value}, '
        f'"time_taken_ns": {value}}}\n'
    )
    got, _notes = trace.read(tmp_path)
    tally = count.Tally()
    for record in got:
        tally.add(record)
    found = tally.lookups()
    figures = tally.figures(found)
    json.dumps(figures, allow_nan=False)
    assert figures["compile_s"] == 0 and figures["fxgraph"]["miss"] == 1
    assert found[0]["cold_ns"] == 0 and found[0]["at_ns"] == 0
    row = history.checked(json.loads(
        f'{{"id": "r", "at": "2026-12-01T10:00:00Z", "graphs": {value}, "hits": {value}, '
        f'"misses": {{"new": {value}}}, "bypasses": 0, "compile_s": {value}, "saved_s": 1}}'
    ))  # fmt: skip
    assert row is not None
    json.dumps(row, allow_nan=False)
    assert (row["graphs"], row["hits"], row["misses"], row["compile_s"]) == (0, 0, {"new": 0}, 0)
