"""The action's step scripts run directly (no runner): input validation and `auto` resolution
(scripts/settings.sh), and the toolkit install with its reuse (scripts/install-toolkit.sh)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, TORCH_PYTHON

SETTINGS = ROOT / "scripts" / "settings.sh"
INSTALL = ROOT / "scripts" / "install-toolkit.sh"
FXCACHE = str(Path(sys.executable).with_name("fxcache"))


def _read_file_vars(path: Path) -> dict[str, str]:
    """Parse an Actions environment file ($GITHUB_OUTPUT / $GITHUB_ENV), both syntaxes."""
    values: dict[str, str] = {}
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if "<<" in line and "=" not in line.split("<<")[0]:
            name, delim = line.split("<<", 1)
            end = lines.index(delim, i + 1)
            values[name] = "\n".join(lines[i + 1 : end])
            i = end + 1
            continue
        name, _, value = line.partition("=")
        values[name] = value
        i += 1
    return values


class Settings:
    def __init__(self, proc: subprocess.CompletedProcess[str], outputs: dict[str, str],
                 env: dict[str, str]) -> None:  # fmt: skip
        self.proc = proc
        self.outputs = outputs
        self.env = env


def _settings(tmp_path: Path, **overrides: str) -> Settings:
    out, genv = tmp_path / "output", tmp_path / "env"
    out.touch()
    genv.touch()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "FXCACHE_"))}
    env.update(
        {
            "GITHUB_ACTIONS": "true",
            "GITHUB_OUTPUT": str(out),
            "GITHUB_ENV": str(genv),
            "GITHUB_REPOSITORY": "octo-org/demo",
            "RUNNER_TEMP": str(tmp_path / "runner-temp"),
            "FXCACHE_ACTION_ROOT": str(ROOT),
            "FXCACHE": FXCACHE,
            "FXCACHE_PYTHON": TORCH_PYTHON,
            "IN_STORE": "local",
            "IN_CACHE_ROOT": str(tmp_path / "store"),
            "IN_READ_ONLY": "auto",
            "IN_COMMENT": "auto",
            "IN_FAIL_ON": "unsafe",
            "IN_ON_UNSAFE": "disable",
            "IN_INVALIDATE_ON_UPGRADE": "true",
            "IN_REPORT_ID": "fxcache",
            "IN_KEY_SUFFIX": "",
            "IN_TIMEOUT_MINUTES": "10",
            "IN_REDIS_URL": "",
            "IN_DEVICE": "",
            "IN_DTYPES": "",
            "IN_DYNAMIC": "",
            "IN_MECHANISMS": "",
            "IN_TRAINING": "",
            "IN_WORKLOADS": "",
            "IN_MATRIX_FILE": "",
            "EVENT_NAME": "pull_request",
            "HEAD_REPOSITORY": "octo-org/demo",
            "PR_NUMBER": "7",
            "RUN_ID": "4242",
            "RUN_ATTEMPT": "2",
        }
    )
    env.update(overrides)
    proc = subprocess.run(
        ["bash", str(SETTINGS)], env=env, capture_output=True, text=True, check=False
    )
    return Settings(proc, _read_file_vars(out), _read_file_vars(genv))


def test_same_repository_pull_request(tmp_path: Path) -> None:
    s = _settings(tmp_path)
    assert s.proc.returncode == 0, s.proc.stdout + s.proc.stderr
    work = tmp_path / "runner-temp" / "fxcache" / "fxcache"
    assert s.outputs == {
        "root": str(tmp_path / "store"),
        "state-file": str(work / "restore-state.json"),
        "results": str(work / "results.json"),
        "markdown": str(work / "report.md"),
        "read-only": "false",
        "comment": "true",
        "restore-store": "local",
        "timeout-s": "600",
    }
    assert (work / "pr-number").read_text().strip() == "7"
    assert s.env == {
        "FXCACHE_STORE": "local",
        "FXCACHE_ROOT": str(tmp_path / "store"),
        "FXCACHE_STATE_FILE": str(work / "restore-state.json"),
        "FXCACHE_PYTHON": TORCH_PYTHON,
    }


def test_fork_pull_request_is_read_only_and_leaves_the_comment_to_the_follow_up(
    tmp_path: Path,
) -> None:
    s = _settings(tmp_path, HEAD_REPOSITORY="someone/demo-fork")
    assert s.proc.returncode == 0, s.proc.stderr
    assert s.outputs["read-only"] == "true"
    assert s.outputs["comment"] == "false"
    assert "::notice::fxcache: pull request from a fork" in s.proc.stdout


def test_explicit_values_win_over_auto(tmp_path: Path) -> None:
    s = _settings(tmp_path, HEAD_REPOSITORY="someone/fork", IN_READ_ONLY="false", IN_COMMENT="true")
    assert (s.outputs["read-only"], s.outputs["comment"]) == ("false", "true")


def test_push_neither_comments_nor_is_read_only(tmp_path: Path) -> None:
    s = _settings(tmp_path, EVENT_NAME="push", HEAD_REPOSITORY="", PR_NUMBER="")
    assert (s.outputs["read-only"], s.outputs["comment"]) == ("false", "false")
    assert not (tmp_path / "runner-temp/fxcache/fxcache/pr-number").exists()


def test_store_github_keys(tmp_path: Path) -> None:
    s = _settings(tmp_path, IN_STORE="github", IN_KEY_SUFFIX="llama")
    assert s.proc.returncode == 0, s.proc.stderr
    scope = subprocess.run(
        [FXCACHE, "key", "--python", TORCH_PYTHON], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert s.outputs["gha-path"] == str(tmp_path / "store" / scope)
    assert s.outputs["gha-restore-prefix"] == f"{scope}-llama-"
    assert s.outputs["gha-key"] == f"{scope}-llama-run4242.2"
    assert s.env["FXCACHE_GHA_KEY"] == s.outputs["gha-key"]
    assert s.env["FXCACHE_GHA_PATH"] == s.outputs["gha-path"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"IN_STORE": "s3"}, "input store must be one of: local github redis (got 's3')"),
        ({"IN_READ_ONLY": "yes"}, "input read-only must be one of: auto true false"),
        ({"IN_COMMENT": "always"}, "input comment must be one of: auto true false"),
        ({"IN_FAIL_ON": "fatal"}, "input fail-on must be one of: unsafe error no-gain never"),
        ({"IN_ON_UNSAFE": "ignore"}, "input on-unsafe must be one of: disable keep"),
        ({"IN_INVALIDATE_ON_UPGRADE": "1"}, "input invalidate-on-upgrade must be one of"),
        ({"IN_TIMEOUT_MINUTES": "0"}, "timeout-minutes must be a positive number"),
        ({"IN_TIMEOUT_MINUTES": "ten"}, "timeout-minutes must be a positive number"),
        ({"IN_REPORT_ID": "a/b"}, "input report-id may use only"),
        ({"IN_STORE": "redis"}, "store: redis needs the redis-url input"),
        ({"IN_DTYPES": "bf17"}, "--dtypes bf17: unknown dtype value 'bf17'"),
        ({"IN_WORKLOADS": "my model"}, "unknown workload 'my model'"),
    ],
)
def test_bad_inputs_fail_with_one_error_line(
    tmp_path: Path, overrides: dict[str, str], message: str
) -> None:
    s = _settings(tmp_path, **overrides)
    assert s.proc.returncode == 2
    lines = (s.proc.stdout + s.proc.stderr).splitlines()
    errors = [line for line in lines if line.startswith("::error::")]
    assert len(errors) == 1 and message in errors[0], lines
    assert s.outputs == {} and s.env == {}
    assert not (tmp_path / "store").exists(), "the store was touched before the inputs were checked"


def test_fractional_timeout_minutes(tmp_path: Path) -> None:
    assert _settings(tmp_path, IN_TIMEOUT_MINUTES="1.5").outputs["timeout-s"] == "90"


@pytest.mark.slow
def test_toolkit_install_is_isolated_and_reused(tmp_path: Path) -> None:
    """One venv per toolkit version (sources) and base interpreter, reused; torch not in it."""
    action = tmp_path / "action"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    shutil.copytree(ROOT / "ci_fxcache", action / "ci_fxcache", ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, action / name)
    tool_cache = tmp_path / "tool-cache"

    def install() -> tuple[str, str]:
        out = tmp_path / "output"
        out.write_text("")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "FXCACHE_"))}
        env.update(
            {
                "FXCACHE_ACTION_ROOT": str(action),
                "FXCACHE_BASE_PYTHON": TORCH_PYTHON,
                "RUNNER_TOOL_CACHE": str(tool_cache),
                "GITHUB_OUTPUT": str(out),
            }
        )
        proc = subprocess.run(
            ["bash", str(INSTALL)], env=env, capture_output=True, text=True, check=False
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return _read_file_vars(out)["fxcache"], proc.stdout

    exe, log = install()
    assert "installing toolkit" in log
    venv = Path(exe).parents[1]
    assert venv.parent == tool_cache / "fxcache-toolkit"
    version = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.startswith("fxcache ")
    # The toolkit's venv never sees the user's torch (and installs nothing into it).
    probe = subprocess.run([str(venv / "bin/python"), "-c", "import torch"], check=False,
                           capture_output=True)  # fmt: skip
    assert probe.returncode != 0

    again, log = install()
    assert again == exe and "reusing toolkit" in log

    # A new action version (changed sources) gets its own venv.
    init = action / "ci_fxcache" / "__init__.py"
    init.write_text(init.read_text() + "\n# next version\n")
    upgraded, log = install()
    assert upgraded != exe and "installing toolkit" in log
    assert re.fullmatch(r"[0-9a-f]{16}", Path(upgraded).parents[1].name)


VERIFY = ROOT / "scripts" / "verify.sh"


def _verify(tmp_path: Path, rc: int, write_results: bool, **inputs: str) -> tuple[
    subprocess.CompletedProcess[str], dict[str, str], list[str]
]:  # fmt: skip
    """Run verify.sh against a stand-in fxcache that records its argv and exits with `rc`."""
    argv_file, results, out = tmp_path / "argv", tmp_path / "results.json", tmp_path / "output"
    out.write_text("")
    stub = tmp_path / "fxcache"
    stub.write_text(
        "#!/bin/sh\n"
        f'printf "%s\\n" "$@" > "{argv_file}"\n'
        + (f"echo '{{}}' > '{results}'\n" if write_results else "")
        + f"exit {rc}\n"
    )
    stub.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "FXCACHE_", "IN_"))}
    env.update(
        {
            "GITHUB_OUTPUT": str(out),
            "FXCACHE": str(stub),
            "RESULTS": str(results),
            "TIMEOUT_S": "300",
            "VERIFY_DIR": str(tmp_path / "verify"),
            "STATE_FILE": "",
        }
    )
    for name in ("DEVICE", "DTYPES", "DYNAMIC", "MECHANISMS", "TRAINING", "WORKLOADS",
                 "MATRIX_FILE", "MIN_SPEEDUP"):  # fmt: skip
        env[f"IN_{name}"] = inputs.get(name.lower(), "")
    env["IN_FAIL_ON"] = inputs.get("fail_on", "unsafe")
    env["IN_REPORT_ID"] = inputs.get("report_id", "fxcache")
    proc = subprocess.run(["bash", str(VERIFY)], env=env, capture_output=True, text=True,
                          check=False)  # fmt: skip
    return proc, _read_file_vars(out), argv_file.read_text().splitlines()


def test_verify_passes_only_the_given_inputs(tmp_path: Path) -> None:
    proc, outputs, argv = _verify(tmp_path, 0, True, device="cpu", dtypes="float32,bfloat16",
                                  min_speedup="1.5", report_id="nightly")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert argv == [
        "verify", "--phase", "auto", "--json", str(tmp_path / "results.json"),
        "--timeout", "300", "--report-id", "nightly", "--cache-dir", str(tmp_path / "verify"),
        "--device", "cpu", "--dtypes", "float32,bfloat16", "--min-speedup", "1.5",
        "--fail-on", "unsafe",
    ]  # fmt: skip
    assert outputs == {"report-json": str(tmp_path / "results.json")}


def test_verify_failed_check_is_deferred_to_the_last_step(tmp_path: Path) -> None:
    proc, outputs, _ = _verify(tmp_path, 1, True)
    assert proc.returncode == 0
    assert outputs == {"rc": "1", "report-json": str(tmp_path / "results.json")}


@pytest.mark.parametrize(("rc", "write"), [(2, False), (1, False), (137, True)])
def test_verify_usage_errors_and_crashes_stop_the_action(
    tmp_path: Path, rc: int, write: bool
) -> None:
    proc, outputs, _ = _verify(tmp_path, rc, write)
    assert proc.returncode == rc
    assert outputs == {}


def _action_step(name: str) -> dict[str, object]:
    import yaml

    doc = yaml.safe_load((ROOT / "action.yml").read_text())
    steps = [s for s in doc["runs"]["steps"] if s.get("name") == name]
    assert len(steps) == 1, name
    return dict(steps[0])


def _run_step(step: dict[str, object], tmp_path: Path, env: dict[str, str]) -> tuple[
    subprocess.CompletedProcess[str], dict[str, str]
]:  # fmt: skip
    """Run a step's script the way the runner does (bash -e -o pipefail), env given by value."""
    genv = tmp_path / "env"
    genv.write_text("")
    assert set(env) <= set(step["env"]), "the test sets a variable the step does not declare"  # type: ignore[arg-type]
    full = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "FXCACHE_"))}
    full.update(env, GITHUB_ENV=str(genv))
    proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c",
                           str(step["run"])], env=full, capture_output=True, text=True,
                          check=False)  # fmt: skip
    return proc, _read_file_vars(genv)


