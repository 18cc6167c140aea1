"""The object-store tier's protocol (packs, index, references, the collection) on obstore's
in-memory store (`obstore.store.MemoryStore`, through the same client.Bucket every request of
the tier goes through): fast, in-process, no server; and the same tests on a real Azure Blob
Storage emulator (Azurite, tests/object_servers.py), an `az://` container made from the
AZURE_* variables as a runner's would be, and on a real GCS emulator (fake-gcs-server behind
tests/gcs_xml_writes.py, which gives it the XML-API PUT), a `gs://` bucket from the GOOGLE_*
variables. The transport against the real SeaweedFS is
tests/test_store_s3_transport.py's; the whole restore and save through the CLI on it,
tests/test_store_s3*.py's."""

from __future__ import annotations

import io
import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ci_fxcache.store import manifest as mf
from ci_fxcache.store.layout import Layout
from ci_fxcache.store.policies import Policy
from ci_fxcache.store.remote.s3 import client, invalidate
from ci_fxcache.store.remote.s3.tier import S3Tier
from tests.conftest import RunFxcache
from tests.store_helpers import FailingFile, Store, committed_scope, tree_digest, write_files
from tests.test_invalidate_stores import invalidate_step

obstore_store = pytest.importorskip("obstore.store")

URL = "s3://memory-bucket/fleet/ci"
# Scope keys as the toolkit makes them: a `+` in each (issue 48: listings keep it).
NEW = "fxcache-v1-linux-x86_64-cp311-torch2.13.0+cpu-cpu-59b2e5fecf37"
OLD = "fxcache-v1-linux-x86_64-cp311-torch2.12.0+cpu-cpu-0123456789ab"
FILES = {f"inductor/fxgraph/a{i}/entry": f"graph {i} ".encode() * (50 + i) for i in range(6)}


@pytest.fixture(scope="module")
def azurite() -> Iterator[Any]:
    """One Azurite for the module's azure tests; skipped where tests/emulators is not
    installed, except under CI (the README's test command installs it)."""
    from tests import object_servers

    binary = object_servers.installed(object_servers.azurite_binary(), "Azurite",
                                      "npm ci --prefix tests/emulators")  # fmt: skip
    server = object_servers.start_azurite(binary)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, dict[str, str]]]:
    """One fake-gcs-server for the module's gcs tests, behind the relay that gives it GCS's
    XML-API PUT (tests/gcs_xml_writes.py); the relay and the GOOGLE_* variables that reach it.
    Skipped where the test dependency is missing, except under CI."""
    from tests import object_servers
    from tests.gcs_xml_writes import GcsXmlWrites

    binary = object_servers.installed(object_servers.fake_gcs_binary(), "fake-gcs-server",
                                      "pip install -e '.[test]'")  # fmt: skip
    server = object_servers.start_fake_gcs(binary)
    try:
        with GcsXmlWrites(server.endpoint) as relay:
            env = server.env(tmp_path_factory.mktemp("gcs-key"), via=relay.url)
            yield (server, relay), env
    finally:
        server.stop()


@pytest.fixture(params=["memory", "azure", "gcs", "file"])
def memory(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: Any
) -> Any:
    """One bucket shared by every runner of a test: an in-memory store, a fresh Azurite
    container or fake-gcs-server bucket (each tier makes its store from the AZURE_* or
    GOOGLE_* variables), or a directory as a shared mount would hold it (`file:///PATH`)."""
    if request.param == "memory":
        return obstore_store.MemoryStore()
    if request.param == "file":
        mount = tmp_path_factory.mktemp("shared-mount")
        return client.parse_url(f"file://{mount}", schemes=client.SCHEMES)
    if request.param == "gcs":
        (server, _relay), env = request.getfixturevalue("gcs")
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        url = server.make_bucket(f"t{uuid.uuid4().hex[:16]}") + "/fleet/ci"
        return client.parse_url(url, schemes=client.SCHEMES)
    server = request.getfixturevalue("azurite")
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    url = server.make_container(f"t{uuid.uuid4().hex[:16]}") + "/fleet/ci"
    return client.parse_url(url, schemes=client.SCHEMES)


