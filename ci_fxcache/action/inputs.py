"""The inputs of the action and its sub-actions, declared once, and their validation.

The YAML passes all of an action's inputs as one JSON object (`FXCACHE_INPUTS:
${{ toJSON(inputs) }}`), so a name exists in two places only: the `inputs:` block of the
action file and the tables below (tests/test_action_inputs.py checks that they agree).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ci_fxcache import gha, names, userfiles
from ci_fxcache.errors import UsageError
from ci_fxcache.store import trust
from ci_fxcache.store.remote import factory, redis_cache
from ci_fxcache.verify import causes

Check = Callable[[str, str], Any]


def one_of(*choices: str) -> Check:
    """The value must be one of `choices`."""

    def check(name: str, value: str) -> str:
        if value not in choices:
            raise UsageError(f"input {name} must be one of: {' '.join(choices)} (got {value!r})")
        return value

    return check


def boolean(name: str, value: str) -> bool:
    """true or false."""
    return one_of("true", "false")(name, value) == "true"


def text(name: str, value: str) -> str:
    """Any text (checked by the command that takes it)."""
    return value


def optional_number(minimum: float, positive: bool) -> Check:
    """Empty (the command's default) or a number >= minimum (> minimum when `positive`)."""

    def check(name: str, value: str) -> float | None:
        if value == "":
            return None
        try:
            number = float(value)
        except ValueError:
            number = float("nan")
        if not (number > minimum if positive else number >= minimum):
            kind = "a positive number" if positive else f"a number >= {minimum:g}"
            raise UsageError(f"input {name} must be {kind} (got {value!r})")
        return number

    return check


def required_number(name: str, value: str) -> float:
    """A positive number."""
    number = optional_number(0, positive=True)(name, value)
    if number is None:
        raise UsageError(f"input {name} must be a positive number (got '')")
    return float(number)


def timeout_minutes(name: str, value: str) -> float:
    """A time limit in minutes: a positive number whose seconds a wait can take (verify's
    --timeout rule, userfiles.duration_seconds: `inf` and absurdly long limits are refused)."""
    minutes = required_number(name, value)
    try:
        userfiles.duration_seconds(repr(minutes * 60))
    except UsageError:
        raise UsageError(
            f"input {name} must be a finite number of minutes that a wait can take (got {value!r})"
        ) from None
    return minutes


def report_id(name: str, value: str) -> str:
    """A safe report id (names files, artifacts and the comment's marker)."""
    try:
        return names.check_report_id(value)
    except UsageError as exc:
        raise UsageError(f"input {name}: {exc}") from None


def key_suffix(name: str, value: str) -> str:
    """Empty, or a suffix safe inside an actions/cache key."""
    if value == "":
        return value
    try:
        return names.check_key_suffix(value)
    except UsageError as exc:
        raise UsageError(f"input {name}: {exc}") from None


def redis_url(name: str, value: str) -> str:
    """Empty (local only), or a Redis URL (masked in the log)."""
    if value:
        redis_cache.check_url(value, f"input {name}")
    gha.mask(value)
    return value


def s3_url(name: str, value: str) -> str:
    """Empty (local only), or s3://BUCKET/PREFIX."""
    if value:
        factory.check_s3_url(value, f"input {name}")
    return value


def object_url(name: str, value: str) -> str:
    """Empty (local only), s3://, gs:// or az://BUCKET/PREFIX, or file:///PATH."""
    if value:
        factory.check_object_url(value, f"input {name}")
    return value


def run_event(name: str, value: str) -> trust.RunEvent:
    """The runner's own record of the event (action.yml's default, filled in by the runner
    from its github context), checked against $GITHUB_EVENT_NAME."""
    try:
        return trust.RunEvent.from_input(value, os.environ.get("GITHUB_EVENT_NAME", ""))
    except UsageError as exc:
        raise UsageError(f"input {name}: {exc}") from None


def secret(name: str, value: str) -> str:
    """A secret: masked in the log, never written to a file."""
    gha.mask(value)
    return value


@dataclass(frozen=True)
class Input:
    """One input: its name in the action file and how its value is checked."""

    name: str
    check: Check


# The matrix inputs (each passed to verify as --<name>) and the axes they set.
MATRIX_AXES = {
    "device": "devices",
    "dtypes": "dtypes",
    "dynamic": "dynamic",
    "mechanisms": "mechanisms",
    "training": "training",
    "workloads": "workloads",
    "modes": "modes",
    "ranks": "ranks",
}

# Every action file has these two: the toolkit to use instead of installing one (read by
# js/fxcache.js for the install, never from the job's environment), and the runner's record
# of the event, which trust decides from.
COMMON = (Input("toolkit", text), Input("run-event", run_event))
MAIN = (
    Input("python", text),
    *(Input(name, text) for name in [*MATRIX_AXES, "matrix-file"]),
    Input("store", one_of("local", "github", "redis", "s3", "object")),
    Input("cache-root", text),
    Input("redis-url", redis_url),
    Input("s3-url", s3_url),
    Input("object-url", object_url),
    Input("redis-writers-run-code", boolean),
    Input("key-suffix", key_suffix),
    Input("read-only", one_of("auto", "true", "false")),
    Input("save", one_of("auto", "always", "never")),
    Input("invalidate-on-upgrade", boolean),
    Input("job-stats", boolean),
    Input("min-speedup", optional_number(0, positive=False)),
    Input("fail-on", one_of(*causes.FAIL_ON)),
    Input("on-unsafe", one_of("disable", "keep")),
    Input("comment", one_of("auto", "true", "false")),
    Input("report-id", report_id),
    Input("github-token", secret),
    Input("signing-key", secret),
    Input("timeout-minutes", timeout_minutes),
    *COMMON,
)
SAVE = (Input("python", text), Input("signing-key", secret), *COMMON)
INVALIDATE = (
    Input("python", text),
    Input("cache-root", text),
    Input("max-age", text),
    Input("max-size", text),
    Input("keep-latest", text),
    Input("older-torch-than", text),
    Input("target", one_of("local", "github", "redis", "s3", "object")),
    Input("redis-url", redis_url),
    Input("s3-url", s3_url),
    Input("object-url", object_url),
    Input("dry-run", boolean),
    Input("github-token", secret),
    *COMMON,
)
# Inputs that are secrets: masked, blank in the JSON of every step that does not need them
# (steps.RUNS says which does), never written to a file.
SECRETS = frozenset({"github-token", "signing-key", "redis-url"})
TABLES: dict[str, tuple[Input, ...]] = {
    "action.yml": MAIN,
    "save/action.yml": SAVE,
    "invalidate/action.yml": INVALIDATE,
}


def parse(table: tuple[Input, ...], raw: Mapping[str, Any]) -> dict[str, Any]:
    """Check every input of `table` in `raw` (the action's inputs as JSON); UsageError on the
    first bad one. A name missing from `raw` or not in `table` means the action file and the
    table disagree: that is a bug of the action, reported as such."""
    declared = {i.name for i in table}
    stray = sorted(set(raw) - declared)
    missing = sorted(declared - set(raw))
    if stray or missing:
        raise UsageError(
            "the action's inputs and ci_fxcache/action/inputs.py disagree "
            f"(undeclared: {stray}, not passed: {missing}): reinstall the action"
        )
    values: dict[str, Any] = {}
    for spec in table:
        value = raw[spec.name]
        values[spec.name] = spec.check(spec.name, "" if value is None else str(value).strip())
    return values


def from_env(*tables: tuple[Input, ...]) -> dict[str, Any]:
    """The inputs from $FXCACHE_INPUTS, checked against the one of `tables` whose names they
    carry (the first, when none matches: parse says what disagrees). The variable is removed
    from this process's environment once read, so no process it starts (the worker, the
    user's interpreter) inherits it."""
    text_ = os.environ.pop(names.INPUTS_ENV, None)
    if not text_:
        raise UsageError(
            f"${names.INPUTS_ENV} is not set: 'fxcache action' runs inside the action only"
        )
    try:
        raw = json.loads(text_)
    except ValueError as exc:
        raise UsageError(f"${names.INPUTS_ENV} is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise UsageError(f"${names.INPUTS_ENV} is not a JSON object")
    table = next((t for t in tables if {i.name for i in t} == set(raw)), tables[0])
    return parse(table, raw)
