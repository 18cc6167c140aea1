"""`fxcache restore`: select the scope for this fingerprint and hand the job its cache dirs."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ci_fxcache import gha
from ci_fxcache.commands import options
from ci_fxcache.env.pending_fingerprint import Pending
from ci_fxcache.errors import UsageError
from ci_fxcache.store.overlay import STRATEGIES as OVERLAY_STRATEGIES

if TYPE_CHECKING:
    from ci_fxcache.store.remote.factory import StoreChoice, StorePolicy
    from ci_fxcache.store.remote.tier import RemoteTier
    from ci_fxcache.store.state_file import Restored, RestoreState

OVERLAY_ENV = "FXCACHE_OVERLAY"


def register(sub: Any, parent: argparse.ArgumentParser) -> None:
    """Add the `restore` subcommand."""
    parser = sub.add_parser(
        "restore",
        parents=[parent],
        help="restore the cache scope of this environment and export its directories",
        description="Select the scope for the current fingerprint, check its integrity, and "
        "export TORCHINDUCTOR_CACHE_DIR / TRITON_CACHE_DIR ($GITHUB_ENV inside Actions, "
        "'export' lines or --json elsewhere).",
    )
    options.python_option(parser)
    options.salt_option(parser)
    options.root_option(parser)
    parser.add_argument(
        "--read-only",
        action="store_true",
        help="use a private copy-on-write overlay; nothing written reaches the store "
        "(automatic for untrusted events inside Actions)",
    )
    parser.add_argument(
        "--no-invalidate-on-upgrade",
        dest="invalidate_on_upgrade",
        action="store_false",
        help="keep scopes of other torch / CUDA / HIP / triton / Python versions",
    )
    parser.add_argument(
        "--verify",
        choices=("fast", "full"),
        default=None,
        help="integrity check: sizes and mtimes (fast, the default) or every sha256 (full, "
        "always when FXCACHE_SIGNING_KEY is set)",
    )
    parser.add_argument(
        "--overlay",
        dest="overlay_strategy",
        choices=OVERLAY_STRATEGIES,
        default=None,
        help="how overlays share files (env FXCACHE_OVERLAY; default auto)",
    )
    parser.add_argument(
        "--json", dest="as_json", action="store_true", help="print the state object as JSON"
    )
    options.state_file_option(parser)
    _store_options(parser)
    parser.set_defaults(func=run)


def _store_options(parser: argparse.ArgumentParser) -> None:
    """Which store stands behind the local one, and what this run may do with it."""
    parser.add_argument(
        "--store",
        choices=("local", "redis", "s3", "github", "object"),
        default="local",
        help="local (default): the store on this runner's disk; redis: also torch's Redis "
        "remote cache; s3: a bucket behind the local store (--s3-url); object: an S3, GCS "
        "or Azure bucket or a shared directory, chosen by its URL's scheme (--object-url); "
        "github: the repository's Actions cache behind it (inside a JavaScript action's step)",
    )
    parser.add_argument(
        "--key-suffix",
        default="",
        help="--store github: a suffix of this job's entry keys, so that jobs of one scope "
        "with different caches (several models) keep separate entries (default: none)",
    )
    options.redis_url_option(parser, "Redis URL")
    options.s3_url_option(parser)
    parser.add_argument(
        "--object-url",
        default=None,
        metavar="URL",
        help="--store object: s3://, gs:// or az://BUCKET/PREFIX, or file:///PATH (a shared "
        "mount; env FXCACHE_OBJECT_URL; "
        "default: none); "
        "credentials come from that service's variables (docs/store.md)",
    )
    parser.add_argument(
        "--remote-read-only",
        action="store_true",
        help="read the remote tier (--store s3), never write it: no last-used marker, and "
        "'fxcache save' commits locally only, into a namespace of the store root that no run "
        "writing the remote reads (for runs that must not write what others read)",
    )
    parser.add_argument(
        "--no-job-trace",
        dest="job_trace",
        action="store_false",
        help="do not set TORCH_TRACE for the job's later steps (no figures in 'fxcache stats'; "
        "a TORCH_TRACE the job set itself is read either way)",
    )
    parser.add_argument(
        "--redis-writers-run-code",
        action="store_true",
        help="with FXCACHE_SIGNING_KEY, still use store redis: torch unpickles its entries, "
        "unsigned, so whoever can write that Redis runs code in this job",
    )


def _overlay_strategy(value: str | None) -> str:
    if value is not None:
        return value
    env = os.environ.get(OVERLAY_ENV) or "auto"
    if env not in OVERLAY_STRATEGIES:
        raise UsageError(f"{OVERLAY_ENV}={env!r}: use one of {', '.join(OVERLAY_STRATEGIES)}")
    return env


def run(
    *,
    python: str,
    salt: str | None,
    root: Path | None,
    read_only: bool,
    invalidate_on_upgrade: bool,
    verify: str | None,
    overlay_strategy: str | None,
    as_json: bool,
    state_file: Path | None,
    store: str,
    redis_url: str | None,
    s3_url: str | None,
    object_url: str | None,
    redis_writers_run_code: bool,
    remote_read_only: bool,
    key_suffix: str,
    job_trace: bool,
) -> int:
    """`fxcache restore`: the store decided from the flags (factory.choose, as the action's
    setup decides it), the signing key from $FXCACHE_SIGNING_KEY; then `restore`."""
    taking = Pending(python, salt)  # first: the job's interpreter reports while we import
    from ci_fxcache.store import trust

    reason = "--read-only" if read_only else trust.untrusted_reason()
    policy = store_policy_of(store=store, s3_url=s3_url, object_url=object_url, redis_url=redis_url,
                             key_suffix=key_suffix, read_only_reason=reason,
                             remote_read_only=remote_read_only)  # fmt: skip
    for note in policy.notes:
        gha.say("notice", note)
    restore(
        taking=taking, root=root, read_only_reason=reason,
        invalidate_on_upgrade=invalidate_on_upgrade, verify=verify,
        overlay_strategy=overlay_strategy, as_json=as_json, state_file=state_file,
        choice=policy.choice, redis_url=policy.redis_url,
        redis_writers_run_code=redis_writers_run_code,
        signing_key=trust.signing_key(), nonce=None, job_trace=job_trace,
    )  # fmt: skip
    return 0


def store_policy_of(
    *,
    store: str,
    s3_url: str | None,
    redis_url: str | None,
    key_suffix: str,
    read_only_reason: str | None,
    remote_read_only: bool,
    object_url: str | None = None,
) -> StorePolicy:
    """The store policy (factory.store_policy, as the action's setup decides it) from the
    flags."""
    from ci_fxcache.store.remote.factory import store_policy

    return store_policy(store, s3_url=s3_url, redis_url=redis_url, key_suffix=key_suffix,
                        read_only=read_only_reason is not None,
                        may_write_remote=not remote_read_only, object_url=object_url)  # fmt: skip


def restore(
    *,
    taking: Pending,
    root: Path | None,
    read_only_reason: str | None,
    invalidate_on_upgrade: bool,
    verify: str | None,
    overlay_strategy: str | None,
    as_json: bool,
    state_file: Path | None,
    choice: StoreChoice,
    redis_url: str | None,
    redis_writers_run_code: bool,
    signing_key: str | None,
    nonce: str | None,
    job_trace: bool,
) -> RestoreState:
    """Restore (read-only with a reason), write the state file (MAC'd with `signing_key`,
    carrying the caller's `nonce`), export the job's environment; the state. The fingerprint
    is `taking`'s (started by the caller, so the interpreter reports while this imports)."""
    # Made first: a remote tier starts what its first request needs (the S3 client) while
    # the rest is imported and the job's interpreter reports its versions (a restore is on
    # every job's critical path: docs/store.md, Performance).
    tier = _first_tier(choice, signing_key)
    from ci_fxcache.env import scopekey, torch_support
    from ci_fxcache.store import state_file as states
    from ci_fxcache.store import tiered
    from ci_fxcache.store.layout import Layout, resolve_root, trust_root

    if state_file is not None:
        states.check_target(state_file)
    tiered.check_env()
    overlay_strategy = _overlay_strategy(overlay_strategy)
    redis_url = _redis_url(choice.kind, redis_url, signing_key, redis_writers_run_code)
    fp = taking.result()
    torch_support.announce_newer(fp.torch_version)
    key = scopekey.scope_key(fp)
    # A run that commits but may not write the remote keeps to its own namespace of the root.
    writes = choice.may_write_remote or read_only_reason is not None
    layout = Layout(trust_root(resolve_root(root), may_write_remote=writes))
    restore_options = tiered.RestoreOptions(
        read_only=read_only_reason is not None, read_only_reason=read_only_reason,
        invalidate_on_upgrade=invalidate_on_upgrade,
        full_verify=tiered.full_verification(verify, signing_key),
        overlay_strategy=overlay_strategy, signing_key=signing_key,
    )  # fmt: skip
    restored, remote = tiered.restore(layout, key, fp, restore_options, choice, tier)
    state_path = state_file or states.new_state_file()
    env = _job_env(restored, state_path, job_trace)
    redis = None if redis_url is None else _redis(redis_url, env)
    kind = "redis" if redis is not None else (choice.kind if remote else "local")
    state = states.RestoreState.of(
        restored, store=kind, remote=remote, redis=redis, state_file=state_path, nonce=nonce
    )
    states.write_state(state, signing_key)
    _publish(state, env, as_json)
    return state


def _first_tier(choice: StoreChoice, signing_key: str | None) -> RemoteTier | None:
    """The remote tier (factory.tier_for), made before anything is restored, so that a
    malformed setting is a usage error first. The signing key is masked in the log first."""
    from ci_fxcache.store.remote.factory import tier_for

    if signing_key:
        gha.mask(signing_key)
    return tier_for(choice)


def _redis_url(
    kind: str, redis_url: str | None, signing_key: str | None, writers_run_code: bool
) -> str | None:
    """Store redis: the URL (UsageError when unset or refused with a signing key)."""
    from ci_fxcache.store.remote import redis_cache

    if kind != "redis":
        return None
    url = redis_cache.resolve_url(redis_url)
    redis_cache.check_signed_use(signing_key, writers_run_code)
    return url


def _job_env(restored: Restored, state_path: Path, job_trace: bool) -> dict[str, str]:
    """What the job's later steps get: the cache dirs, FXCACHE_VERIFY_DIR /
    FXCACHE_STATE_FILE (verify's defaults for --cache-dir and --cache-state, so that
    `restore; verify; save` checks and keeps the scope's own references), and the job's own
    trace for `fxcache stats`."""
    from ci_fxcache.jobstats.trace import job_env
    from ci_fxcache.store import state_file as states
    from ci_fxcache.store.layout import VERIFY_DIR_ENV

    return {
        "TORCHINDUCTOR_CACHE_DIR": str(restored.inductor_dir),
        "TRITON_CACHE_DIR": str(restored.triton_dir),
        VERIFY_DIR_ENV: str(restored.verify_dir),
        states.STATE_FILE_ENV: str(state_path),
        **job_env(state_path, job_trace),
    }


def _redis(redis_url: str, env: dict[str, str]) -> dict[str, Any]:
    """torch's Redis remote cache beside the store: the state's `redis` object; the
    variables that switch it on added to `env` (none when Redis does not answer: one
    warning)."""
    from ci_fxcache.store.remote import redis_cache

    problem = redis_cache.probe(redis_url)
    redacted = redis_cache.redact(redis_url)
    if problem is None:
        env.update(redis_cache.job_env(redis_url))
        return {"url": redacted, "reachable": True}
    gha.warn(f"Redis at {redacted} unreachable ({problem}); continuing with the local store only")
    return {"url": redacted, "reachable": False, "error": problem}


def _where(state: RestoreState) -> str:
    """What the job got, as the summary line says it: in place, an overlay (which kind, and
    why for a trusted job), or a cold fallback."""
    if state.mode == "in-place":
        return "in place"
    if state.mode == "cold-fallback":
        return "cold fallback"
    why = state.overlay_reason
    return f"{state.mode} overlay; {why}" if why else f"{state.mode} overlay"


def _publish(state: RestoreState, env: dict[str, str], as_json: bool) -> None:
    exported = all(gha.export_env(name, value) for name, value in env.items())
    outputs = {
        "cache-key": state.scope_key,
        "cache-hit": "true" if state.hit else "false",
        "scope-dir": str(state.scope_dir),
        "verify-dir": str(state.verify_dir),
        "state-file": str(state.state_file),
    }
    for name, value in outputs.items():
        gha.set_output(name, value)
    summary = (
        f"fxcache: {'hit' if state.hit else 'miss'} {state.scope_key} "
        f"({state.files} files, {_where(state)}"
        + (f"; read-only: {state.read_only_reason}" if state.read_only else "")
        + ")"
    )
    if as_json:
        print(json.dumps(state.to_json(), indent=2))
        print(summary, file=sys.stderr)
    elif exported:
        print(summary)
    else:
        import shlex

        for name, value in env.items():
            print(f"export {name}={shlex.quote(value)}")
        print(summary, file=sys.stderr)
