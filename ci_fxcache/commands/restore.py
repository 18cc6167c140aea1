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
from ci_fxcache.store import overlay

if TYPE_CHECKING:
    from ci_fxcache.env.fingerprint import Fingerprint
    from ci_fxcache.store.layout import Layout

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
        choices=overlay.STRATEGIES,
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
        choices=("local", "redis", "s3", "github"),
        default="local",
        help="local (default): the store on this runner's disk; redis: also torch's Redis "
        "remote cache; s3: a bucket behind the local store (--s3-url); github: the "
        "repository's Actions cache behind it (inside a JavaScript action's step)",
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


def _cold_fallback(key: str, root: Path, error: str, fp: Fingerprint) -> dict[str, Any]:
    import tempfile  # here, not at the top: restore starts on every job's critical path

    from ci_fxcache.store.restore import STATE_SCHEMA

    # Under $RUNNER_TEMP inside Actions: the runner empties it after every job.
    base = Path(tempfile.mkdtemp(prefix="fxcache-cold-", dir=os.environ.get("RUNNER_TEMP")))
    gha.warn(f"local store unusable ({error}); continuing cold in {base}")
    return {
        "schema": STATE_SCHEMA,
        "store": "local",
        "root": str(root),
        "scope_key": key,
        "hit": False,
        "read_only": True,
        "read_only_reason": f"store unusable: {error}",
        "mode": "cold-fallback",
        "scope_dir": str(root / key),
        "inductor_dir": str(base / "inductor"),
        "triton_dir": str(base / "triton"),
        "verify_dir": str(base / "verify"),
        "overlay_dir": str(base),
        "spare": False,
        "files": 0,
        "bytes": 0,
        "invalidated": [],
        "set_aside": None,
        "quarantined": [],
        "lease": None,
        "fingerprint": fp.to_dict(),
    }


def _overlay_strategy(value: str | None) -> str:
    if value is not None:
        return value
    env = os.environ.get(OVERLAY_ENV) or "auto"
    if env not in overlay.STRATEGIES:
        raise UsageError(f"{OVERLAY_ENV}={env!r}: use one of {', '.join(overlay.STRATEGIES)}")
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
    redis_writers_run_code: bool,
    remote_read_only: bool,
    key_suffix: str,
    job_trace: bool,
) -> int:
    """Restore, write the state file, export the environment."""
    taking = Pending(python, salt)
    from ci_fxcache.store import trust
    from ci_fxcache.store.remote.factory import StoreChoice, tier_for

    reason = "--read-only" if read_only else trust.untrusted_reason()
    writes = reason is None and not remote_read_only
    choice = StoreChoice(kind=store, url=s3_url, key_suffix=key_suffix, may_write_remote=writes)
    # Made first: a remote tier starts what its first request needs (the S3 client) while
    # the rest is imported and the job's interpreter reports its versions. The GitHub tier
    # needs the scope key (its entries' keys): made once the key is known.
    tier = tier_for(choice) if choice.kind != "github" else None
    # Imported while the job's interpreter reports its versions: a restore is on every job's
    # critical path (docs/store.md, Performance).
    from ci_fxcache.env import scopekey, torch_support
    from ci_fxcache.store import restore as store_restore
    from ci_fxcache.store import scopes
    from ci_fxcache.store import state_file as states
    from ci_fxcache.store.layout import Layout, resolve_root, trust_root

    if state_file is not None:
        states.check_target(state_file)
    scopes.check_env()
    strategy = _overlay_strategy(overlay_strategy)
    key_for_signing = trust.signing_key()
    redis_url = _redis_url(store, redis_url, key_for_signing, redis_writers_run_code)
    fp = taking.result()
    torch_support.announce_newer(fp.torch_version)
    key = scopekey.scope_key(fp)
    store_root = trust_root(resolve_root(root), may_write_remote=not remote_read_only)
    restore_options = store_restore.Options(
        read_only=reason is not None, read_only_reason=reason,
        invalidate_on_upgrade=invalidate_on_upgrade,
        full_verify=store_restore.full_verification(verify, key_for_signing),
        overlay_strategy=strategy, signing_key=key_for_signing,
    )  # fmt: skip
    state = _restore(Layout(store_root), key, fp, restore_options, choice, tier)
    if isinstance(state.get("remote"), dict):
        state["remote"]["read_only"] = remote_read_only
    _hand_out(state, state_file, redis_url, key_for_signing, as_json, job_trace)
    return 0


def _hand_out(
    state: dict[str, Any],
    state_file: Path | None,
    redis_url: str | None,
    signing_key: str | None,
    as_json: bool,
    job_trace: bool,
) -> None:
    """Write the state file (MAC'd with the signing key) and export the job's environment,
    with torch's Redis remote cache when it answers."""
    from ci_fxcache.jobstats.trace import job_env
    from ci_fxcache.store import state_file as states

    state_path = state_file or states.new_state_file()
    env = _job_env(state, state_path)
    env.update(job_env(state_path, job_trace))  # the job's own compiles, for `fxcache stats`
    state["redis"] = None
    if redis_url is not None:
        env.update(_redis(state, redis_url))
    state["state_file"] = str(state_path)
    states.write_state(state_path, state, signing_key)
    _publish(state, env, as_json)


