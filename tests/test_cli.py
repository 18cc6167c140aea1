"""The CLI frame: help, exit codes, one-line errors, annotations inside Actions."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from tests.conftest import TORCH_PYTHON, RunFxcache


def cli_commands() -> tuple[str, ...]:
    from ci_fxcache import cli

    return cli.COMMANDS


def test_help_lists_subcommands(run_fxcache: RunFxcache) -> None:
    proc = run_fxcache("--help")
    assert proc.returncode == 0
    assert "fingerprint" in proc.stdout and "key" in proc.stdout


def test_version(run_fxcache: RunFxcache) -> None:
    proc = run_fxcache("--version")
    assert proc.returncode == 0 and proc.stdout.startswith("fxcache ")


def test_no_subcommand_is_usage_error(run_fxcache: RunFxcache) -> None:
    assert run_fxcache().returncode == 2


def test_unknown_subcommand_one_line_exit_2(run_fxcache: RunFxcache) -> None:
    proc = run_fxcache("frobnicate")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("fxcache: error:") and "frobnicate" in lines[0]
    assert "--help" in lines[0]


def test_unknown_flag_exit_2(run_fxcache: RunFxcache) -> None:
    proc = run_fxcache("key", "--bogus")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        line for line in proc.stderr.strip().splitlines() if "--bogus" in line
    ]


def test_missing_interpreter_is_clear(run_fxcache: RunFxcache, tmp_path: Path) -> None:
    proc = run_fxcache("fingerprint", "--python", str(tmp_path / "nope" / "python"))
    assert proc.returncode == 2
    assert "no such file" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_interpreter_not_on_path(run_fxcache: RunFxcache) -> None:
    proc = run_fxcache("key", "--python", "python-does-not-exist-3.99")
    assert proc.returncode == 2 and "not found on PATH" in proc.stderr


def test_env_var_selects_interpreter(run_fxcache: RunFxcache, tmp_path: Path) -> None:
    proc = run_fxcache("key", env={"FXCACHE_PYTHON": str(tmp_path / "missing")})
    assert proc.returncode == 2 and str(tmp_path / "missing") in proc.stderr


def test_interpreter_without_torch(run_fxcache: RunFxcache, python_without_torch: str) -> None:
    proc = run_fxcache("fingerprint", "--python", python_without_torch)
    assert proc.returncode == 2
    assert "torch is not installed" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_unreadable_version_py(run_fxcache: RunFxcache, tmp_path: Path) -> None:
    # A torch package whose version.py cannot be read (a directory where the file should be).
    pkg = tmp_path / "site" / "torch"
    (pkg / "version.py").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    proc = run_fxcache(
        "fingerprint", "--python", TORCH_PYTHON, env={"PYTHONPATH": str(tmp_path / "site")}
    )
    assert proc.returncode == 2
    assert "cannot read" in proc.stderr and "version.py" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_corrupt_version_py(run_fxcache: RunFxcache, tmp_path: Path) -> None:
    pkg = tmp_path / "site" / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "version.py").write_text("__version__ = '2.13.0\n")  # unterminated string
    proc = run_fxcache("key", "--python", TORCH_PYTHON, env={"PYTHONPATH": str(tmp_path / "site")})
    assert proc.returncode == 2 and "cannot read" in proc.stderr


def test_debug_shows_traceback(run_fxcache: RunFxcache, tmp_path: Path) -> None:
    proc = run_fxcache("fingerprint", "--debug", "--python", str(tmp_path / "nope"))
    assert proc.returncode == 2 and "Traceback" in proc.stderr


def test_error_annotation_inside_actions(run_fxcache: RunFxcache, tmp_path: Path) -> None:
    proc = run_fxcache(
        "fingerprint", "--python", str(tmp_path / "nope"), env={"GITHUB_ACTIONS": "true"}
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("::error::fxcache: --python"), proc.stderr
    assert proc.stdout == ""


def test_python_m_entry_point_matches_console_script(run_fxcache: RunFxcache) -> None:
    import shutil
    import subprocess
    import sys

    script = Path(sys.executable).with_name("fxcache")
    exe = str(script) if script.exists() else shutil.which("fxcache")
    assert exe, "console script fxcache is not installed"
    direct = subprocess.run(
        [exe, "key", "--python", TORCH_PYTHON], capture_output=True, text=True, check=True
    )
    via_module = run_fxcache("key", "--python", TORCH_PYTHON)
    assert via_module.returncode == 0
    assert direct.stdout == via_module.stdout


@pytest.mark.parametrize(
    "argv",
    [
        ["verify", "--device", "cpu"],
        ["plan", "--runners", "a100"],
        ["merge", "shard.json", "-o", "out.json"],
        ["comment", "results.json"],
    ],
    ids=lambda argv: argv[0],
)
def test_every_report_id_option_is_checked(run_fxcache: RunFxcache, argv: list[str]) -> None:
    # --report-id names files, artifacts and the comment's marker: one rule, wherever accepted.
    proc = run_fxcache(*argv, "--report-id", "../x")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "invalid report id '../x'" in lines[0], proc.stderr


def test_restore_ends_without_interpreter_teardown_and_keeps_its_output_and_code(
    run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    """cli.QUICK_EXIT: `restore` leaves with os._exit once its output is flushed (an atexit
    hook planted through sitecustomize never runs); other commands tear down as usual."""
    import json

    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(
        "import atexit, os, sys\n"
        "def mark():\n"
        "    if sys.argv[0].endswith('__main__.py'):  # fxcache, not the snippets it runs\n"
        "        open(os.environ['MARK'], 'a').write('teardown')\n"
        "atexit.register(mark)\n"
    )
    runs = {
        "key": ("key", "--python", TORCH_PYTHON, "--json"),
        "restore": ("restore", "--python", TORCH_PYTHON, "--json", "--root",
                    str(tmp_path / "root"), "--state-file", str(tmp_path / "state.json")),
    }  # fmt: skip
    for name, args in runs.items():
        mark = tmp_path / f"{name}.mark"
        proc = run_fxcache(*args, env={"PYTHONPATH": str(hooks), "MARK": str(mark)})
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)  # complete, though restore skipped the teardown
        assert mark.exists() == (name not in ("restore",)), name
    failed = run_fxcache("restore", "--python", str(tmp_path / "nope" / "python"))
    assert failed.returncode == 2 and "no such file" in failed.stderr
    assert len(failed.stderr.strip().splitlines()) == 1


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    from ci_fxcache import cli

    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {"fxcache": parser, **sub.choices}


def _undocumented(parser: argparse.ArgumentParser) -> list[str]:
    """Options of `parser` whose help is missing or, for one that takes a value, says no
    default (nor that it is required). A flag is off unless given."""
    found = []
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        if isinstance(action, argparse._HelpAction | argparse._VersionAction):
            continue
        text = str(action.help or "")
        if not text or (action.nargs != 0 and not ("default" in text or "required" in text)):
            found.append("/".join(action.option_strings))
    return found


@pytest.mark.parametrize("command", ["fxcache", *cli_commands()])
def test_every_option_of_every_command_shows_its_default(command: str) -> None:
    parser = _subcommands()[command]
    assert _undocumented(parser) == [], command
    parser.format_help()  # every help text formats (no stray %)


def test_the_default_check_catches_an_option_without_one() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--timeout", type=float, default=600.0, help="per phase (seconds)")
    parser.add_argument("--compare", choices=("bitwise", "close"), default="bitwise")
    parser.add_argument("--fine", default=1, help="a value (default: 1)")
    parser.add_argument("--flag", action="store_true", help="a flag")
    assert _undocumented(parser) == ["--timeout", "--compare"]


def test_invalidate_help_names_every_tier(run_fxcache: RunFxcache) -> None:
    summary = run_fxcache("--help").stdout
    tiers = ("--github", "--redis", "--s3")
    line = " ".join(summary.split()).split("invalidate", 1)[1].split(" report ")[0]
    assert all(t in line for t in tiers), line
    own = run_fxcache("invalidate", "--help").stdout
    assert all(t in own for t in tiers)


@pytest.mark.parametrize("typo", ["actoin", "verfy", "zzz"])
def test_a_mistyped_command_never_suggests_a_hidden_one(run_fxcache: RunFxcache, typo: str) -> None:
    proc = run_fxcache(typo)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "'action'" not in line and "'verify'" in line and "'comment'" in line, line
    assert ("did you mean 'verify'?" in line) == (typo == "verfy"), line
    # the hidden command itself still runs
    assert run_fxcache("action", "--help").returncode == 0
