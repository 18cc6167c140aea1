"""The job's own compiles, observed (ci_fxcache/jobstats, `fxcache stats`): real torch compiles
in fresh processes between `fxcache restore` and `fxcache save`, as a CI job runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ci_fxcache.jobstats import causes

JOB = """
import sys, torch
import torch._inductor.config as inductor_config
if "nofuse" in sys.argv:
    inductor_config.epilogue_fusion = False
def f(x, y):
    return (x.sin() @ y).relu()
def g(x, y):
    return x.cos() @ y + 1
fn = g if "other" in sys.argv else f
x = torch.randn(32, 32, requires_grad=True)
torch.compile(fn)(x, torch.randn(32, 32)).sum().backward()
"""


class Job:
    """One CI job: restore (its export lines applied), steps, stats, save."""

    def __init__(self, tmp: Path, name: str, extra_env: dict[str, str] | None = None) -> None:
        self.state = tmp / f"{name}.state.json"
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("GITHUB_", "FXCACHE_", "TORCH"))
        }
        self.env.update({"FXCACHE_ROOT": str(tmp / "root"), **(extra_env or {})})
        tmp.mkdir(parents=True, exist_ok=True)
        self.script = tmp / "job.py"
        self.script.write_text(JOB, encoding="utf-8")

    def fxcache(self, *args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "ci_fxcache", *args],
            capture_output=True, text=True, env=self.env, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done

    def restore(self, *flags: str) -> str:
        out = self.fxcache(
            "restore", "--python", sys.executable, "--state-file", str(self.state), *flags
        ).stdout
        for line in out.splitlines():
            if line.startswith("export "):
                name, _, value = line.removeprefix("export ").partition("=")
                self.env[name] = value.strip("'")
        return out

    def step(self, *args: str) -> None:
        subprocess.run([sys.executable, str(self.script), *args], env=self.env, check=True,
                       capture_output=True)  # fmt: skip

    def traced(self, key: str) -> None:
        """A step that compiled one new graph, as torch's trace records it (for tests of what
        the figures become, not of torch: `step` runs a real compile)."""
        trace_dir = Path(self.env["TORCH_TRACE"])
        trace_dir.mkdir(parents=True, exist_ok=True)
        (trace_dir / f"{key}.log").write_text(_lookup("miss", key, [f"[{key}] gm: {key}"]))

    def stats(self) -> dict[str, Any]:
        return json.loads(self.fxcache("stats", "--state-file", str(self.state), "--json").stdout)

    def save(self) -> str:
        return self.fxcache("save", "--state-file", str(self.state)).stdout


@pytest.mark.slow
def test_a_job_run_again_hits_then_names_the_changed_inductor_setting(tmp_path: Path) -> None:
    first = Job(tmp_path, "first")
    assert "TORCH_TRACE" in first.restore()
    first.step()
    seen = first.stats()
    assert seen["fxgraph"]["miss"] == 2 and seen["miss_causes"]["new graph"] == 2
    _sums_to_the_compile_time(seen)
    assert seen["phases"]["largest"] == "Inductor compiling"  # a cold compile
    assert "2 new graphs" in first.save()
    trace_dir = Path(first.env["TORCH_TRACE"])
    assert not trace_dir.exists(), "the job-private trace is removed once read"
    assert first.stats()["miss_causes"]["new graph"] == 2, "kept after the save"

    second = Job(tmp_path, "second")
    second.restore()
    second.step()
    hit = second.stats()
    assert hit["fxgraph"] == {"hit": 2, "miss": 0, "bypass": 0}
    assert hit["aotautograd"]["hit"] == 1
    assert hit["saved_s"] > 0
    assert hit["cpp_builds"] < seen["cpp_builds"], "the hot load builds (almost) no C++"
    _sums_to_the_compile_time(hit)
    assert hit["phases"]["job"]["cache lookup and load"] > 0
    assert "2 of 2 graphs from the cache" in second.save()

    third = Job(tmp_path, "third")
    third.restore()
    third.step("nofuse")  # one Inductor setting changed
    third.step("other")  # and a graph the scope never saw
    changed = third.stats()
    assert changed["processes"] == 2
    by_cause = {m["cause"]: m for m in changed["misses"]}
    assert changed["miss_causes"] == {
        "new graph": 2,
        "key changed": 2,
        "entry gone": 0,
        "compiled at once": 0,
    }
    names = [c["component"] for c in by_cause["key changed"]["changed"]]
    assert names == ["inductor_config[epilogue_fusion]"]
    assert by_cause["key changed"]["changed"][0]["was"] == "True"
    assert by_cause["key changed"]["changed"][0]["now"] == "False"
    assert "key changed: inductor_config[epilogue_fusion]" in third.save()
    history = third.stats()["history"]
    assert [row["hits"] for row in history] == [0, 2, 0]


def _sums_to_the_compile_time(doc: dict[str, Any]) -> None:
    """Where the time went (torch's timed events) adds up to torch's compile time."""
    parts = doc["phases"]["job"]
    assert abs(sum(parts.values()) - doc["compile_s"]) <= 0.03 * doc["compile_s"], parts


def test_the_largest_part_gets_advice_only_where_the_matrix_verified_it() -> None:
    from ci_fxcache.report import job_line

    doc = {"processes": 2, "compile_s": 20.0, "phases": {
        "job": {"Dynamo tracing": 14.0, "cache lookup and load": 4.0, "guard building": 2.0},
        "largest": "Dynamo tracing", "per_process_s": 12.0}}  # fmt: skip
    plain = job_line.detail(doc)
    assert "where the compile time went: Dynamo tracing 14 s, cache lookup and load 4 s" in plain
    assert "12 s in the process that spent most" in plain and "verified" not in plain
    advised = job_line.detail(doc, verified=frozenset({"aot", "fxgraph"}))
    assert (
        "Dynamo tracing took 12 s per process: `aot` is verified safe for this model here "
        "and skips tracing" in advised.replace("\\", "")
    )
    assert "verified" not in job_line.detail(doc, verified=frozenset({"fxgraph"}))


@pytest.mark.slow
def test_every_process_of_one_job_counts(tmp_path: Path) -> None:
    job = Job(tmp_path, "job")
    job.restore()
    job.step()  # step 1 compiles cold
    job.step()  # step 2, a new process, loads what step 1 saved
    seen = job.stats()
    assert seen["processes"] == 2
    assert seen["fxgraph"] == {"hit": 2, "miss": 2, "bypass": 0}
    assert seen["miss_causes"]["new graph"] == 2
    # fx_kwargs[get_decomp_fn] differs between the two processes: never named anywhere
    assert "get_decomp_fn" not in json.dumps(seen)


def test_a_trace_the_job_set_itself_is_read_not_replaced_nor_removed(tmp_path: Path) -> None:
    own = tmp_path / "my-trace"
    own.mkdir()
    (own / "kept.log").write_text("not a trace\n", encoding="utf-8")
    job = Job(tmp_path, "own", {"TORCH_TRACE": str(own)})
    assert "TORCH_TRACE" not in job.restore()
    assert job.stats()["trace"][-1]["dir"] == str(own)
    job.save()
    assert (own / "kept.log").is_file()


def test_no_job_trace_turns_it_off(tmp_path: Path) -> None:
    job = Job(tmp_path, "off")
    assert "TORCH_TRACE" not in job.restore("--no-job-trace")
    assert (
        "your job" not in job.save()
    )  # no trace: nothing to say there (tests/test_save_job_line.py)
    assert "no trace of its compiles" in job.fxcache("stats", "--state-file", str(job.state)).stdout


def test_process_specific_components_are_never_a_cause() -> None:
    a = {"fx_kwargs[get_decomp_fn]": ["aaa", "<function f at 0x7f00>"], "x": ["1", "1"]}
    b = {"fx_kwargs[get_decomp_fn]": ["bbb", "<function f at 0x7f11>"], "x": ["2", "2"]}
    assert causes.differing(a, b) == ["x"]
    c = {**a, "other": ["h1", "<object at 0xdead>"]}
    d = {**a, "other": ["h2", "<object at 0xbeef>"]}
    assert causes.differing(c, d) == []


def test_a_miss_on_a_key_the_scope_recorded_is_an_entry_gone() -> None:
    comps = {"gm": ["g1", "graph"], "inductor_config[x]": ["h", "1"]}
    recorded = {"fkey": {"graph": "gm:g1", "cold_ns": 5, "components": comps}}
    lookup = {"cache": "fxgraph", "state": "miss", "key": "fkey", "components": comps,
              "process": "p", "cold_ns": 0}  # fmt: skip
    assert causes.explain([lookup], recorded)[0]["cause"] == causes.ENTRY_GONE
    assert causes.explain([lookup], {})[0]["cause"] == causes.NEW_GRAPH


def _header(name: str, pid: int = 7) -> str:
    head = {"artifact": {"name": name, "encoding": "json"}, "frame_id": 0, "frame_compile_id": 0}
    return f"V1204 20:59:36.331000 {pid} torch/x.py:1] {json.dumps(head)}\n"


def _lookup(state: str, key: str, components: list[str]) -> str:
    payload = {"key": key, "components": components, "time_taken_ns": 10**9}
    return _header(f"fx_graph_cache_{state}") + "\t" + json.dumps(payload) + "\n"


MARKUP = "<img src=x onerror=alert(1)> @octocat #1 ::set-output name=x::y [a](http://e.vil) `c`"


def test_a_hostile_trace_is_bounded_and_escaped(tmp_path: Path) -> None:
    from ci_fxcache.jobstats import count, history, records, trace
    from ci_fxcache.report import job_line

    d = tmp_path / "trace"
    d.mkdir()
    evil = [f"[h1] gm: {MARKUP}", f"[h2] inductor_config[{MARKUP}]: {MARKUP}"]
    other = [f"[h1] gm: {MARKUP}", f"[h3] inductor_config[{MARKUP}]: x"]
    with (d / "a.log").open("w", encoding="utf-8") as out:
        out.write(_lookup("miss", "k1", evil))
        out.write('V1204 garbage ] {not json\n\t{"key": \n')  # malformed header and payload
        out.write("\x00\xff binary \x1b[31m\n")
        out.write(_header("fx_graph_cache_miss") + "\t" + "x" * 5000 + "\n")  # overlong line
        out.write(_lookup("miss", "k2", other))
        out.write(_header("dynamo_graph_break_reason") + f"\tGraph Break Reason: {MARKUP}\n")
        for _ in range(2000):  # many records past the limit
            out.write(_lookup("hit", "k1", evil))
    (d / "link.log").symlink_to("/etc/passwd")  # never followed
    limits = trace.Limits(total_bytes=1 << 20, records=500, line_bytes=4096, payload_bytes=4096)
    got, notes = trace.read(d, limits)
    assert notes.files == 1 and notes.skipped_lines >= 1
    assert notes.stopped == ["read 500 records, the limit"]
    found = count.lookups(got)
    assert len(found) < 500
    misses = causes.explain(found, {})
    # the lookup whose payload was over the limit still counts, without its key
    assert [m["cause"] for m in misses[:3]] == ["new graph", "new graph", "key changed"]
    assert misses[1]["key"] == "" and notes.skipped_payloads >= 1
    doc = {
        "trace": [{"files": 1, **notes.to_dict()}],
        **count.figures(got, found),
        "miss_causes": causes.by_cause(misses),
        "misses": misses,
        "saved_s": 0.0,
        "history": [history.row({"at": MARKUP, "graphs": 3})],
    }
    markdown = job_line.summary(doc)
    for raw in ("<img", "@octocat", "#1 ", "[a](", "`c`"):
        assert raw not in markdown, raw
    assert "&lt;img" in markdown
    assert "\x1b" not in job_line.text(doc)
    # a record file the scope holds is read field by field: nothing but the schema's types
    junk = {"schema": records.SCHEMA, "common": {"a": [1, 2]}, "entries": {"k": {"own": "x"}}}
    assert records.decode(junk) == {"k": {"graph": "None", "cold_ns": 0, "components": {}}}
    assert records.decode([1, 2]) == {}


def test_a_huge_trace_is_read_to_its_byte_limit_only(tmp_path: Path) -> None:
    from ci_fxcache.jobstats import trace

    d = tmp_path / "trace"
    d.mkdir()
    line = _lookup("hit", "k", ["[h] gm: x"])
    (d / "big.log").write_text(line * ((8 << 20) // len(line)), encoding="utf-8")
    got, notes = trace.read(d, trace.Limits(total_bytes=1 << 20))
    assert notes.stopped == [f"read {1 << 20} bytes, the limit"]
    assert notes.bytes <= (1 << 20) + len(line)
    assert 0 < len(got) < (8 << 20) // len(line)


def test_a_run_that_may_not_write_records_nothing(tmp_path: Path) -> None:
    from ci_fxcache.jobstats import history

    reader = Job(tmp_path, "reader")
    reader.restore("--read-only")
    assert "not saved" in reader.save()
    assert not (tmp_path / "root" / history.LOCAL_DIR).exists()
    assert reader.stats()["recorded"] is False

    idle = Job(tmp_path, "idle")
    idle.restore()
    idle.save()  # compiled nothing (a verify-only job): no history row, no file in the scope
    key = idle.stats()["scope_key"]
    assert idle.stats()["history"] == []
    assert not history.local_file(tmp_path / "root", key).exists()
    assert not list((tmp_path / "root").glob("*/inductor/fxcache-jobs/*"))
    writer = Job(tmp_path, "writer")
    writer.restore()
    writer.traced("k1")
    writer.save()
    assert len(json.loads(history.local_file(tmp_path / "root", key).read_text())) == 1


def _figures(tmp_path: Path) -> Path:
    """A job's figures as `fxcache stats --json` writes them, with markup in a changed value."""
    doc = {
        "schema": "fxcache-stats/1",
        "trace": [{"files": 2}],
        "graphs": 38,
        "fxgraph": {"hit": 35, "miss": 3, "bypass": 0},
        "aotautograd": {"hit": 17, "miss": 2, "bypass": 0},
        "miss_causes": {"new graph": 2, "key changed": 1, "entry gone": 0},
        "misses": [
            {"key": "fabc", "cause": "key changed", "changed": [
                {"component": "inductor_config[epilogue_fusion]", "was": "True", "now": MARKUP}
            ]},
            *({"key": f"f{i}", "cause": "new graph", "changed": []} for i in range(30)),
        ],
        "saved_s": 150.0,
        "history": [],
    }  # fmt: skip
    path = tmp_path / "stats.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def test_the_pr_comment_gets_the_job_line_under_its_status(
    fake_github: Any, run_fxcache: Any, tmp_path: Path
) -> None:
    from ci_fxcache.report import pr_comment
    from tests.test_comment import PR, RESULTS, _env

    fake_github.add_pull(PR)
    env = _env(fake_github, tmp_path)
    done = run_fxcache("comment", RESULTS, "--job-stats", str(_figures(tmp_path)), env=env)
    assert done.returncode == 0, done.stderr
    (body,) = [str(c["body"]) for c in fake_github.comments[PR]]
    assert pr_comment.is_ours(body, "fxcache")
    lines = body.splitlines()
    status = next(i for i, line in enumerate(lines) if line.startswith("### fxcache:"))
    assert lines[status + 2] == (
        "**your job: 35 of 38 graphs from the cache, 1 key changed: "
        "inductor\\_config\\[epilogue\\_fusion\\], 2 new graphs; the cache saved about 2.5 min "
        "of compile**"
    )
    assert "<details><summary>your job: detail</summary>" in body
    assert "<img" not in body and "… 21 more" in body  # ten misses shown, the rest counted