def _restore(
    layout: Layout, key: str, fp: Fingerprint, options: Any, choice: Any, tier: Any
) -> dict[str, Any]:
    """Tier 2 first (a scope it has becomes a local one), then the local restore; a local
    store that cannot be used is a cold fallback. The state, its cache dirs made."""
    from ci_fxcache.store import restore as store_restore
    from ci_fxcache.store.remote.transfer import fetch_scope

    remote_info = None
    try:
        if choice.kind == "github":
            tier, remote_info = _github_tier(choice, key)
        if tier is not None:
            remote_info = fetch_scope(layout, key, tier, signing_key=options.signing_key)
        if remote_info is not None and choice.kind == "github":
            remote_info["key_suffix"] = choice.key_suffix
        state = store_restore.restore(layout, key, fp, options)
    except PermissionError as exc:
        # Not tampering: another user's files in a shared store. Nothing is quarantined.
        why = f"permission denied: {exc.filename or exc}; the scope is left as it is"
        state = _cold_fallback(key, layout.root, why, fp)
    except (OSError, TimeoutError) as exc:
        state = _cold_fallback(key, layout.root, str(exc), fp)
    if remote_info is not None:
        state["store"], state["remote"] = choice.kind, remote_info
    for name in ("inductor_dir", "triton_dir", "verify_dir"):
        Path(state[name]).mkdir(parents=True, exist_ok=True)
    return state


def _redis_url(
    store: str, redis_url: str | None, signing_key: str | None, writers_run_code: bool
) -> str | None:
    """Store redis: the URL (UsageError when unset or refused with a signing key)."""
    from ci_fxcache.store.remote import redis_cache

    if store != "redis":
        return None
    url = redis_cache.resolve_url(redis_url)
    redis_cache.check_signed_use(signing_key, writers_run_code)
    return url


def _job_env(state: dict[str, Any], state_path: Path) -> dict[str, str]:
    """What the job's later steps get: the cache dirs, and FXCACHE_VERIFY_DIR /
    FXCACHE_STATE_FILE, verify's defaults for --cache-dir and --cache-state, so that
    `restore; verify; save` checks and keeps the scope's own references."""
    from ci_fxcache.store import state_file as states
    from ci_fxcache.store.layout import VERIFY_DIR_ENV

    return {
        "TORCHINDUCTOR_CACHE_DIR": state["inductor_dir"],
        "TRITON_CACHE_DIR": state["triton_dir"],
        VERIFY_DIR_ENV: state["verify_dir"],
        states.STATE_FILE_ENV: str(state_path),
    }


def _redis(state: dict[str, Any], redis_url: str) -> dict[str, str]:
    """torch's Redis remote cache beside the store: the state's `redis` object, and the
    variables that switch it on (none when Redis does not answer: one warning)."""
    from ci_fxcache.store.remote import redis_cache

    problem = redis_cache.probe(redis_url)
    state["store"] = "redis"
    state["redis"] = {"url": redis_cache.redact(redis_url), "reachable": problem is None}
    if problem is None:
        return redis_cache.job_env(redis_url)
    state["redis"]["error"] = problem
    gha.warn(
        f"Redis at {redis_cache.redact(redis_url)} unreachable ({problem}); "
        "continuing with the local store only"
    )
    return {}


def _github_tier(choice: Any, key: str) -> tuple[Any, dict[str, Any] | None]:
    """The GitHub tier of scope `key`, or None and the state's `remote` object saying why
    not (no Actions cache service in this step: one warning, local only)."""
    from ci_fxcache.store.remote.factory import tier_for
    from ci_fxcache.store.remote.tier import RemoteUnavailable

    try:
        return tier_for(choice, key), None
    except RemoteUnavailable as exc:
        gha.warn(f"restoring from the GitHub cache failed ({exc}); continuing with the local "
                 "store only")  # fmt: skip
        return None, {"store": "github", "url": "the GitHub cache", "fetched": False,
                      "error": str(exc)}  # fmt: skip


def _where(state: dict[str, Any]) -> str:
    """What the job got, as the summary line says it: in place, an overlay (which kind, and
    why for a trusted job), or a cold fallback."""
    mode = state["mode"]
    if mode == "in-place":
        return "in place"
    if mode == "cold-fallback":
        return "cold fallback"
    why = state.get("overlay_reason")
    return f"{mode} overlay; {why}" if why else f"{mode} overlay"


def _publish(state: dict[str, Any], env: dict[str, str], as_json: bool) -> None:
    exported = all(gha.export_env(name, value) for name, value in env.items())
    outputs = {
        "cache-key": state["scope_key"],
        "cache-hit": "true" if state["hit"] else "false",
        "scope-dir": state["scope_dir"],
        "verify-dir": state["verify_dir"],
        "state-file": state["state_file"],
    }
    for name, value in outputs.items():
        gha.set_output(name, value)
    where = _where(state)
    summary = (
        f"fxcache: {'hit' if state['hit'] else 'miss'} {state['scope_key']} "
        f"({state['files']} files, {where}"
        + (f"; read-only: {state['read_only_reason']}" if state["read_only"] else "")
        + ")"
    )
    if as_json:
        print(json.dumps(state, indent=2))
        print(summary, file=sys.stderr)
    elif exported:
        print(summary)
    else:
        import shlex

        for name, value in env.items():
            print(f"export {name}={shlex.quote(value)}")
        print(summary, file=sys.stderr)
