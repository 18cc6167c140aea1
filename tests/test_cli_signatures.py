"""Every command is a typed function that the parser calls (`cli.main` unpacks the parsed
options into it): its keyword-only parameters are exactly the dests of its subcommand's
options, each annotated with the type argparse stores there. An option added without a
parameter, or a parameter without an option, fails here before any user sees a TypeError."""

from __future__ import annotations

import argparse
import inspect
import os
import typing
from pathlib import Path
from typing import Any

import pytest

from ci_fxcache import cli

NOT_OPTIONS = (argparse._HelpAction, argparse._VersionAction)


def _subparsers(monkeypatch: pytest.MonkeyPatch) -> dict[str, argparse.ArgumentParser]:
    # Some defaults come from FXCACHE_* variables when the parser is built: build it without.
    for name in [k for k in os.environ if k.startswith("FXCACHE_")]:
        monkeypatch.delenv(name)
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _options(sub: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        a
        for a in sub._actions
        if not isinstance(a, NOT_OPTIONS) and a.dest not in cli.DISPATCH_DESTS
    ]


def _stored_type(action: argparse.Action) -> Any:
    """The type argparse stores for the action, or None where a custom converter decides."""
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        return bool
    if action.choices is not None or action.type is None:
        item: Any = str
    elif isinstance(action.type, type):
        item = action.type
    else:
        return None
    if (
        action.nargs in ("+", "*")
        or isinstance(action.nargs, int)
        or isinstance(action, argparse._AppendAction)  # a repeatable option: its values, a list
    ):
        item = list[item]
    optional = action.default is None and not action.required
    return item | None if optional else item


def _problems(sub: argparse.ArgumentParser) -> list[str]:
    """How the subcommand's function disagrees with its parser's options (empty: it agrees)."""
    func = sub.get_default("func")
    if not callable(func):
        return ["register() sets no func"]
    # A command that takes one request (a frozen dataclass the parser builds): its fields are
    # held to the options as a function's parameters are.
    request = sub.get_default("request")
    target = func if request is None else request
    params = inspect.signature(target).parameters
    dests = {a.dest for a in _options(sub)} | (set(sub._defaults) - set(cli.DISPATCH_DESTS))
    problems = [f"parameter without an option: {p}" for p in sorted(set(params) - dests)]
    problems += [f"option without a parameter: {d}" for d in sorted(dests - set(params))]
    for param in params.values():
        if param.kind is not inspect.Parameter.KEYWORD_ONLY:
            problems.append(f"not keyword-only: {param.name}")
        # The parser holds every default, once: a second one here would never be used.
        if param.default is not inspect.Parameter.empty:
            problems.append(f"a default besides the parser's: {param.name}")
    hints = typing.get_type_hints(target)
    problems += [f"not annotated: {p}" for p in params if p not in hints]
    if request is not None and list(typing.get_type_hints(func)) != ["request", "return"]:
        problems.append("takes more than its request")
    if typing.get_type_hints(func).get("return") is not int:
        problems.append("does not return an int (the exit code)")
    for action in _options(sub):
        expected = _stored_type(action)
        if action.dest in hints and expected is not None and hints[action.dest] != expected:
            problems.append(f"{action.dest}: annotated {hints[action.dest]}, stored {expected}")
    return problems


def test_every_command_is_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    assert set(_subparsers(monkeypatch)) == set(cli.COMMANDS)


@pytest.mark.parametrize("name", cli.COMMANDS)
def test_the_command_function_takes_exactly_its_options(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _problems(_subparsers(monkeypatch)[name]) == []


def test_a_dest_shadows_no_builtin_and_no_name_of_its_module(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import builtins

    shadowing = [
        f"{name} {a.option_strings}: dest {a.dest!r}"
        for name, sub in _subparsers(monkeypatch).items()
        for a in _options(sub)
        if hasattr(builtins, a.dest) or hasattr(inspect.getmodule(sub.get_default("func")), a.dest)
    ]
    assert shadowing == [], "give the option a dest= that names what it holds"


def test_every_report_id_option_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    # Found by walking the parser, so a command that gains --report-id is checked too
    # (tests/test_cli.py runs the known ones end to end).
    accepting = set()
    for name, sub in _subparsers(monkeypatch).items():
        for action in _options(sub):
            if "--report-id" in action.option_strings:
                assert callable(action.type), name
                with pytest.raises(argparse.ArgumentTypeError, match=r"invalid report id '\.\./x'"):
                    action.type("../x")
                assert action.type("nightly.x_1") == "nightly.x_1"
                accepting.add(name)
    assert accepting >= {"verify", "plan", "merge", "comment"}


def _typed(*, root: Path | None, state_file: Path | None, as_json: bool) -> int:
    return 0


def _untyped(*, root, state_file, as_json):
    return 0


def _namespace(args: argparse.Namespace) -> int:
    return 0


def _with_default(*, root: Path | None, state_file: Path | None, as_json: bool = False) -> int:
    return 0


def _wrong_type(*, root: str, state_file: Path | None, as_json: bool) -> int:
    return 0


@pytest.mark.parametrize(
    ("func", "planted", "problem"),
    [
        (_typed, "--planted", "option without a parameter: planted"),
        (_untyped, None, "not annotated: root"),
        (_namespace, None, "parameter without an option: args"),
        (_with_default, None, "a default besides the parser's: as_json"),
        (_wrong_type, None, "root: annotated <class 'str'>"),
    ],
)
def test_the_check_sees_each_disagreement(
    monkeypatch: pytest.MonkeyPatch, func: Any, planted: str | None, problem: str
) -> None:
    # `save` takes --root, --state-file and --json; _typed agrees with it.
    sub = _subparsers(monkeypatch)["save"]
    sub.set_defaults(func=_typed)
    assert _problems(sub) == []
    sub.set_defaults(func=func)
    if planted:
        sub.add_argument(planted, action="store_true")
    assert any(p.startswith(problem) for p in _problems(sub)), _problems(sub)
