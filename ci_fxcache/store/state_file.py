"""Restore's state: the one type (`RestoreState`) that `fxcache restore` writes and that save,
verify, `fxcache stats` and the action read back, with its one writer (`write_state`) and its
one reader (`read_state`, or `parse` for a document already loaded).

The state file lies in a directory the job can write ($RUNNER_TEMP), so it is data, never
instructions: `read_state` takes only a file whose scope key is a valid key of the store
root it names, whose lease and overlay paths lie inside that root, and, when the reader has
the signing key, whose MAC (keyed with it; restore writes it) is right. An action job also
binds it to its own setup (`nonce`, a parameter of the restore, checked by the action's save).

The schema is versioned (`SCHEMA`); a file of any other version is refused with one line
(restore again). Version 1 is what every fxcache release so far has written.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from ci_fxcache import gha
from ci_fxcache.errors import UsageError

STATE_FILE_ENV = "FXCACHE_STATE_FILE"
SCHEMA = "fxcache-cache-state/1"
_MAC_CONTEXT = b"fxcache-restore-state/1\0"
_STRINGS = ("scope_key", "root", "mode", "scope_dir", "inductor_dir", "triton_dir", "verify_dir")
_OPTIONAL_STRINGS = ("lease", "overlay_dir", "overlay_reason", "read_only_reason", "nonce", "mac")
_COUNTS = ("files", "bytes")


def _job_state_file() -> Path | None:
    """Inside Actions, the job's own state file (RUNNER_TEMP belongs to one job); else None."""
    runner_temp = os.environ.get("RUNNER_TEMP")
    if runner_temp and gha.in_actions():
        return Path(runner_temp) / "fxcache-restore-state.json"
    return None


def new_state_file() -> Path:
    """Where a restore without --state-file writes its state: inside Actions
    `$RUNNER_TEMP/fxcache-restore-state.json` (RUNNER_TEMP belongs to one job), elsewhere a new
    file per restore, so unrelated shells and jobs never share one; restore exports its path
    as FXCACHE_STATE_FILE."""
    job_file = _job_state_file()
    if job_file is not None:
        return job_file
    fd, path = tempfile.mkstemp(prefix="fxcache-restore-state-", suffix=".json")
    os.close(fd)
    return Path(path)


def saved_state_file(value: Path | None) -> Path:
    """The state file `save` reads: --state-file, else FXCACHE_STATE_FILE (exported by restore),
    else the job's default inside Actions; UsageError when none is known."""
    if value is not None:
        return value
    env = os.environ.get(STATE_FILE_ENV)
    if env:
        return Path(env)
    job_file = _job_state_file()
    if job_file is not None:
        return job_file
    raise UsageError(
        f"no restore state: pass --state-file, or set {STATE_FILE_ENV} as 'fxcache restore' "
        "exported it (run 'fxcache restore' first)"
    )


def check_target(path: Path) -> None:
    """Restore's --state-file must name a file (new or old), never a directory."""
    if path.is_dir():
        raise UsageError(
            f"--state-file {path} is a directory: name the file restore should write "
            "(or leave --state-file out)"
        )


Json = dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class Restored:
    """What the local restore handed out (store.restore, or a cold fallback): the scope, the
    job's cache dirs, and what the restore found on the way."""

    root: Path
    scope_key: str
    hit: bool
    read_only: bool
    read_only_reason: str | None
    mode: str  # in-place, an overlay strategy (copy, hardlink, ...), or cold-fallback
    scope_dir: Path
    inductor_dir: Path
    triton_dir: Path
    verify_dir: Path
    overlay_dir: Path | None
    files: int = 0
    bytes: int = 0
    overlay_reason: str | None = None
    spare: bool = False
    verify_mode: str | None = None
    signed: bool = False
    signature_checked: bool = False
    invalidated: tuple[Json, ...] = ()
    set_aside: Json | None = None
    quarantined: tuple[Json, ...] = ()
    lease: Path | None = None
    fingerprint: Json | None = None
    restored_at: str | None = None
    pid: int | None = None

    @classmethod
    def cold(cls, key: str, root: Path, base: Path, why: str, fingerprint: Json | None) -> Restored:
        """A store that cannot be used: fresh cache dirs under `base`, nothing to save."""
        return cls(
            root=root, scope_key=key, hit=False, read_only=True,
            read_only_reason=f"store unusable: {why}", mode="cold-fallback",
            scope_dir=root / key, inductor_dir=base / "inductor", triton_dir=base / "triton",
            verify_dir=base / "verify", overlay_dir=base, fingerprint=fingerprint,
        )  # fmt: skip

    @property
    def torch_path(self) -> str | None:
        """The torch installation the restore served (from its fingerprint)."""
        value = (self.fingerprint or {}).get("torch_path")
        return value if isinstance(value, str) and value else None