def _gcs_relay(request: pytest.FixtureRequest) -> Any:
    """The relay in front of fake-gcs-server when this test runs on `gcs`, else None."""
    return request.getfixturevalue("gcs")[0][1] if "[gcs]" in request.node.name else None


def _tier(memory: Any) -> S3Tier:
    if isinstance(memory, client.Location):
        return S3Tier(memory)
    where = client.parse_url(URL)
    return S3Tier(where, client.Bucket(where, store=memory))


def _committed(root: Path, key: str, files: dict[str, bytes]) -> mf.Committed:
    """Scope `key` of runner `root` committed with `files`, as a save leaves it."""
    committed: mf.Committed = committed_scope(root, key, files)
    return committed


def _publish(memory: Any, root: Path, key: str, files: dict[str, bytes]) -> dict[str, Any]:
    return _tier(memory).publish(Layout(root), key, _committed(root, key, files), None).to_dict()


def _fetch(memory: Any, root: Path, key: str) -> dict[str, str]:
    """An empty runner's fetch of `key`: path -> sha256 of every file it wrote."""
    target = root / ".remote" / "fetch"
    target.parent.mkdir(parents=True, exist_ok=True)
    got = _tier(memory).fetch(Layout(root), key, target, None)
    assert got is not None
    return {rel: digest for rel, digest in tree_digest(target).items()
            if rel.startswith("inductor/")}  # fmt: skip


def _digests(files: dict[str, bytes]) -> dict[str, str]:
    import hashlib

    return {rel: hashlib.sha256(body).hexdigest() for rel, body in files.items()}


def _keys(memory: Any, kind: str) -> list[str]:
    bucket = _tier(memory).bucket
    return [item["Key"] for item in bucket.listing(bucket.where.key(kind) + "/")]


def test_a_published_scope_is_fetched_whole_by_an_empty_runner(tmp_path: Path, memory: Any) -> None:
    got = _publish(memory, tmp_path / "a", NEW, FILES)
    # the save's `remote` object as before the typed result: how, and what it replaced (none)
    assert got["published"] and got["via"] == "head" and got["replaced"] is None, got
    assert got["files"] == len(FILES) and got["new_packs"] >= 1, got
    assert _keys(memory, "packs") and _keys(memory, "segments")
    assert _fetch(memory, tmp_path / "b", NEW) == _digests(FILES)


def test_a_second_save_uploads_only_what_the_bucket_lacks(tmp_path: Path, memory: Any) -> None:
    _publish(memory, tmp_path / "a", NEW, FILES)
    packs = set(_keys(memory, "packs"))
    more = {**FILES, "inductor/fxgraph/zz/new": b"one more graph" * 40}
    got = _publish(memory, tmp_path / "a", NEW, more)
    assert got["published"], got
    added = set(_keys(memory, "packs")) - packs
    assert len(added) == 1  # the new file's pack only
    assert _fetch(memory, tmp_path / "b", NEW) == _digests(more)


def test_a_save_that_loses_the_head_publishes_a_reference_that_readers_merge(
    tmp_path: Path, memory: Any, request: pytest.FixtureRequest
) -> None:
    _publish(memory, tmp_path / "a", NEW, FILES)
    relay = _gcs_relay(request)
    refused = relay.refused if relay else 0
    loser = _tier(memory)
    real = loser.bucket.put
    head = loser.head_key(NEW)

    def put(key: str, body: bytes, **kw: Any) -> str:
        if key == head:  # another writer rewrites the head just before this PUT
            old = loser.bucket.get(head, limit=1 << 20)
            assert old is not None
            real(head, old[0] + b"\n")
        return str(real(key, body, **kw))

    loser.bucket.put = put  # type: ignore[method-assign]
    mine = {**FILES, "inductor/fxgraph/b0/entry": b"runner b's own graph" * 30}
    got = loser.publish(Layout(tmp_path / "b"), NEW, _committed(tmp_path / "b", NEW, mine), None)
    assert got.published and got.via == "reference", got
    if relay:  # the emulator itself refused the head's PUT: its generation had moved on
        assert relay.refused == refused + 1, relay.refused
    assert len(_keys(memory, f"scopes/{NEW}/refs")) == 1
    assert _fetch(memory, tmp_path / "c", NEW) == _digests(mine)


