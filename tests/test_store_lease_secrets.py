"""No secret outlives its step (issue 48 point 4): the lease holder that a trusted restore
leaves running for the rest of the job (store.scopes.take_lease, the action's restore step
and `fxcache restore` alike) holds none of the restore's secrets, in its environment
(/proc/PID/environ, readable by every later step of the job) or its command line."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import RunFxcache
from tests.store_helpers import Store, end_lease_holders

# One of each kind in names.SECRET_ENV (and a prefix rule's), each with a value found nowhere
# else.
SECRETS = {
    "FXCACHE_SIGNING_KEY": "signing-key-5b1e0c",
    "FXCACHE_INPUTS": json.dumps({"signing-key": "input-key-9d2f11"}),
    "FXCACHE_REDIS_URL": "redis://:redis-pw-77aa@127.0.0.1:1/0",
    "AWS_ACCESS_KEY_ID": "AKIDLEASEHOLDER01",
    "AWS_SECRET_ACCESS_KEY": "aws-secret-c0ffee",
    "AWS_SESSION_TOKEN": "aws-session-d00d",
    "ACTIONS_RUNTIME_TOKEN": "runtime-token-4242",
    "ACTIONS_ID_TOKEN_REQUEST_TOKEN": "oidc-request-1337",
    "GITHUB_TOKEN": "ghs_leaseholder0000",
}


def test_the_lease_holder_keeps_no_secret_of_the_restore(
    tmp_path: Path, run_fxcache: RunFxcache
) -> None:
    """A restore with every kind of secret in its environment: its lease holder is alive,
    holds the lease's lock, and neither its environment nor its command line carries a
    secret's name or value; the save ends it."""
    from ci_fxcache.store import scopes

    store = Store(root=tmp_path / "root", run=run_fxcache, env=dict(SECRETS))
    try:
        state = store.restore()
        lease = Path(state["lease"])
        pid = json.loads(lease.read_text())["holder_pid"]
        assert isinstance(pid, int) and scopes._held(lease) is True
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        assert environ and b"PATH=" in environ  # read for real: not an empty file
        for name, value in SECRETS.items():
            for text in (environ, cmdline):
                assert f"{name}=".encode() not in text, name
                assert value.encode() not in text, name
        for secret in ("input-key-9d2f11", "redis-pw-77aa"):
            assert secret.encode() not in environ
        saved = store.save()
        assert saved.returncode == 0, saved.stderr
        assert not lease.exists()  # released: its holder sees that and exits
    finally:
        end_lease_holders(store.root)


def test_the_action_restore_steps_lease_holder_keeps_no_secret(tmp_path: Path) -> None:
    """The action's own restore step (setup, then restore, as js/fxcache.js runs them, on a
    push: a trusted job that takes a lease) with the signing key and the store credentials:
    the holder it leaves for the rest of the job carries none of them."""
    from tests.test_action_steps import REPO_ID, run_step

    event = {"repository": {"id": REPO_ID, "default_branch": "main"}}
    env = {k: v for k, v in SECRETS.items() if not k.startswith("FXCACHE_")}
    inputs = {"signing-key": SECRETS["FXCACHE_SIGNING_KEY"]}
    setup = run_step(tmp_path, "setup", inputs, event, "push", **env)
    assert setup.proc.returncode == 0, setup.lines
    root = Path(setup.settings()["root"])
    try:
        restored = run_step(tmp_path, "restore", inputs, event, "push",
                            FXCACHE_ACTION_SETTINGS=setup.outputs["settings"], **env)  # fmt: skip
        assert restored.proc.returncode == 0, restored.lines
        (lease,) = root.glob(".leases/*/*.json")
        pid = json.loads(lease.read_text())["holder_pid"]
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        assert b"PATH=" in environ
        for name, value in {**env, "FXCACHE_SIGNING_KEY": inputs["signing-key"]}.items():
            assert f"{name}=".encode() not in environ and value.encode() not in environ, name
        assert b"FXCACHE_INPUTS=" not in environ
    finally:
        end_lease_holders(root)
