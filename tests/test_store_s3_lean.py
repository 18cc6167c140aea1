"""The restore's requests without botocore (store/remote/s3/lean.py): the same URLs as
botocore's, used only where the environment determines them, against the real SeaweedFS;
every answer it does not interpret is botocore's to decide; the botocore path still restores.
The fixtures and helpers are test_store_s3.py's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ci_fxcache.store.remote.s3 import client, lean
from tests.conftest import TORCH_PYTHON, RunFxcache, _clean_env
from tests.s3_server import SeaweedS3
from tests.store_helpers import SAMPLE
from tests.test_store_s3 import _first_job, _store
from tests.test_store_s3 import bucket as bucket  # the fixture

_STATIC = {
    "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
    "AWS_SECRET_ACCESS_KEY": "secret",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
}


def _only(monkeypatch: pytest.MonkeyPatch, **env: str) -> None:
    """An environment whose AWS and proxy variables are exactly `env` (plus static keys)."""
    for name in list(os.environ):
        if name.startswith("AWS_") or name.lower().endswith("_proxy"):
            monkeypatch.delenv(name)
    for name, value in {**_STATIC, **env}.items():
        monkeypatch.setenv(name, value)


def _botocore_url(bucket: str, region: str, key: str) -> str:
    """The URL botocore's client sends a GET of `key` to (caught before it is sent)."""
    import botocore.session

    s3 = botocore.session.get_session().create_client("s3", region_name=region)
    seen: list[str] = []

    def catch(request: Any, **_kw: Any) -> None:
        seen.append(request.url)
        raise RuntimeError("caught")

    s3.meta.events.register("before-send.s3", catch)
    with pytest.raises(RuntimeError, match="caught"):
        s3.get_object(Bucket=bucket, Key=key, Range="bytes=0-9")
    return seen[0]


@pytest.mark.parametrize(
    ("endpoint", "bucket_name", "region"),
    [
        ("http://127.0.0.1:8333", "bench", "us-east-1"),
        ("http://localhost:9000", "ci-cache", "eu-west-1"),
        ("http://[::1]:9000", "ci-cache", "us-east-1"),
        ("https://abc.r2.cloudflarestorage.com", "my-bucket", "auto"),
        ("https://minio.internal:443", "a.b.c", "us-east-1"),
        ("https://s3.example.com/base/", "bench", "us-east-1"),
        (None, "my-bucket", "us-east-1"),
        (None, "my-bucket", "eu-central-1"),
        (None, "my-bucket", "cn-north-1"),
    ],
)
def test_a_lean_request_goes_where_botocore_sends_it(
    monkeypatch: pytest.MonkeyPatch, endpoint: str | None, bucket_name: str, region: str
) -> None:
    _only(monkeypatch, **({"AWS_ENDPOINT_URL_S3": endpoint} if endpoint else {}))
    key = "fxcache/packs/a b+c~d"
    made = lean.from_env(bucket_name, region, 5, 30, 3)
    assert made is not None
    w = made.where
    mine = f"{'https' if w.https else 'http'}://{w.host_header}{w.prefix}/{lean.quote(key, '/~')}"
    theirs = _botocore_url(bucket_name, region, key)
    default = ":443" if w.https else ":80"
    assert mine == theirs.replace(default + "/", "/", 1), (mine, theirs)


@pytest.mark.parametrize(
    "setting",
    [
        "AWS_PROFILE=ci",
        "AWS_USE_FIPS_ENDPOINT=true",
        "AWS_MAX_ATTEMPTS=5",
        "HTTPS_PROXY=http://proxy:3128",
        "https_proxy=http://proxy:3128",
        "AWS_SECRET_ACCESS_KEY=",
        "config",
        "AWS_REGION=us-gov-west-1",
    ],
)
def test_whatever_the_environment_does_not_determine_is_left_to_botocore(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, setting: str
) -> None:
    _only(monkeypatch)
    assert lean.from_env("my-bucket", "us-east-1", 5, 30, 3) is not None
    assert lean.from_env("dotted.bucket", "us-east-1", 5, 30, 3) is None  # AWS path-style
    if setting == "config":  # a config file may set addressing, endpoints, a CA bundle
        (tmp_path / "config").write_text("[default]\ns3 =\n  addressing_style = path\n")
        monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    else:
        name, _, value = setting.partition("=")
        monkeypatch.setenv(name, value)
    region = os.environ.get("AWS_REGION", "us-east-1")
    assert lean.from_env("my-bucket", region, 5, 30, 3) is None


def test_lean_reads_and_writes_through_the_real_server_as_botocore_would(
    monkeypatch: pytest.MonkeyPatch, seaweed: SeaweedS3, bucket: str
) -> None:
    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    b = client.Bucket(client.parse_url(bucket))
    assert b._lean is not None and b._botocore is None
    b.put("lean/one", b"0123456789" * 1000)
    body, etag = b.get("lean/one", limit=10_000) or (b"", "")
    assert body == b"0123456789" * 1000 and etag
    assert b.get("lean/one", if_none_match=etag, limit=10_000) is None
    with pytest.raises(client.S3TooLarge):
        b.get("lean/one", limit=9_999)
    with b.get_range("lean/one", 5, 25) as read:
        assert bytes(read(7)) == b"5678901" and bytes(read(13)) == b"2345678901234"
    with pytest.raises(client.S3Missing), b.get_range("lean/absent", 0, 10):
        pass
    with pytest.raises(client.S3Missing), b.get_range("lean/one", 20_000, 20_010):
        pass
    with pytest.raises(client.S3Missing):
        b.get("lean/absent", limit=10)
    assert b._botocore is None  # every answer was one the lean path interprets