@dataclass(frozen=True)
class RemoteUse:
    """The remote tier a restore used: its store, where, the GitHub key suffix, and whether
    the run only reads it (restore --remote-read-only)."""

    store: str
    url: str | None
    key_suffix: str
    read_only: bool


@dataclass(frozen=True, kw_only=True)
class RestoreState(Restored):
    """The restore's state, complete: the local restore, the remote tier's report, torch's
    Redis cache beside them, where it is kept and the caller's nonce (the action's setup)."""

    store: str = "local"
    remote: Json | None = None  # the remote tier's report (store.remote.transfer.fetch_scope)
    redis: Json | None = None
    state_file: Path | None = None
    nonce: str | None = None

    @classmethod
    def of(cls, restored: Restored, **rest: Any) -> RestoreState:
        """The state of `restored` with everything else (`store`, `remote`, ...) given."""
        local = {f.name: getattr(restored, f.name) for f in fields(Restored)}
        return cls(**local, **rest)

    @property
    def remote_use(self) -> RemoteUse | None:
        """The remote tier this restore used, or None (local only, or no report)."""
        remote = self.remote
        if not isinstance(remote, dict) or not isinstance(remote.get("store"), str):
            return None
        url = remote.get("url")
        return RemoteUse(
            store=remote["store"], url=url if isinstance(url, str) and url else None,
            key_suffix=str(remote.get("key_suffix") or ""),
            read_only=bool(remote.get("read_only")),
        )  # fmt: skip

    def to_json(self) -> Json:
        """The document written (and embedded in verify's results as `cache`)."""
        out: Json = {"schema": SCHEMA}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Path):
                value = str(value)
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        return out


_PATHS = ("root", "scope_dir", "inductor_dir", "triton_dir", "verify_dir")
_OPTIONAL_PATHS = ("overlay_dir", "lease", "state_file")
_LISTS = ("invalidated", "quarantined")
_OBJECTS = ("set_aside", "fingerprint", "remote", "redis")
_FLAGS = ("spare", "signed", "signature_checked")
_TEXTS = ("verify_mode", "restored_at", "overlay_reason")


def _from_checked(data: Json) -> RestoreState:
    """The state of a document `_problem` accepted; fields it does not check (shown only)
    fall back to their defaults when malformed."""
    value: dict[str, Any] = {
        "scope_key": data["scope_key"], "mode": data["mode"], "hit": data["hit"],
        "read_only": data["read_only"], "files": data["files"], "bytes": data["bytes"],
        "read_only_reason": data.get("read_only_reason"), "nonce": data.get("nonce"),
        "store": data["store"] if isinstance(data.get("store"), str) else "local",
    }  # fmt: skip
    value.update({name: Path(data[name]) for name in _PATHS})
    for name in _OPTIONAL_PATHS:
        value[name] = Path(data[name]) if isinstance(data.get(name), str) else None
    for name in _LISTS:
        items = data.get(name)
        listed = items if isinstance(items, list) else []
        value[name] = tuple(x for x in listed if isinstance(x, dict))
    for name in _OBJECTS:
        value[name] = data[name] if isinstance(data.get(name), dict) else None
    for name in _FLAGS:
        value[name] = data.get(name) is True
    for name in _TEXTS:
        value[name] = data[name] if isinstance(data.get(name), str) else None
    pid = data.get("pid")
    value["pid"] = pid if type(pid) is int else None
    return RestoreState(**value)


def _mac(state: Json, key: str) -> str:
    body = {k: v for k, v in state.items() if k != "mac"}
    payload = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(key.encode(), _MAC_CONTEXT + payload, hashlib.sha256).hexdigest()