def test_the_job_summary_advises_only_what_the_jobs_own_matrix_verified(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The action's end-of-job summary (job_compiles.publish) reads the job's results.json:
    advice where it verified the mechanism, none where it did not, ran no matrix, or wrote a
    file that is not a results document (a warning says so)."""
    from ci_fxcache.action import job_compiles
    from tests.test_comment import RESULTS

    doc = {"processes": 2, "compile_s": 27.0, "graphs": 2, "phases": {
        "job": {"Dynamo tracing": 24.0, "Inductor compiling": 3.0},
        "largest": "Dynamo tracing", "per_process_s": 12.0}}  # fmt: skip
    results = json.loads(Path(RESULTS).read_text())
    all_safe = tmp_path / "all-safe.json"
    all_safe.write_text(json.dumps({**results, "combos": [
        c for c in results["combos"] if c["mechanism"] != "precompile" or c["verdict"] == "safe"
    ]}))  # fmt: skip
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    summaries = {}
    for name, path in (("as ran", Path(RESULTS)), ("all safe", all_safe),
                       ("no matrix", tmp_path / "absent.json"), ("broken", broken)):  # fmt: skip
        out = tmp_path / f"summary-{name}"
        out.write_text("")
        monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(out))
        job_compiles.publish(doc, path)
        summaries[name] = out.read_text().replace("\\", "")
        warned = capsys.readouterr().err
        assert ("gives no advice" in warned) == (name == "broken"), (name, warned)
    advice = "`precompile` is verified safe for this model here and skips tracing"
    assert "where the compile time went: Dynamo tracing 24 s" in summaries["as ran"]
    assert advice in summaries["all safe"]
    assert all("verified safe" not in summaries[n] for n in ("as ran", "no matrix", "broken"))


def test_the_comment_advises_only_a_mechanism_the_matrix_verified(
    fake_github: Any, run_fxcache: Any, tmp_path: Path
) -> None:
    from tests.test_comment import PR, RESULTS, _env

    figures = _figures(tmp_path)
    doc = json.loads(figures.read_text())
    doc["processes"] = 2
    doc["phases"] = {"job": {"Dynamo tracing": 24.0, "Inductor compiling": 3.0},
                     "largest": "Dynamo tracing", "per_process_s": 12.0}  # fmt: skip
    figures.write_text(json.dumps(doc), encoding="utf-8")
    results = json.loads(Path(RESULTS).read_text())
    results["combos"] = [  # only the safe precompile combinations ran
        c for c in results["combos"] if c["mechanism"] != "precompile" or c["verdict"] == "safe"
    ]
    verified = tmp_path / "verified.json"
    verified.write_text(json.dumps(results), encoding="utf-8")
    fake_github.add_pull(PR)
    env = _env(fake_github, tmp_path)
    bodies = []
    for path in (RESULTS, str(verified)):  # as it ran (precompile unsafe once), then all safe
        done = run_fxcache("comment", path, "--job-stats", str(figures), env=env)
        assert done.returncode == 0, done.stderr
        bodies.append(str(fake_github.comments[PR][-1]["body"]))
    assert "where the compile time went: Dynamo tracing 24 s" in bodies[0]
    assert "is verified safe for this model here" not in bodies[0]
    assert "`precompile` is verified safe for this model here and skips tracing" in bodies[
        1
    ].replace("\\", "")


@pytest.mark.slow
def test_the_history_survives_a_restore_on_an_empty_runner_from_s3(
    tmp_path: Path, seaweed: Any
) -> None:
    import uuid

    name = f"t-{uuid.uuid4().hex[:16]}"
    seaweed.make_bucket(name)
    s3 = {**seaweed.env(), "FXCACHE_S3_URL": f"s3://{name}/ci"}
    first = Job(tmp_path / "a", "first", s3)
    first.restore("--store", "s3")
    first.step()
    assert "published to" in first.save()
    row = first.stats()["history"][-1]
    assert row["graphs"] == 2 and row["id"] != "current"

    empty = Job(tmp_path / "b", "second", s3)  # another runner: its own, empty store root
    assert not (tmp_path / "b" / "root").exists()
    empty.restore("--store", "s3")
    history = empty.stats()["history"]
    assert [r["id"] for r in history] == [row["id"]]  # it compiled nothing yet: no row
    assert history[0]["misses"]["new graph"] == 2


@pytest.mark.slow
def test_a_job_level_trace_counts_the_jobs_step_and_never_the_matrix(tmp_path: Path) -> None:
    own = tmp_path / "tlparse-trace"  # teams set TORCH_TRACE for the whole job, for tlparse
    job = Job(tmp_path, "verify", {"TORCH_TRACE": str(own)})
    job.restore()
    job.fxcache(
        "verify", "--python", sys.executable, "--dtypes", "float32", "--dynamic", "false",
        "--mechanisms", "fxgraph", "--training", "false",
    )  # fmt: skip
    assert not own.exists() or not list(own.iterdir()), "verify wrote into the user's trace"
    job.step()
    seen = job.stats()
    assert seen["processes"] == 1 and len(list(own.iterdir())) == 1
    assert seen["fxgraph"] == {"hit": 0, "miss": 2, "bypass": 0}
    assert seen["untraced_entries"] == 0


@pytest.mark.slow
def test_a_trace_set_for_one_step_is_named(tmp_path: Path) -> None:
    job = Job(tmp_path, "one-step")
    job.restore()
    job.env["TORCH_TRACE"] = str(tmp_path / "step-only")  # the step's own, over the job's
    job.step()
    del job.env["TORCH_TRACE"]  # the save step sees the job's, as a runner would
    job.env["TORCH_TRACE"] = str(Path(str(job.state) + ".torch-trace"))
    seen = job.stats()
    assert seen["untraced_entries"] == 2
    line = job.fxcache("stats", "--state-file", str(job.state)).stdout
    assert "yet it wrote 2 new FX graph entries" in line
    assert "set TORCH_TRACE for the job, not one step" in line


def test_without_a_state_file_stats_shows_the_scopes_history(tmp_path: Path) -> None:
    from ci_fxcache.jobstats import history

    job = Job(tmp_path, "job")
    job.restore()
    job.traced("k1")
    job.save()
    rows = json.loads(history.local_file(tmp_path / "root", job.stats()["scope_key"]).read_text())
    job.env.pop("FXCACHE_STATE_FILE")
    shown = json.loads(job.fxcache("stats", "--python", sys.executable, "--json").stdout)
    assert shown["history"] == rows
    text = job.fxcache("stats", "--python", sys.executable).stdout
    assert "history (last 1 runs of the scope):" in text
    job.env["FXCACHE_ROOT"] = str(tmp_path / "elsewhere")
    done = subprocess.run(
        [sys.executable, "-m", "ci_fxcache", "stats", "--python", sys.executable],
        capture_output=True, text=True, env=job.env, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "run 'fxcache restore' first" in done.stderr


def test_jobs_saving_side_by_side_each_add_their_history_row(tmp_path: Path) -> None:
    from ci_fxcache.jobstats import history

    jobs = [Job(tmp_path, f"job{i}") for i in range(4)]
    for i, job in enumerate(jobs):
        job.restore()
        job.traced(f"k{i}")
    running = [
        subprocess.Popen(
            [sys.executable, "-m", "ci_fxcache", "save", "--state-file", str(job.state)],
            env=job.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for job in jobs
    ]
    assert [p.wait() for p in running] == [0] * 4
    key = jobs[0].stats()["scope_key"]
    rows = json.loads(history.local_file(tmp_path / "root", key).read_text())
    assert sorted(r["id"] for r in rows) == sorted(job.stats()["job_id"] for job in jobs)


def test_one_endless_line_is_read_to_the_byte_limit_only(tmp_path: Path) -> None:
    from ci_fxcache.jobstats import trace

    d = tmp_path / "trace"
    d.mkdir()
    with (d / "endless.log").open("wb") as out:
        out.write(b"\t" + b"x" * (6 << 20))  # no newline: one line of 6 MiB
    got, notes = trace.read(d, trace.Limits(total_bytes=2 << 20, line_bytes=4096))
    assert got == [] and notes.skipped_lines == 1
    assert notes.bytes <= (3 << 20), notes.bytes
    assert notes.stopped == [f"read {2 << 20} bytes, the limit"]


def test_a_key_another_process_was_still_compiling_is_compiled_at_once() -> None:
    comps = {"gm": ["g1", "graph"]}

    def lookup(process: str, state: str, at_s: int, rank: int) -> dict[str, Any]:
        return {"cache": "fxgraph", "state": state, "key": "fk", "components": comps,
                "process": process, "rank": rank, "cold_ns": 10 * 10**9 if state == "miss" else 0,
                "at_ns": at_s * 10**9}  # fmt: skip

    # rank 0 and rank 1 start within a second; rank 0's entry is written at 11 s
    misses = causes.explain([lookup("a", "miss", 1, 0), lookup("b", "miss", 2, 1)], {})
    assert [m["cause"] for m in misses] == [causes.NEW_GRAPH, causes.AT_ONCE]
    assert misses[1]["processes"] == 2 and misses[1]["rank"] == 1
    # a lookup that started after the entry was written and still missed: the entry is gone
    later = causes.explain([lookup("a", "miss", 1, 0), lookup("c", "miss", 12, 2)], {})
    assert [m["cause"] for m in later] == [causes.NEW_GRAPH, causes.ENTRY_GONE]


READ_IN_CHILD = """
import sys
from pathlib import Path
from ci_fxcache.jobstats import causes, count, trace
tally, notes = count.Tally(), trace.ReadNotes()
for record in trace.stream(Path(sys.argv[1]), trace.Limits(), notes):
    tally.add(record)
found = tally.lookups()
figures = tally.figures(found)
misses = causes.explain(found, {})
# VmHWM: this program's own peak (ru_maxrss also counts the pytest worker it was forked from,
# whose pages the child held until its exec)
status = Path("/proc/self/status").read_text()
peak = int(status.split("VmHWM:")[1].split()[0]) * 1024
print(peak, notes.bytes, figures["graphs"], len(misses))
"""


def test_reading_a_large_trace_stays_within_256_mib(tmp_path: Path) -> None:
    from benchmarks.bench_job_trace import write_trace

    # 4 processes, 400 components a lookup (torch 2.15 wrote 678 for a tiny model): ~70 MiB
    size = write_trace(tmp_path / "trace", 4, 640, components=400)
    assert size > 64 << 20
    done = subprocess.run(
        [sys.executable, "-c", READ_IN_CHILD, str(tmp_path / "trace")],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    peak, read, graphs, misses = (int(x) for x in done.stdout.split())
    assert read == size and graphs == 2560 and misses == 640
    assert peak < 256 << 20, f"peak {peak >> 20} MiB"


def test_events_side_by_side_add_up_to_their_parents_time() -> None:
    from ci_fxcache.jobstats import phases

    # two C++ builds of Inductor's compile threads overlap inside one 4 s compile
    timed = phases.Phases()
    for name, ph, at_s in [("dynamo", "B", 0), ("compile_file", "B", 1), ("compile_file", "B", 1),
                           ("compile_file", "E", 3.5), ("compile_file", "E", 3.5),
                           ("bytecode_tracing", "B", 3.5), ("bytecode_tracing", "E", 3.7),
                           ("dynamo", "E", 4)]:  # fmt: skip
        timed.timed("p", name, ph, at_s * 1e6)
    spent = timed.seconds["p"]
    assert abs(sum(spent.values()) - 4.0) < 1e-9
    assert abs(spent[phases.INDUCTOR] - 2.5) < 1e-9 and abs(spent[phases.DYNAMO] - 1.5) < 1e-9
    got = timed.figures({}, ["p"])
    assert got["largest"] == phases.INDUCTOR and got["total_s"] == 4.0