def test_unsafe_declared_combination_disables_caches_for_later_steps(tmp_path: Path) -> None:
    step = _action_step("Disable caches for the rest of the job when unsafe")
    assert step["if"] == (
        "steps.report.outputs.unsafe-count != '' && steps.report.outputs.unsafe-count != '0'"
    )
    proc, exported = _run_step(step, tmp_path, {"UNSAFE_COUNT": "2", "ON_UNSAFE": "disable"})
    assert proc.returncode == 0, proc.stderr
    assert exported == {"TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}
    assert proc.stdout.startswith("::warning::fxcache: 2 declared combination(s) unsafe")


def test_on_unsafe_keep_leaves_caches_on(tmp_path: Path) -> None:
    step = _action_step("Disable caches for the rest of the job when unsafe")
    proc, exported = _run_step(step, tmp_path, {"UNSAFE_COUNT": "1", "ON_UNSAFE": "keep"})
    assert proc.returncode == 0 and exported == {}
    assert "caches stay enabled (on-unsafe: keep)" in proc.stdout


def test_fail_on_gate_fails_with_verify_exit_code(tmp_path: Path) -> None:
    step = _action_step("Fail on the verdicts (fail-on)")
    assert step["if"] == "steps.verify.outputs.rc != ''"
    proc, _ = _run_step(step, tmp_path, {"VERIFY_RC": "1", "FAIL_ON": "unsafe"})
    assert proc.returncode == 1
    assert "::error::" not in proc.stdout  # verify already said why, once


def test_store_redis_restores_with_the_redis_store(tmp_path: Path) -> None:
    s = _settings(tmp_path, IN_STORE="redis", IN_REDIS_URL="redis://127.0.0.1:6379/0")
    assert s.proc.returncode == 0, s.proc.stderr
    assert s.outputs["restore-store"] == "redis"
    assert "redis://" not in (tmp_path / "env").read_text(), "the Redis URL leaked into GITHUB_ENV"
