"""The S3 tier's one transport (store/remote/s3/client.py, obstore) against the real
SeaweedFS: keys with `+` listed as the server sent them, conditional writes told apart by
type, a failed multipart upload aborted, bad environment values as one line without their
value, a profile's credentials through boto3's chain, and a restore and save with static keys
that never import botocore. The fixtures and helpers are test_store_s3.py's."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest

from ci_fxcache.store.remote.s3 import client
from tests.conftest import TORCH_PYTHON, RunFxcache, _clean_env
from tests.local_server import LocalServer, certificates
from tests.s3_server import ACCESS_KEY, SECRET_KEY, SeaweedS3
from tests.store_helpers import SAMPLE, FailingFile, Store, write_files
from tests.test_store_s3 import _compiles_into, _first_job, _store
from tests.test_store_s3 import bucket as bucket  # the fixture


def _env(monkeypatch: pytest.MonkeyPatch, values: dict[str, str]) -> None:
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    for name, value in values.items():
        monkeypatch.setenv(name, value)


def test_a_listing_keeps_every_key_with_a_plus_as_the_server_sent_it(
    monkeypatch: pytest.MonkeyPatch, seaweed: SeaweedS3, bucket: str
) -> None:
    """Issue 48: keys are never URL-decoded where the server did not encode them (the lean
    path turned `+` into a space, and `invalidate --s3` deleted those scopes' objects)."""
    _env(monkeypatch, seaweed.env())
    b = client.Bucket(client.parse_url(bucket))
    keys = [b.where.key("scopes", f"torch2.13.0+{kind}-abc", "refs", "1-x")
            for kind in ("cpu", "cu130")]  # fmt: skip
    for key in keys:
        b.put(key, b"ref")
    listed = b.listing(b.where.key("scopes") + "/")
    assert sorted(item["Key"] for item in listed) == sorted(keys)
    assert all(b.get(item["Key"], limit=10) is not None for item in listed)
    first = b.listing(b.where.key("scopes") + "/", first=0)
    assert len(first) == 1  # the first key, and so "there are more"


def test_conditional_writes_lose_by_type_and_an_unchanged_read_is_none(
    monkeypatch: pytest.MonkeyPatch, seaweed: SeaweedS3, bucket: str
) -> None:
    _env(monkeypatch, seaweed.env())
    b = client.Bucket(client.parse_url(bucket))
    key = b.where.key("scopes", "k", "head.json")
    etag = b.put(key, b"one", if_absent=True)
    with pytest.raises(client.S3Conflict):
        b.put(key, b"two", if_absent=True)
    with pytest.raises(client.S3Conflict):
        b.put(key, b"two", if_match='"not-its-etag"')
    new = b.put(key, b"two", if_match=etag)
    assert b.get(key, if_none_match=new, limit=10) is None
    with pytest.raises(client.S3TooLarge):
        b.get(key, limit=2)
    with pytest.raises(client.S3Missing):
        b.get(b.where.key("absent"), limit=2)
    with pytest.raises(client.S3Missing), b.get_range(key, 10, 20):  # past the object's end
        pass
    with b.get_range(key, 1, 3) as read:
        assert bytes(read(2)) == b"wo"


def test_a_multipart_upload_that_fails_is_aborted(
    monkeypatch: pytest.MonkeyPatch, seaweed: SeaweedS3, bucket: str
) -> None:
    _env(monkeypatch, seaweed.env())
    monkeypatch.setattr(client, "MULTIPART_BYTES", 1024)
    b = client.Bucket(client.parse_url(bucket))
    size = client.PART_BYTES * 2 + 10
    key = b.where.key("packs", "big")
    with pytest.raises(client.S3Unavailable):
        b.put_file(key, FailingFile(os.urandom(size)), size)
    s3: Any = seaweed.client()
    name = b.where.bucket
    assert not s3.list_multipart_uploads(Bucket=name).get("Uploads"), "upload left open"
    with pytest.raises(client.S3Missing):
        b.get(key, limit=size)
    b.put_file(key, io.BytesIO(b"x" * size), size)  # a whole one goes up in parts
    assert b.get(key, limit=size) is not None


@pytest.mark.parametrize("name", ["AWS_SESSION_TOKEN", "AWS_SECRET_ACCESS_KEY"])
def test_a_credential_with_a_line_break_is_one_line_without_its_value(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str, name: str
) -> None:
    value = "tok-SECRETVALUE-123\n"
    store = _store(tmp_path, "a", run_fxcache, seaweed, bucket, **{name: value})
    got = store.restore("--store", "s3")
    assert not got["hit"] and name in got["remote"]["error"], got["remote"]
    warnings = [w for w in got["_stderr"].splitlines() if "warning" in w]
    assert len(warnings) == 1, got["_stderr"]
    assert "SECRETVALUE" not in got["_stderr"] + json.dumps(got)


def test_an_unreadable_ca_bundle_is_one_warning_and_the_save_keeps_its_local_commit(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str
) -> None:
    store = _store(tmp_path, "a", run_fxcache, seaweed, bucket,
                   AWS_CA_BUNDLE=str(tmp_path / "no-such-bundle.pem"))  # fmt: skip
    state = store.restore("--store", "s3")
    assert "AWS_CA_BUNDLE" in state["remote"]["error"], state["remote"]
    write_files(_compiles_into(state), SAMPLE)
    proc = store.save()
    assert proc.returncode == 0, proc.stderr
    saved = json.loads(proc.stdout)
    assert saved["saved"] and not saved["remote"].get("published"), saved
    assert len([w for w in proc.stderr.splitlines() if "warning" in w]) == 1, proc.stderr


def test_a_profiles_credentials_reach_the_bucket_through_boto3s_chain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seaweed: SeaweedS3, bucket: str
) -> None:
    """No key in the environment, a profile in the shared credentials file: obstore asks
    boto3's chain (obstore.auth.boto3), which also serves SSO and credential_process."""
    creds = tmp_path / "credentials"
    creds.write_text(f"[ci]\naws_access_key_id = {ACCESS_KEY}\n"
                     f"aws_secret_access_key = {SECRET_KEY}\n")  # fmt: skip
    env = {k: v for k, v in seaweed.env().items() if not k.startswith("AWS_SECRET")}
    env.pop("AWS_ACCESS_KEY_ID")
    _env(monkeypatch, {**env, "AWS_SHARED_CREDENTIALS_FILE": str(creds), "AWS_PROFILE": "ci"})
    b = client.Bucket(client.parse_url(bucket))
    b.put(b.where.key("probe"), b"by profile")
    assert b.get(b.where.key("probe"), limit=100) is not None