def write_state(state: RestoreState, signing_key: str | None) -> None:
    """Write restore's state to its `state_file`: with a signing key, a MAC over everything,
    so that a save holding the key takes only what a restore holding it wrote."""
    if state.state_file is None:
        raise ValueError("a restore state is written to its state_file")
    path = state.state_file
    check_target(path)
    doc = state.to_json()
    if signing_key:
        doc["mac"] = _mac(doc, signing_key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


def _inside(path: str, parent: Path) -> bool:
    """`path` names an entry directly inside `parent` (no `..`, no other directory)."""
    candidate = Path(os.path.normpath(path))
    return candidate.is_absolute() and candidate.parent == parent


def _shape_problem(data: Any) -> str | None:
    """Why `data` does not have the schema's shape, or None."""
    if not isinstance(data, dict):
        return "it is not a JSON object"
    if data.get("schema") != SCHEMA:
        return f"its schema is {data.get('schema')!r}, not {SCHEMA} (restore again)"
    for name in _STRINGS:
        if not isinstance(data.get(name), str):
            return f"{name} is not a string"
    for name in _OPTIONAL_STRINGS:
        if data.get(name) is not None and not isinstance(data[name], str):
            return f"{name} is neither a string nor null"
    for name in _COUNTS:
        value = data.get(name)
        if type(value) is not int or not 0 <= value < 2**63:
            return f"{name} is not a count"
    for name in ("read_only", "hit"):
        if not isinstance(data.get(name), bool):
            return f"{name} is not true or false"
    if not isinstance(data.get("fingerprint"), dict | None):
        return "fingerprint is not an object"
    return None


def _problem(data: Any, root: Path | None, signing_key: str | None) -> str | None:
    """Why `data` is not a restore state this reader may act on, or None."""
    from ci_fxcache.env import scopekey
    from ci_fxcache.store.layout import Layout

    shape = _shape_problem(data)
    if shape is not None:
        return shape
    key = data["scope_key"]
    if not scopekey.KEY_RE.fullmatch(key) or len(key) > scopekey.MAX_KEY_LENGTH:
        return f"scope_key {key[:80]!r} is not a scope key"
    layout = Layout(Path(data["root"]))
    if root is not None and Layout(root).root != layout.root:
        return f"it was written for the store root {data['root']}, not {root}"
    if data.get("lease") is not None and not _inside(data["lease"], layout.leases(key)):
        return f"its lease {data['lease']!r} is not a lease of scope {key} in {layout.root}"
    overlay = data.get("overlay_dir")
    if not data["read_only"] and overlay is not None:
        name = Path(os.path.normpath(overlay)).name
        if not _inside(overlay, layout.overlays) or not name.startswith(f"{key}."):
            return f"its overlay {overlay!r} is not an overlay of scope {key} in {layout.root}"
    if signing_key:
        mac = data.get("mac")
        if not mac:
            return "it carries no MAC, but this save has the signing key (give restore the key)"
        if not hmac.compare_digest(str(mac), _mac(data, signing_key)):
            return "its MAC does not match the signing key (altered, or another key's restore)"
    return None


def parse(
    data: Any, label: str, root: Path | None = None, signing_key: str | None = None
) -> RestoreState:
    """The state of a loaded document (see the module's docstring); UsageError (one line,
    naming `label`) when it is not one this reader may act on."""
    problem = _problem(data, root, signing_key)
    if problem is not None:
        raise UsageError(f"{label} is not a restore state fxcache can use: {problem}")
    return _from_checked(data)


def read_state(
    path: Path, root: Path | None = None, signing_key: str | None = None
) -> RestoreState:
    """Load restore's state file and check it (see the module's docstring); UsageError (one
    line) when it is absent, unreadable, malformed, or not one this reader may act on."""
    if path.is_dir():
        raise UsageError(
            f"--state-file {path} is a directory: pass the file 'fxcache restore' wrote"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise UsageError(f"no restore state at {path}: run 'fxcache restore' first") from exc
    except RecursionError:
        raise UsageError(f"unreadable restore state {path}: nested too deeply") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"unreadable restore state {path}: {exc}") from exc
    return parse(data, str(path), root, signing_key)
