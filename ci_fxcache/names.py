"""Names: the rules for values that become file names, artifact names, markers or cache keys,
and the environment variables fxcache reads or hands on, with the one set of secret variables.

Each rule lives here once; the command line's options (`commands/options.py`) and the action's
input validation call them, so a bad value gets the same one-line error everywhere. A helper
(every stage starts processes: the fingerprint snippet in env/, the spare-overlay builder in
store/, the phases in verify/), so it depends on errors only.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from ci_fxcache.errors import UsageError

_REPORT_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
_KEY_SUFFIX = re.compile(r"[A-Za-z0-9._+-]{1,64}")


def check_report_id(value: str) -> str:
    """A report id: 1-64 letters, digits, '.', '_' or '-' (it names files and artifacts)."""
    if not _REPORT_ID.fullmatch(value) or value in (".", ".."):
        raise UsageError(f"invalid report id {value!r}: use 1-64 letters, digits, '.', '_' or '-'")
    return value


def check_key_suffix(value: str) -> str:
    """A cache-key suffix: 1-64 letters, digits, '.', '_', '+' or '-'.

    A comma breaks actions/cache's key lists and a '/' makes keys that
    `fxcache invalidate --github` cannot parse back into a scope.
    """
    if not _KEY_SUFFIX.fullmatch(value):
        raise UsageError(
            f"invalid key suffix {value!r}: use 1-64 letters, digits, '.', '_', '+' or '-' "
            "(no ',' or '/')"
        )
    return value


# -- Environment variables: the names fxcache reads or hands on, and the one secret set --------
# (STYLE.md point 5; the local store's and the S3 tier's knobs still live beside their code.)

PYTHON_ENV = "FXCACHE_PYTHON"  # the interpreter every command serves by default
SIGNING_ENV = "FXCACHE_SIGNING_KEY"
INPUTS_ENV = "FXCACHE_INPUTS"  # all of an action's inputs, as JSON, for one step
TOKEN_ENV = "FXCACHE_GITHUB_TOKEN"  # the comment step's token
REDIS_URL_ENV = "FXCACHE_REDIS_URL"
SETTINGS_ENV = "FXCACHE_ACTION_SETTINGS"  # where setup's settings are
# Fault injection for the tests, never set in production (store.save, store.tiered, the S3
# publish: see each for its values).
TEST_FAULT_ENV = "FXCACHE_TEST_FAULT"
# torch's structured trace: the job's (restore sets it, stats reads it); never verify's phases.
TORCH_TRACE_ENV = "TORCH_TRACE"
# The Actions cache service's variables: only the steps that talk to it get them.
CACHE_SERVICE_ENV = (
    "ACTIONS_RUNTIME_TOKEN",
    "ACTIONS_RESULTS_URL",
    "ACTIONS_CACHE_SERVICE_V2",
    "ACTIONS_CACHE_URL",
    "ACTIONS_RUNTIME_URL",
)
# OIDC: a token request turns into cloud credentials (aws-actions/configure-aws-credentials).
OIDC_ENV = ("ACTIONS_ID_TOKEN_REQUEST_TOKEN", "ACTIONS_ID_TOKEN_REQUEST_URL")
# Object-storage credentials in the job's environment (store s3 / object, as obstore reads
# them for S3, GCS and Azure): only the steps that move the scope (restore, save, invalidate)
# get them, and a run that may execute unreviewed code is refused when it holds one. Their
# settings that are no secret (AWS_REGION, AZURE_STORAGE_ACCOUNT_NAME, GOOGLE_BASE_URL, ...)
# reach every step.
OBJECT_STORE_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GOOGLE_SERVICE_ACCOUNT",
    "GOOGLE_SERVICE_ACCOUNT_PATH",
    "GOOGLE_SERVICE_ACCOUNT_KEY",
    "GOOGLE_BEARER_TOKEN",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_ACCESS_KEY",
    "AZURE_STORAGE_MASTER_KEY",
    "AZURE_STORAGE_CLIENT_SECRET",
    "AZURE_CLIENT_SECRET",
    "AZURE_STORAGE_SAS_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_STORAGE_TOKEN",
    "AZURE_FEDERATED_TOKEN_FILE",
    "AZURE_ENCRYPTION_KEY",
    "AZURE_FABRIC_SESSION_TOKEN",
)
# The runner's file commands: whoever can append to them sets the job's variables, PATH,
# outputs or the post step's state.
FILE_COMMAND_ENV = (
    "GITHUB_ENV",
    "GITHUB_OUTPUT",
    "GITHUB_PATH",
    "GITHUB_STATE",
    "GITHUB_STEP_SUMMARY",
)
# The one secret set: variables that carry a secret (or all of an action's inputs) anywhere in
# a job, by name and by prefix. No process that runs code fxcache did not write (the user's
# interpreter, a workload, a GPU tool) gets any of them.
SECRET_ENV = frozenset(
    {
        SIGNING_ENV,
        INPUTS_ENV,
        TOKEN_ENV,
        REDIS_URL_ENV,
        "GITHUB_TOKEN",
        "GH_TOKEN",
        *CACHE_SERVICE_ENV,
        *OIDC_ENV,
        *OBJECT_STORE_ENV,
    }
)
SECRET_PREFIXES = ("AWS_", "ACTIONS_", "INPUT_", "STATE_")


def is_secret(name: str) -> bool:
    """Does variable `name` carry a secret (SECRET_ENV, or an AWS_, ACTIONS_, INPUT_ or STATE_
    variable)?"""
    return name in SECRET_ENV or name.startswith(SECRET_PREFIXES)


def without_secrets(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) without any secret (is_secret) and without the runner's
    file commands: the environment of every process that runs code fxcache did not write (the
    user's interpreter, a workload, nvidia-smi) or that needs none of them."""
    source = os.environ if env is None else env
    return {k: v for k, v in source.items() if not is_secret(k) and k not in FILE_COMMAND_ENV}


# What one of the action's internal steps may hand on to its later steps through $GITHUB_ENV
# (steps.RUNS declares the names per step, js/fxcache.js applies only those): never a name that
# steers the runner, the toolkit's interpreter, node or the dynamic loader.
_NEVER_PASSED_PREFIXES = ("GITHUB_", "RUNNER_", "ACTIONS_", "LD_", "PYTHON", "NODE_")
_NEVER_PASSED = frozenset({"PATH", "BASH_ENV", "ENV"})


def check_passable(name: str) -> str:
    """`name`, when an internal step may hand it to the later ones; ValueError otherwise (a
    bug in steps.RUNS, caught by `fxcache action describe` before anything runs)."""
    if name in _NEVER_PASSED or name.startswith(_NEVER_PASSED_PREFIXES) or is_secret(name):
        raise ValueError(f"{name} can never be handed from one fxcache step to another")
    return name


# The dynamic loader's variables. The steps that hold the signing key and the store
# credentials but run no user code (the end-of-job save, the save sub-action) never get what
# would run a library inside them (LD_PRELOAD, LD_AUDIT, appended to $GITHUB_ENV by a step);
# the end-of-job save gets no LD_* variable of the job at all but LD_LIBRARY_PATH as the main
# step had it (the toolkit's interpreter may need it to start, as setup-python's does).
LOADER_PREFIX = "LD_"
LOADER_INJECTION_ENV = ("LD_PRELOAD", "LD_AUDIT")
LOADER_PATH_ENV = ("LD_LIBRARY_PATH",)