_RUN = """
import sys
from ci_fxcache import cli
code = cli.main(sys.argv[1:])
sys.stderr.write("imported: %s\\n" % sorted(m for m in ("botocore", "boto3") if m in sys.modules))
sys.exit(code)
"""


def test_a_restore_and_a_save_with_static_keys_never_import_botocore(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str
) -> None:
    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket)
    _first_job(a)
    b = _store(tmp_path, "b", run_fxcache, seaweed, bucket)
    state = str(tmp_path / "b.json")
    env = _clean_env(b.env)
    restore = [sys.executable, "-c", _RUN, "restore", "--root", str(b.root), "--python",
               TORCH_PYTHON, "--store", "s3", "--json", "--state-file", state]  # fmt: skip
    proc = subprocess.run(restore, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["hit"] and got["remote"]["fetched"] and got["files"] == len(SAMPLE), got
    assert "imported: []" in proc.stderr, proc.stderr
    write_files(_compiles_into(got), {f"{next(iter(SAMPLE))}-new": b"new"})
    save = [sys.executable, "-c", _RUN, "save", "--json", "--state-file", state]
    proc = subprocess.run(save, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["remote"]["published"], proc.stdout
    assert "imported: []" in proc.stderr, proc.stderr


def test_a_conditional_write_on_a_versioned_bucket_names_the_etag(
    monkeypatch: pytest.MonkeyPatch, seaweed: SeaweedS3, bucket: str
) -> None:
    """The client keeps each ETag's version (GCS's generation) and sends both; S3 matches by
    the ETag alone, also where its answers carry version ids."""
    _env(monkeypatch, seaweed.env())
    s3: Any = seaweed.client()
    where = client.parse_url(bucket)
    s3.put_bucket_versioning(Bucket=where.bucket, VersioningConfiguration={"Status": "Enabled"})
    b = client.Bucket(where)
    key = where.key("scopes", "k", "head.json")
    first = b.put(key, b"one", if_absent=True)
    got = b.get(key, limit=10)
    assert got is not None and got[1] == first
    assert b._versions, "no version id kept"  # the versioned bucket's answers carry them
    second = b.put(key, b"two", if_match=first)
    with pytest.raises(client.S3Conflict):
        b.put(key, b"three", if_match=first)
    assert b.get(key, limit=10) == (b"two", second)


class _Sts(LocalServer):
    """AWS STS's AssumeRoleWithWebIdentity over HTTPS (obstore asks STS only over HTTPS), as
    its API reference describes the call: a POST whose query names the action, version,
    role, session and the web identity token, unsigned; the answer, XML credentials. It
    hands out the bucket's keys for the one token it knows and AccessDenied for any other.
    Its session token is empty: SeaweedFS refuses a request that carries a session token it
    did not issue itself, so how a real one travels (X-Amz-Security-Token) is obstore's,
    not checked here."""

    def __init__(self, token: str, role: str, cert: Path, key: Path) -> None:
        super().__init__((cert, key))
        self.token, self.role = token, role
        self.calls: list[dict[str, str]] = []

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        query = dict(parse_qsl(urlsplit(h.path).query))
        with self._lock:
            self.calls.append({**query, "method": h.command,
                               "signed": str("Authorization" in h.headers)})  # fmt: skip
        known = (h.command == "POST" and query.get("Action") == "AssumeRoleWithWebIdentity"
                 and query.get("Version") == "2011-06-15" and query.get("RoleArn") == self.role
                 and query.get("RoleSessionName") and "Authorization" not in h.headers)  # fmt: skip
        if not known or query.get("WebIdentityToken") != self.token:
            body = (b"<ErrorResponse><Error><Type>Sender</Type><Code>AccessDenied</Code>"
                    b"<Message>Not authorized</Message></Error></ErrorResponse>")  # fmt: skip
            h.send_response(403)
        else:
            body = (
                '<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/'
                '2011-06-15/"><AssumeRoleWithWebIdentityResult><Credentials>'
                f"<AccessKeyId>{ACCESS_KEY}</AccessKeyId>"
                f"<SecretAccessKey>{SECRET_KEY}</SecretAccessKey>"
                "<SessionToken></SessionToken>"
                "<Expiration>2099-01-01T00:00:00Z</Expiration></Credentials>"
                "</AssumeRoleWithWebIdentityResult></AssumeRoleWithWebIdentityResponse>"
            ).encode()
            h.send_response(200)
        h.send_header("Content-Type", "text/xml")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)


def test_a_web_identity_token_reaches_the_bucket_through_sts(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str
) -> None:
    """GitHub's OIDC to AWS as `aws-actions/configure-aws-credentials` can leave it: no key,
    a web identity token file and a role (AWS_WEB_IDENTITY_TOKEN_FILE, AWS_ROLE_ARN); obstore
    trades the token for keys at STS (here AWS_ENDPOINT_URL_STS, trusted through
    AWS_CA_BUNDLE), and a save and an empty runner's restore go through with them. A token
    STS refuses is one warning, local only, the token in no message."""
    token = "eyJ.github-oidc-token-" + "x" * 40
    (tmp_path / "token").write_text(token)
    role = "arn:aws:iam::123456789012:role/fxcache-ci"
    ca, cert, key = certificates(tmp_path)
    with _Sts(token, role, cert, key) as sts:
        env = {
            k: v
            for k, v in seaweed.env().items()
            if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
        }
        env.update(AWS_WEB_IDENTITY_TOKEN_FILE=str(tmp_path / "token"), AWS_ROLE_ARN=role,
                   AWS_ENDPOINT_URL_STS=sts.url, AWS_CA_BUNDLE=str(ca),
                   FXCACHE_S3_URL=bucket)  # fmt: skip
        a = Store(tmp_path / "a" / "root", run_fxcache, env)
        _first_job(a)
        b = Store(tmp_path / "b" / "root", run_fxcache, env)
        got = b.restore("--store", "s3")
        assert got["hit"] and got["remote"]["fetched"] and got["files"] == len(SAMPLE), got
        assert sts.calls and all(c["WebIdentityToken"] == token and c["signed"] == "False"
                                 for c in sts.calls), sts.calls  # fmt: skip
        # a token STS refuses: the bucket is out of reach, the restore goes on locally
        (tmp_path / "token").write_text("expired-" + token)
        c = Store(tmp_path / "c" / "root", run_fxcache, env)
        refused = c.restore("--store", "s3")
        assert not refused["hit"] and refused["remote"]["error"], refused["remote"]
        assert "warning" in refused["_stderr"] and token not in refused["_stderr"]
        assert token not in json.dumps(refused)
