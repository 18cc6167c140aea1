"""A small simulation of GitHub's runner for JavaScript actions (this machine cannot run the real
one): one job of steps, each an action's `node <main>` or a shell command, run as the runner
runs them.

What it does as the runner does (actions/runner, src/Runner.Worker): every step gets fresh
file-command files under `$RUNNER_TEMP/_runner_file_commands/` (`set_env_<uuid>`,
`add_path_<uuid>`, `set_output_<uuid>`, `save_state_<uuid>`, `step_summary_<uuid>`), read back
after the step: `$GITHUB_ENV` (both forms; `NODE_OPTIONS` refused) becomes the job's
environment for later steps, `$GITHUB_PATH` is prepended to PATH, `$GITHUB_STATE` is handed to
that action's post step as `STATE_<name>`, `$GITHUB_OUTPUT` gives the step's outputs. The
runner's own `GITHUB_*` and `RUNNER_*` variables always win over a value from `$GITHUB_ENV`.
An action step gets `INPUT_<NAME>` for every input of its action.yml (the `with:` value, else
the default with its `${{ }}` expressions evaluated against the github context: property
paths, `toJSON(...)`), and the runner's cache-service variables (JavaScript actions only).
`::add-mask::` values are read back unescaped (`%25`, `%0D`, `%0A`), as the runner does.
Post steps run after the job's steps, in reverse order, each with its main step's state.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

_EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")
_FILES = {
    "GITHUB_ENV": "set_env_",
    "GITHUB_PATH": "add_path_",
    "GITHUB_OUTPUT": "set_output_",
    "GITHUB_STATE": "save_state_",
    "GITHUB_STEP_SUMMARY": "step_summary_",
}
# Variables a step cannot set through $GITHUB_ENV (the runner refuses NODE_OPTIONS).
_REFUSED = ("NODE_OPTIONS",)


def read_file_command(text: str) -> dict[str, str]:
    """`NAME=value` lines and `NAME<<DELIMITER` blocks, as SetEnvFileCommand parses them."""
    values: dict[str, str] = {}
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line:
            continue
        eq, heredoc = line.find("="), line.find("<<")
        if eq >= 0 and (heredoc < 0 or eq < heredoc):
            values[line[:eq]] = line[eq + 1 :]
        elif heredoc >= 0:
            name, delimiter = line[:heredoc], line[heredoc + 2 :]
            end = lines.index(delimiter, i)
            values[name] = "\n".join(lines[i:end])
            i = end + 1
        else:
            raise ValueError(f"invalid file command line {line!r}")
    return values


def _lookup(context: dict[str, Any], path: str) -> Any:
    value: Any = context
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def evaluate(template: str, context: dict[str, Any]) -> str:
    """An action.yml default with its `${{ }}` expressions evaluated (a property path of the
    github context, or toJSON of one: all the action files use)."""

    def one(match: re.Match[str]) -> str:
        expr = match.group(1)
        inner = re.fullmatch(r"toJSON\((.*)\)", expr)
        if inner:
            return json.dumps(_lookup(context, inner.group(1).strip()))
        value = _lookup(context, expr)
        return "" if value is None else str(value)

    return _EXPRESSION.sub(one, template)


def unescape(data: str) -> str:
    """A workflow command's data as the runner reads it."""
    return data.replace("%0D", "\r").replace("%0A", "\n").replace("%25", "%")


@dataclass
class StepResult:
    """One step: exit code, log, outputs, and the masks and errors its log carried."""

    returncode: int
    log: str
    outputs: dict[str, str]
    masks: list[str] = field(default_factory=list)

    @property
    def errors(self) -> list[str]:
        return [line for line in self.log.splitlines() if line.startswith("::error::")]


