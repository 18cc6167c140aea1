"""`fxcache verify` takes one frozen request (commands/verify.py `Request`): argparse builds it
from the command line and the action's verify step builds it from its inputs, and the two are
the same object for the same choices. Fast: the command itself is not run."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from ci_fxcache import cli
from ci_fxcache.action import steps
from ci_fxcache.commands import verify as verify_command
from tests.conftest import TORCH_PYTHON
from tests.runner_sim import run_event
from tests.test_action_steps import DEFAULT_INPUTS, pull_request_event, run_step


def _from_argv(argv: list[str]) -> verify_command.Request:
    """The request `cli.main` hands `verify.run` for `argv`."""
    args = cli.build_parser("verify").parse_args(argv)
    assert args.func is verify_command.run
    options = {k: v for k, v in vars(args).items() if k not in cli.DISPATCH_DESTS}
    request = args.request(**options)
    assert isinstance(request, verify_command.Request)
    return request


def test_the_request_is_frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [k for k in os.environ if k.startswith("FXCACHE_")]:
        monkeypatch.delenv(name)
    request = _from_argv(["verify", "--python", "py", "--dtypes", "float32"])
    assert request.flags["dtypes"] == "float32" and request.phase == "auto"
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.phase = "hot"  # type: ignore[misc]


def test_the_action_and_the_command_line_build_the_same_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inputs = {"dtypes": "float32,bfloat16", "mechanisms": "fxgraph", "fail-on": "no-gain",
              "min-speedup": "1.5"}  # fmt: skip
    setup = run_step(tmp_path, "setup", inputs)
    settings_path = setup.outputs["settings"]
    settings = json.loads(Path(settings_path).read_text())
    env_inputs = {**DEFAULT_INPUTS, "python": TORCH_PYTHON, "cache-root": str(tmp_path / "store"),
                  "github-token": "ghs_token", **inputs,
                  "run-event": run_event("pull_request", pull_request_event())}  # fmt: skip
    for name in [k for k in os.environ if k.startswith(("FXCACHE_", "GITHUB_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("FXCACHE_INPUTS", json.dumps(env_inputs))
    monkeypatch.setenv("FXCACHE_ACTION_SETTINGS", settings_path)
    monkeypatch.setenv("GITHUB_OUTPUT", str(tmp_path / "out"))
    seen: list[Any] = []
    monkeypatch.setattr(verify_command, "run", lambda request: seen.append(request) or 0)
    assert steps.verify() == 0
    (from_action,) = seen
    from_cli = _from_argv(
        ["verify", "--python", settings["python"], "--dtypes", "float32,bfloat16",
         "--mechanisms", "fxgraph", "--fail-on", "no-gain", "--min-speedup", "1.5",
         "--json", str(Path(settings["work"]) / "results.json"),
         "--timeout", str(settings["timeout_s"]),
         "--report-id", settings["report_id"]]
    )  # fmt: skip
    assert type(from_action) is verify_command.Request
    assert from_action == from_cli
