"""Issue 26 §6: text from documents or logs printed inside Actions issues no workflow command.

The runner reads every line of a step's stdout and stderr that starts with `::` as a command,
except between `::stop-commands::TOKEN` and `::TOKEN::`. `commands_run` reads a stream the
way the runner does; the report is rendered by the real command with a pipe for stdout, as
a step's log is.
"""

from __future__ import annotations

import copy
import io
import json
import os
from pathlib import Path

import pytest

from ci_fxcache import gha
from tests.conftest import RunFxcache

DATA = Path(__file__).parent / "data"
FORGED = [
    "::add-mask::hide-the-verdicts",
    "::error title=fxcache::all combinations safe",
    "::set-output name=safe-combos::everything",
    "  ::warning::indented still counts",
    "::stop-commands::pwned",
    "##[set-output name=safe-combos;]everything",
]


def commands_run(text: str) -> list[str]:
    """The workflow commands a runner would act on in `text` (one stream)."""
    found, stopped_by = [], None
    for line in text.splitlines():
        stripped = line.lstrip()
        if stopped_by is not None:
            if stripped == f"::{stopped_by}::":
                stopped_by = None
            continue
        if stripped.startswith("::stop-commands::"):
            stopped_by = stripped.removeprefix("::stop-commands::")
            continue
        if stripped.startswith(("::", "##[")):
            found.append(stripped)
    return found


def _forged(text: str) -> list[str]:
    return [c for c in commands_run(text) if any(c.startswith(f.strip()) for f in FORGED)]


def test_commands_run_sees_a_forged_command() -> None:
    """The reader above is not blind: a plain print is read as a command."""
    assert _forged("\n".join(FORGED)) and not _forged("x ::add-mask::y")


@pytest.mark.parametrize("fmt", ["text", "md"])
def test_report_inside_actions_prints_reasons_and_logs_inert(
    run_fxcache: RunFxcache, tmp_path: Path, fmt: str
) -> None:
    doc = json.loads((DATA / "results_h200.json").read_text())
    for combo in doc["combos"]:
        combo["reason"] = "fine\n" + "\n".join(FORGED)
        for phase in ("cold", "hot"):
            if combo.get(phase):
                combo[phase]["log_tail"] = "\n".join(FORGED) + "\nTraceback: none"
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    env = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"),
           "GITHUB_OUTPUT": str(tmp_path / "out")}  # fmt: skip
    proc = run_fxcache("report", str(path), "--format", fmt, env=env)
    assert proc.returncode in (0, 1), proc.stderr
    assert "hide-the-verdicts" in proc.stderr  # the log groups print the text ...
    assert _forged(proc.stdout) == [] and _forged(proc.stderr) == []  # ... inert
    # Our own commands still work: groups and annotations outside the stopped blocks.
    assert any(c.startswith("::group::") for c in commands_run(proc.stderr))
    assert any(c.startswith("::error title=fxcache unsafe") for c in commands_run(proc.stderr))


def test_output_into_a_file_is_left_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    target = tmp_path / "out.md"
    with target.open("w") as fh:
        gha.print_untrusted("::error::x\n", fh)
    assert target.read_text() == "::error::x\n"
    buffer = io.StringIO()
    gha.print_untrusted("plain", buffer)
    assert buffer.getvalue() == "plain"


def test_a_pipe_gets_a_fresh_token_each_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    read, write = os.pipe()
    with os.fdopen(write, "w") as out:
        gha.print_untrusted("::error::a", out)
        gha.print_untrusted("::error::b\n", out)
    with os.fdopen(read) as inp:
        text = inp.read()
    lines = text.splitlines()
    assert lines[1] == "::error::a" and commands_run(text) == []
    tokens = {line.removeprefix("::stop-commands::") for line in lines if "stop-commands" in line}
    assert len(tokens) == 2 and all(len(t) == 32 for t in tokens)


def test_outside_actions_nothing_is_added(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    read, write = os.pipe()
    with os.fdopen(write, "w") as out:
        gha.print_untrusted("::error::a\n", out)
    with os.fdopen(read) as inp:
        assert inp.read() == "::error::a\n"


def test_merge_prints_shard_titles_inert(run_fxcache: RunFxcache, tmp_path: Path) -> None:
    shard = json.loads((DATA / "shard_t4.json").read_text())
    evil = copy.deepcopy(shard)
    evil["runner"]["name"] = "x"
    evil["fingerprint"]["gpus"] = [
        {**g, "name": "T4\n::add-mask::hide-the-verdicts"} for g in shard["fingerprint"]["gpus"]
    ]
    path = tmp_path / "evil.json"
    path.write_text(json.dumps(evil))
    proc = run_fxcache("merge", str(path), "-o", str(tmp_path / "m.json"),
                       env={"GITHUB_ACTIONS": "true"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert _forged(proc.stdout) == [] and _forged(proc.stderr) == []