def test_four_savers_at_once_leave_every_savers_files_to_an_empty_runner(
    tmp_path: Path, memory: Any
) -> None:
    """Real concurrency on each service: four runners publish the same scope at once, each
    with its own graph; whichever wins the head, an empty runner then restores all four."""
    from concurrent.futures import ThreadPoolExecutor

    own = [{**FILES, f"inductor/fxgraph/s{i}/entry": f"saver {i} ".encode() * 60} for i in range(4)]
    with ThreadPoolExecutor(4) as pool:
        done = list(pool.map(lambda i: _publish(memory, tmp_path / f"s{i}", NEW, own[i]), range(4)))
    assert all(got["published"] for got in done), done
    assert {got["via"] for got in done} <= {"head", "reference"}, done
    union = {rel: body for files in own for rel, body in files.items()}
    assert _fetch(memory, tmp_path / "reader", NEW) == _digests(union)


def test_a_pack_over_the_multipart_limit_goes_up_in_parts_and_a_failed_one_is_dropped(
    memory: Any, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pack larger than MULTIPART_BYTES, as a big `.so` makes one: sent in PART_BYTES parts
    and read back whole; one whose file fails part-way leaves no object (and, on GCS, the
    upload aborted)."""
    monkeypatch.setattr(client, "MULTIPART_BYTES", 1024)
    bucket = _tier(memory).bucket
    relay = _gcs_relay(request)
    taken = (relay.parts, relay.aborted) if relay else (0, 0)
    size = client.PART_BYTES * 2 + 10
    body = os.urandom(size)
    failed = bucket.where.key("packs", "failed")
    with pytest.raises(client.S3Unavailable):
        bucket.put_file(failed, FailingFile(body), size)
    with pytest.raises(client.S3Missing):
        bucket.get(failed, limit=size)
    key = bucket.where.key("packs", "big")
    bucket.put_file(key, io.BytesIO(body), size)
    got = bucket.get(key, limit=size)
    assert got is not None and got[0] == body
    if relay:  # three parts and a completion went through GCS's XML multipart upload
        assert relay.parts - taken[0] >= 3 and relay.aborted == taken[1] + 1, vars(relay)


def test_the_collection_removes_an_old_scope_and_only_its_unshared_objects(
    tmp_path: Path, memory: Any
) -> None:
    shared = dict(list(FILES.items())[:2])
    _publish(memory, tmp_path / "a", NEW, FILES)
    _publish(memory, tmp_path / "o", OLD, {**shared, "inductor/fxgraph/o/old": b"old" * 100})
    packs = set(_keys(memory, "packs"))
    listed = invalidate.run(_tier(memory), Policy(older_torch_than="2.13"), dry_run=False)
    assert [row["scope"] for row in listed["rows"]] == [OLD], listed["rows"]
    assert set(_keys(memory, "packs")) == packs  # within the grace nothing is collected
    later = time.time() + invalidate.DEFAULT_GRACE_S + 60
    done = invalidate.run(_tier(memory), Policy(), dry_run=False, now=later)
    assert done["rows"] == [] and "error" not in done["gc"], done["gc"]
    assert set(_keys(memory, "packs")) < packs  # the old scope's own pack went
    assert _keys(memory, f"scopes/{OLD}") == []
    assert _fetch(memory, tmp_path / "b", NEW) == _digests(FILES)  # the `+` scope is whole
    json.dumps(done)  # the inventory stays a JSON document


def test_the_urls_scheme_names_the_service_and_s3_url_stays_s3_only() -> None:
    from ci_fxcache.errors import UsageError

    for url in ("s3://b-1/p/q", "gs://b-1/p/q", "az://b-1/p/q"):
        where = client.parse_url(url, "--object-url", schemes=client.SCHEMES)
        assert (where.url(), where.key("x")) == (url, "p/q/x")
    with pytest.raises(UsageError, match="s3://BUCKET/PREFIX URL"):
        client.parse_url("gs://b-1/p")  # --s3-url keeps its meaning
    with pytest.raises(UsageError, match="no credentials"):
        client.parse_url("az://key@b-1/p", "--object-url", schemes=client.SCHEMES)
    # a directory on a shared mount: file:///PATH, the path its bucket
    where = client.parse_url("file:///mnt/fx cache/ci", "--object-url", schemes=client.SCHEMES)
    assert (where.bucket, where.prefix, where.url()) == (
        "/mnt/fx cache/ci", "", "file:///mnt/fx cache/ci")  # fmt: skip
    assert client.parse_url("file://localhost/mnt/c", schemes=client.SCHEMES).bucket == "/mnt/c"
    for bad, why in (("file://nas/mnt/c", "not a host"), ("file:mnt/c", "absolute path"),
                     ("file:///mnt/../etc", "'..'"), ("file:///", "absolute path")):  # fmt: skip
        with pytest.raises(UsageError, match=why):
            client.parse_url(bad, "--object-url", schemes=client.SCHEMES)
    with pytest.raises(UsageError, match="s3://BUCKET/PREFIX URL"):
        client.parse_url("file:///mnt/c")  # --s3-url: S3 only


def test_a_directory_that_is_not_there_is_unavailable_not_made(tmp_path: Path) -> None:
    """A shared mount that is not mounted: the tier is unavailable (one warning, local
    only), never a directory made on the runner's own disk."""
    missing = tmp_path / "not-mounted"
    with pytest.raises(client.S3Unavailable, match="is not a directory"):
        client.Bucket(client.parse_url(f"file://{missing}", schemes=client.SCHEMES))
    assert not missing.exists()


_RACER = """
import sys
from ci_fxcache.store.remote.s3 import client
where = client.parse_url(sys.argv[1], schemes=client.SCHEMES)
bucket = client.Bucket(where)
try:
    bucket.put("scope/head.json", sys.argv[3].encode(), if_match=sys.argv[2])
    print("won")
except client.S3Conflict:
    print("lost")
"""


def test_a_directorys_conditional_update_lets_one_of_many_writers_win(tmp_path: Path) -> None:
    """LocalStore has no compare-and-swap on an existing object: the client's own, under a
    lock file, lets exactly one of 6 processes that read the same ETag replace the object,
    refuses a stale ETag, and its lock files never show in a listing."""
    import subprocess
    import sys

    mount = tmp_path / "mount"
    mount.mkdir()
    url = f"file://{mount}"
    bucket = client.Bucket(client.parse_url(url, schemes=client.SCHEMES))
    etag = bucket.put("scope/head.json", b"first", if_absent=True)
    racers = [subprocess.Popen([sys.executable, "-c", _RACER, url, etag, f"writer {i}"],
                               stdout=subprocess.PIPE, text=True) for i in range(6)]  # fmt: skip
    said = [r.communicate(timeout=120)[0].strip() for r in racers]
    assert sorted(said) == ["lost"] * 5 + ["won"], said
    body, now = bucket.get("scope/head.json", limit=100) or (b"", "")
    assert body == f"writer {said.index('won')}".encode() and now != etag
    with pytest.raises(client.S3Conflict):
        bucket.put("scope/head.json", b"stale", if_match=etag)
    assert [item["Key"] for item in bucket.listing("")] == ["scope/head.json"]
    assert (mount / client.FILE_LOCKS).is_dir()


class _SlowHead:
    """obstore with a pause after each HEAD: the check of a conditional update and its PUT
    stand far apart, as on a loaded runner."""

    def __init__(self, obs: Any) -> None:
        self._obs = obs

    def __getattr__(self, name: str) -> Any:
        return getattr(self._obs, name)

    def head(self, *args: Any, **kwargs: Any) -> Any:
        answer = self._obs.head(*args, **kwargs)
        time.sleep(0.2)
        return answer


def test_a_directorys_conditional_update_lets_one_of_many_threads_win(tmp_path: Path) -> None:
    """fcntl locks belong to a process: 6 threads of one process (saves side by side in it)
    that read the same ETag each replaced the object before the in-process lock (the
    four-savers test above lost one saver's files so, about 1 run in 50); now one wins."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    mount = tmp_path / "mount"
    mount.mkdir()
    where = client.parse_url(f"file://{mount}", schemes=client.SCHEMES)
    etag = client.Bucket(where).put("scope/head.json", b"first", if_absent=True)
    start = threading.Barrier(6)

    def race(i: int) -> str:
        bucket = client.Bucket(where)
        bucket._obs = _SlowHead(bucket._obs)
        start.wait()
        try:
            bucket.put("scope/head.json", f"writer {i}".encode(), if_match=etag)
        except client.S3Conflict:
            return "lost"
        return "won"

    with ThreadPoolExecutor(6) as pool:
        said = list(pool.map(race, range(6)))
    assert sorted(said) == ["lost"] * 5 + ["won"], said
    body, _ = client.Bucket(where).get("scope/head.json", limit=100) or (b"", "")
    assert body == f"writer {said.index('won')}".encode()


def test_a_directory_that_refuses_a_write_says_why_in_one_line(tmp_path: Path) -> None:
    """A file system's refusal (here a file where a directory must be: ENOTDIR, whoever
    runs it) is the tier unavailable with the OS's reason and the path, no credential being
    involved; a conditional replace of an object removed meanwhile is a conflict, as S3's
    412 is (the save then writes a reference)."""
    mount = tmp_path / "mount"
    mount.mkdir()
    (mount / "packs").write_bytes(b"not a directory")
    bucket = client.Bucket(client.parse_url(f"file://{mount}", schemes=client.SCHEMES))
    with pytest.raises(client.S3Unavailable) as refused:
        bucket.put("packs/abc", b"pack", if_absent=True)
    message = str(refused.value)
    assert message.startswith(f"file://{mount}: ") and "Not a directory" in message, message
    assert "\n" not in message
    with pytest.raises(client.S3Conflict):
        bucket.put("scopes/k/head.json", b"head", if_match='"gone"')


@pytest.mark.parametrize("service", ["az", "gs", "file"])
def test_store_object_saves_and_an_empty_runner_restores_it(
    tmp_path: Path, run_fxcache: RunFxcache, request: pytest.FixtureRequest, service: str
) -> None:
    """The CLI: `fxcache restore --store object --object-url az://...` (Azurite, from the
    AZURE_* variables) or `file:///PATH` (a directory, as a shared mount holds it) and
    `fxcache save`; the save rebuilds the tier from the state."""
    if service == "az":
        azurite = request.getfixturevalue("azurite")
        url, env = azurite.make_container(f"t{uuid.uuid4().hex[:16]}") + "/fleet/ci", azurite.env()
    elif service == "gs":
        (server, relay), env = request.getfixturevalue("gcs")
        url = server.make_bucket(f"t{uuid.uuid4().hex[:16]}") + "/fleet/ci"
        puts = relay.puts
    else:
        (tmp_path / "mount").mkdir()
        url, env = f"file://{tmp_path / 'mount'}", {}
    stores = [Store(tmp_path / n / "root", run_fxcache, env) for n in "ab"]
    a, b = stores
    first = a.restore("--store", "object", "--object-url", url)
    assert first["remote"]["store"] == "object" and first["remote"]["url"] == url, first["remote"]
    write_files(Path(first["inductor_dir"]).parent, FILES)
    proc = a.save()
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["remote"]["published"], proc.stdout
    if service == "gs":  # the save's writes went to the emulator as uploads
        assert relay.puts - puts >= 3, relay.puts  # a pack, a segment, the head at least
    got = b.restore("--store", "object", "--object-url", url)
    assert got["hit"] and got["remote"]["fetched"] and got["files"] == len(FILES), got["remote"]
    for rel, body in FILES.items():
        assert (Path(got["scope_dir"]) / rel).read_bytes() == body
    proc = run_fxcache("invalidate", "--s3", "--object-url", url, "--dry-run", "--json",
                       env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    inventory = json.loads(proc.stdout)["s3"]
    assert inventory["url"] == url and [s["scope"] for s in inventory["scopes"]] == [
        first["scope_key"]
    ], inventory
    # the invalidate sub-action's `target: object` makes the same call with its object-url
    step = invalidate_step(tmp_path, env, target="object", **{"object-url": url, "dry-run": "true"})
    assert step.returncode == 0, step.stderr
    assert json.loads(step.stdout)["s3"] == inventory
