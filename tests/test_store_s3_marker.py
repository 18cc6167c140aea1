"""The last-used marker of an object-store restore: sent as soon as the fetch finds the scope,
beside the packs' downloads (not one round trip after them), never by a run that may not
write the bucket, and a marker that fails is one warning. On obstore's in-memory store, as
`fxcache restore` composes the fetch (store.remote.transfer.fetch_scope)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from ci_fxcache.store.layout import Layout
from ci_fxcache.store.remote import transfer
from ci_fxcache.store.remote.s3 import client
from ci_fxcache.store.remote.s3.client import S3Unavailable
from ci_fxcache.store.remote.s3.tier import S3Tier
from ci_fxcache.store.remote.tier import ReadOnly
from tests.store_helpers import committed_scope

obstore_store = pytest.importorskip("obstore.store")

SCOPE = "fxcache-v1-linux-x86_64-cp311-torch2.13.0+cpu-cpu-59b2e5fecf37"
FILES = {f"inductor/fxgraph/a{i}/entry": f"graph {i} ".encode() * (40 + i) for i in range(4)}
WHERE = client.parse_url("s3://memory-bucket/fleet/ci")


@pytest.fixture
def memory(tmp_path: Path) -> Any:
    """An in-memory bucket holding scope SCOPE, published by a first runner."""
    store = obstore_store.MemoryStore()
    root = tmp_path / "first"
    committed = committed_scope(root, SCOPE, FILES)
    tier = S3Tier(WHERE, client.Bucket(WHERE, store=store))
    assert tier.publish(Layout(root), SCOPE, committed, None).published
    return store


def _tier(memory: Any, *, marks_use: bool = True) -> tuple[S3Tier, list[str]]:
    """A runner's tier on `memory`, and the keys of the PUTs it sends, in order."""
    tier = S3Tier(WHERE, client.Bucket(WHERE, store=memory), marks_use=marks_use)
    puts: list[str] = []
    real = tier.bucket.put

    def put(key: str, body: bytes, **kw: Any) -> str:
        puts.append(key)
        return real(key, body, **kw)

    tier.bucket.put = put  # type: ignore[method-assign]
    return tier, puts


def test_the_marker_is_sent_while_the_packs_download(tmp_path: Path, memory: Any) -> None:
    """Each pack's read waits until the marker's PUT was sent: a marker sent only after the
    downloads would leave them waiting, and the fetch would fail."""
    tier, puts = _tier(memory)
    sent = threading.Event()
    real_put, real_range = tier.bucket.put, tier.bucket.get_range

    def put(key: str, body: bytes, **kw: Any) -> str:
        etag = real_put(key, body, **kw)
        if key == tier.last_used_key(SCOPE):
            sent.set()
        return etag

    def get_range(key: str, start: int, end: int) -> Any:
        if not sent.wait(10):
            raise S3Unavailable("the pack was read before the last-used marker was sent")
        return real_range(key, start, end)

    tier.bucket.put = put  # type: ignore[method-assign]
    tier.bucket.get_range = get_range  # type: ignore[method-assign]
    info, _written = transfer.fetch_scope(Layout(tmp_path / "b"), SCOPE, tier, signing_key=None)
    assert info["fetched"] and info["touched"] is True, info
    assert puts == [tier.last_used_key(SCOPE)]  # sent once, not again after the fetch
    assert memory_has(memory, tier.last_used_key(SCOPE))


def memory_has(memory: Any, key: str) -> bool:
    import obstore

    try:
        obstore.head(memory, key)
    except FileNotFoundError:
        return False
    return True


def test_a_run_that_may_not_write_the_bucket_sends_no_marker(tmp_path: Path, memory: Any) -> None:
    tier, puts = _tier(memory, marks_use=False)
    info, _written = transfer.fetch_scope(
        Layout(tmp_path / "b"), SCOPE, ReadOnly(tier), signing_key=None
    )
    assert info["fetched"] and "touched" not in info, info
    assert puts == [] and not memory_has(memory, tier.last_used_key(SCOPE))


def test_a_marker_that_fails_is_one_warning_and_the_fetch_stands(
    tmp_path: Path, memory: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    tier, _puts = _tier(memory)
    real = tier.bucket.put

    def put(key: str, body: bytes, **kw: Any) -> str:
        if key == tier.last_used_key(SCOPE):
            raise S3Unavailable("request failed: AccessDenied")
        return real(key, body, **kw)

    tier.bucket.put = put  # type: ignore[method-assign]
    layout = Layout(tmp_path / "b")
    info, written = transfer.fetch_scope(layout, SCOPE, tier, signing_key=None)
    assert info["fetched"] and info["touched"] is False and written is not None, info
    assert (layout.scope(SCOPE) / "inductor/fxgraph/a0/entry").read_bytes() == FILES[
        "inductor/fxgraph/a0/entry"
    ]
    warnings = [line for line in capsys.readouterr().err.splitlines() if "could not mark" in line]
    assert len(warnings) == 1 and "AccessDenied" in warnings[0], warnings


def test_a_runner_that_has_the_scope_sends_the_marker_alone(tmp_path: Path, memory: Any) -> None:
    """No fetch, so the marker is sent by `touch` itself (the scope present locally)."""
    layout = Layout(tmp_path / "b")
    first, _ = _tier(memory)
    assert transfer.fetch_scope(layout, SCOPE, first, signing_key=None)[0]["fetched"]
    tier, puts = _tier(memory)
    info, written = transfer.fetch_scope(layout, SCOPE, tier, signing_key=None)
    assert info["local"] and info["touched"] is True and written is None, info
    assert puts == [tier.last_used_key(SCOPE)]