@dataclass
class Runner:
    """One job on a simulated runner. `env` is the job's environment (the workflow's `env:`
    and what earlier steps exported); `event` the payload, `event_name` the trigger."""

    tmp: Path
    event_name: str
    event: dict[str, Any]
    env: dict[str, str]
    repository: str = "octo-org/demo"
    token: str = "ghs_job_token"
    ref: str = "refs/pull/7/merge"
    api_url: str = "https://api.github.com"
    cache_service: dict[str, str] = field(default_factory=dict)  # JavaScript actions only
    posts: list[tuple[Path, str, dict[str, str], dict[str, str]]] = field(default_factory=list)
    path_prefix: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.temp = self.tmp / "runner-temp"
        self.commands = self.temp / "_runner_file_commands"
        self.commands.mkdir(parents=True, exist_ok=True)
        self.workspace = self.tmp / "workspace"
        self.workspace.mkdir(exist_ok=True)
        self.event_path = self.tmp / "event.json"
        self.event_path.write_text(json.dumps(self.event))

    def context(self) -> dict[str, Any]:
        """The github context the runner evaluates expressions against (its own record)."""
        return {
            "github": {
                "event_name": self.event_name,
                "event": json.loads(json.dumps(self.event)),
                "token": self.token,
                "repository": self.repository,
                "ref": self.ref,
            }
        }

    def _runner_env(self) -> dict[str, str]:
        return {
            "CI": "true",
            "GITHUB_ACTIONS": "true",
            "GITHUB_API_URL": self.api_url,
            "GITHUB_SERVER_URL": "https://github.com",
            "GITHUB_REPOSITORY": self.repository,
            "GITHUB_EVENT_NAME": self.event_name,
            "GITHUB_EVENT_PATH": str(self.event_path),
            "GITHUB_REF": self.ref,
            "GITHUB_RUN_ID": "4242",
            "GITHUB_RUN_ATTEMPT": "1",
            "GITHUB_WORKSPACE": str(self.workspace),
            "RUNNER_TEMP": str(self.temp),
            "RUNNER_TOOL_CACHE": str(self.tmp / "tool-cache"),
        }

    def _step_env(self) -> tuple[dict[str, str], dict[str, Path]]:
        files = {}
        for var, prefix in _FILES.items():
            path = self.commands / f"{prefix}{uuid.uuid4()}"
            path.write_text("")
            files[var] = path
        env = {**self.env, **self._runner_env(), **{k: str(v) for k, v in files.items()}}
        if self.path_prefix:
            env["PATH"] = os.pathsep.join([*self.path_prefix, env.get("PATH", "")])
        return env, files

    def _finish(self, proc: subprocess.CompletedProcess[str], files: dict[str, Path]) -> StepResult:
        for name, value in read_file_command(files["GITHUB_ENV"].read_text()).items():
            if name in _REFUSED:
                continue
            self.env[name] = value
        for line in files["GITHUB_PATH"].read_text().splitlines():
            if line:
                self.path_prefix.insert(0, line)
        log = proc.stdout + proc.stderr
        masks = [
            unescape(line[len("::add-mask::") :])
            for line in log.splitlines()
            if line.startswith("::add-mask::")
        ]
        outputs = read_file_command(files["GITHUB_OUTPUT"].read_text())
        return StepResult(proc.returncode, log, outputs, masks)

    def uses(self, action_dir: Path, with_: dict[str, str] | None = None,
             timeout: float = 900) -> StepResult:  # fmt: skip
        """An action step: `node <runs.main>` with its inputs and the cache service's
        variables; its post step (if any) is queued with the state it kept."""
        spec = yaml.safe_load((action_dir / "action.yml").read_text())
        inputs = {}
        context = self.context()
        for name, declared in (spec.get("inputs") or {}).items():
            value = (with_ or {}).get(name)
            if value is None:
                value = evaluate(str(declared.get("default", "")), context)
            inputs[f"INPUT_{name.replace(' ', '_').upper()}"] = value
        env, files = self._step_env()
        env.update(inputs)
        env.update(self.cache_service)
        proc = subprocess.run(["node", str(action_dir / spec["runs"]["main"])], env=env,
                              cwd=self.workspace, capture_output=True, text=True,
                              check=False, timeout=timeout)  # fmt: skip
        state = read_file_command(files["GITHUB_STATE"].read_text())
        result = self._finish(proc, files)
        if spec["runs"].get("post"):
            self.posts.append((action_dir, spec["runs"]["post"], inputs, state))
        return result

    def run(self, script: str, timeout: float = 600) -> StepResult:
        """A `run:` step (bash, as `shell: bash` runs it)."""
        env, files = self._step_env()
        proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
                              env=env, cwd=self.workspace, capture_output=True, text=True,
                              check=False, timeout=timeout)  # fmt: skip
        return self._finish(proc, files)

    def post(self, timeout: float = 900) -> list[StepResult]:
        """The queued post steps, last action first, each with its main step's state."""
        results = []
        for action_dir, entry, inputs, state in reversed(self.posts):
            env, files = self._step_env()
            env.update(inputs)
            env.update(self.cache_service)
            env.update({f"STATE_{k}": v for k, v in state.items()})
            proc = subprocess.run(["node", str(action_dir / entry)], env=env, cwd=self.workspace,
                                  capture_output=True, text=True, check=False,
                                  timeout=timeout)  # fmt: skip
            results.append(self._finish(proc, files))
        self.posts.clear()
        return results


def run_event(event_name: str, event: dict[str, Any]) -> str:
    """The `run-event` input as the runner fills it in (action.yml's default evaluated)."""
    from tests.conftest import ROOT

    template = yaml.safe_load((ROOT / "action.yml").read_text())["inputs"]["run-event"]
    context = {"github": {"event_name": event_name, "event": event}}
    return evaluate(str(template["default"]), context)