def test_a_lean_listing_is_botocores_listing_page_by_page(
    monkeypatch: pytest.MonkeyPatch, seaweed: SeaweedS3, bucket: str
) -> None:
    """The restore lists its scope's references beside reading the head: the lean listing
    gives the same keys, sizes and times as botocore's, across pages (a continuation token)
    and with `first`, for keys that URL encoding changes; botocore is never made for it."""
    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    writer = client.Bucket(client.parse_url(bucket))
    keys = [f"list/refs/{i:04d}-{tail}" for i, tail in
            enumerate(["a b", "c+d", "é%2F", "plain"] * 300)]  # fmt: skip
    for i, key in enumerate(keys):
        writer.put(key, b"x" * (i % 7))
    writer.put("list-other/not-this", b"")
    lean_side = client.Bucket(client.parse_url(bucket))
    assert lean_side._lean is not None
    listed = lean_side.listing("list/refs/")
    first = lean_side.listing("list/refs/", first=5)
    assert lean_side._botocore is None, "a lean listing fell back to botocore"
    botocore_side = client.Bucket(client.parse_url(bucket))
    botocore_side._lean = None
    assert listed == botocore_side.listing("list/refs/")
    assert sorted(k["Key"] for k in listed) == sorted(keys)  # 1,200 keys: two pages
    assert first == botocore_side.listing("list/refs/", first=5)
    assert [k["Key"] for k in first][:5] == sorted(keys)[:5]


def test_an_answer_that_is_no_listing_is_declined_for_botocore_to_read() -> None:
    ns = 'xmlns="http://s3.amazonaws.com/doc/2006-03-01/"'
    entry = f"<ListBucketResult {ns}><Contents><Key>k</Key><LastModified>%s</LastModified>"
    bodies = [
        b"",
        b"<html>proxy login</html>",
        b"<Error><Code>X</Code></Error>",
        (entry % "yesterday" + "</Contents></ListBucketResult>").encode(),
        # no time zone: not S3's
        (entry % "2026-12-05T01:02:03" + "</Contents></ListBucketResult>").encode(),
    ]
    for body in bodies:
        with pytest.raises(lean.Declined):
            lean.parse_listing(body)
    page = lean.parse_listing(
        f"<ListBucketResult {ns}><IsTruncated>true</IsTruncated><NextContinuationToken>t"
        "</NextContinuationToken><Contents><Key>a%20b%2Bc</Key><Size>3</Size><LastModified>"
        "2026-12-05T01:02:03.000Z</LastModified></Contents></ListBucketResult>".encode()
    )
    assert page["IsTruncated"] and page["NextContinuationToken"] == "t"
    assert [(c["Key"], c["Size"]) for c in page["Contents"]] == [("a b+c", 3)]
    assert page["Contents"][0]["LastModified"].timestamp() == 1796432523


def test_an_answer_the_lean_path_does_not_interpret_is_botocores_to_decide(
    monkeypatch: pytest.MonkeyPatch, seaweed: SeaweedS3, bucket: str
) -> None:
    """A refused signature (403) and a missing bucket are asked again by botocore, whose
    codes then sort them: the same errors as before the lean path."""
    for name, value in seaweed.env(secret="wrong").items():
        monkeypatch.setenv(name, value)
    b = client.Bucket(client.parse_url(bucket))
    with pytest.raises(client.S3Unavailable, match="credentials refused"):
        b.get("lean/one", limit=10)
    assert b._botocore is not None and b.requests == {"get_object": 2}
    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    gone = client.Bucket(client.parse_url("s3://no-such-bucket-here/x"))
    with pytest.raises(client.S3Unavailable, match="does not exist"):
        gone.get("x/head", limit=10)


_RESTORE = """
import sys
from ci_fxcache import cli
code = cli.main(sys.argv[1:])
sys.stderr.write("botocore imported: %s\\n" % ("botocore" in sys.modules))
sys.exit(code)
"""


@pytest.mark.parametrize("path", ["lean", "botocore"])
def test_an_empty_runner_restores_every_file_on_either_path_and_lean_never_imports_botocore(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str, path: str
) -> None:
    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket)
    _first_job(a)
    b = _store(tmp_path, "b", run_fxcache, seaweed, bucket)
    env = {**b.env, **({"AWS_MAX_ATTEMPTS": "3"} if path == "botocore" else {})}
    state = str(tmp_path / "b.json")
    cmd = [sys.executable, "-c", _RESTORE, "restore", "--root", str(b.root), "--python",
           TORCH_PYTHON, "--store", "s3", "--json", "--state-file", state]  # fmt: skip
    proc = subprocess.run(cmd, env=_clean_env(env), capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["hit"] and got["remote"]["fetched"] and got["files"] == len(SAMPLE), got
    for rel, body in SAMPLE.items():
        assert (Path(got["scope_dir"]) / rel).read_bytes() == body
    assert f"botocore imported: {path == 'botocore'}" in proc.stderr
