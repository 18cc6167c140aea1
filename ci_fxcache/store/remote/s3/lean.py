"""The S3 requests of a restore without botocore: GET (whole or a byte range), the listing of a
prefix (ListObjectsV2) and a plain PUT,
signed with SigV4 here, on a pool of kept-alive http.client connections.

Why: botocore's import and its S3 client cost ~0.2 s of CPU per process (measured,
docs/store.md), as much as decoding 100 MiB, and a restore of a 256 MiB scope spends ~1 s in
all. So the happy path of the restore's few requests skips it, and botocore is made only when
something needs it: any request, answer or failure this module does not interpret itself
(`Declined`: a redirect, an auth error, a 5xx, a refused connection) is made again by botocore,
whose retries, region redirects and error codes then decide, so a lean request never gives
another outcome than botocore's, at worst a slower one.

Used only when the environment alone determines the request, as botocore would make it
(`from_env`): static credentials in the environment, no AWS variable this module does not
know (a profile, FIPS or dual-stack endpoints, a CA bundle, retry settings, ...), no AWS config
file with content, no proxy; the URL botocore's endpoint rules give (path-style on a
configured endpoint; virtual-hosted on AWS for a bucket without dots in a standard region).
tests/test_store_s3_lean.py compares the URLs with botocore's.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import importlib.util
import os
import random
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote_plus, urlsplit
from xml.etree import ElementTree

# Every AWS variable a lean request honours as botocore would; any other one (AWS_PROFILE,
# AWS_CA_BUNDLE, AWS_USE_FIPS_ENDPOINT, AWS_MAX_ATTEMPTS, ...) leaves the requests to botocore.
KNOWN_ENV = frozenset(
    {
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
        "AWS_EC2_METADATA_DISABLED",
        "AWS_CONFIG_FILE",
        "AWS_SHARED_CREDENTIALS_FILE",
        "AWS_CA_BUNDLE",
    }
)
_PROXY_ENV = ("http_proxy", "https_proxy", "all_proxy")
# Regions of the `aws` partition (and China's) whose S3 endpoint is s3.REGION.amazonaws.com.
_REGION = re.compile(r"^(?!us-gov-|us-iso)[a-z]{2}-[a-z]+-[0-9]$")
_HOSTABLE = re.compile(r"^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$")
_EMPTY_SHA = hashlib.sha256(b"").hexdigest()
_CODE = re.compile(rb"<Code>([A-Za-z]+)</Code>")
# Idle connections kept (client.POOL: the restore's readers and the index reads beside them).
_IDLE = 24


class Declined(Exception):
    """botocore is to make this request (an answer or failure not interpreted here)."""


class Failed(Exception):
    """A server error (5xx, 429) still there after the attempts botocore would make: its S3
    code and status in botocore's shape (`response`), so one mapping sorts both kinds."""

    def __init__(self, status: int, code: str) -> None:
        super().__init__(f"{code or 'error'} (HTTP {status})")
        self.response = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}


@dataclass(frozen=True)
class Credentials:
    access_key: str
    secret_key: str
    token: str


@dataclass(frozen=True)
class Endpoint:
    """Where requests for one bucket go: scheme, connection host and port, Host header,
    and the path every key is under (with the bucket when path-style)."""

    https: bool
    host: str
    port: int | None
    host_header: str
    prefix: str


def _config_file_has_content() -> bool:
    for name, default in (("AWS_CONFIG_FILE", "~/.aws/config"),
                          ("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials")):  # fmt: skip
        path = Path(os.environ.get(name) or default).expanduser()
        try:
            if path.is_file() and path.stat().st_size > 0:
                return True
        except OSError:
            return True
    return False


def endpoint_for(bucket: str, region: str, configured: str | None) -> Endpoint | None:
    """The endpoint botocore's rules give for `bucket` (None where this module does not
    follow them: botocore then makes every request)."""
    if configured:
        split = urlsplit(configured)
        if split.scheme not in ("http", "https") or not split.hostname or split.query:
            return None
        if "@" in split.netloc:
            return None
        https = split.scheme == "https"
        port = split.port
        default = 443 if https else 80
        host_header = split.netloc.rsplit("@", 1)[-1].lower()
        if port == default:
            host_header = host_header.rsplit(":", 1)[0]
        prefix = split.path.rstrip("/") + "/" + quote(bucket, safe="")
        return Endpoint(https, split.hostname, port, host_header, prefix)
    if not _HOSTABLE.match(bucket) or not _REGION.match(region):
        return None
    suffix = "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"
    host = (
        f"{bucket}.s3.amazonaws.com" if region == "us-east-1" else f"{bucket}.s3.{region}.{suffix}"
    )
    return Endpoint(True, host, None, host, "")


def from_env(
    bucket: str, region: str, connect_s: float, read_s: float, attempts: int
) -> Lean | None:
    """A lean client for `bucket` when the environment alone determines its requests; else
    None (botocore makes them all)."""
    env = os.environ
    if any(name.startswith("AWS_") and name not in KNOWN_ENV for name in env):
        return None
    if any(env.get(name) or env.get(name.upper()) for name in _PROXY_ENV):
        return None
    access, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
    if not access or not secret or _config_file_has_content():
        return None
    where = endpoint_for(
        bucket, region, env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    )
    if where is None:
        return None
    creds = Credentials(access, secret, env.get("AWS_SESSION_TOKEN") or "")
    return Lean(where, creds, region, connect_s, read_s, attempts)


def _ca_file() -> str:
    """The certificates botocore trusts: AWS_CA_BUNDLE, else certifi's, else its own."""
    chosen = os.environ.get("AWS_CA_BUNDLE")
    if chosen:
        return chosen
    try:
        import certifi

        return str(certifi.where())
    except ImportError:
        spec = importlib.util.find_spec("botocore")
        where = list(spec.submodule_search_locations or []) if spec else []
        return os.path.join(where[0] if where else "", "cacert.pem")


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


class Lean:
    """Signed requests to one endpoint on kept-alive connections (thread-safe)."""

    def __init__(
        self,
        where: Endpoint,
        creds: Credentials,
        region: str,
        connect_s: float,
        read_s: float,
        attempts: int = 3,
    ) -> None:
        self.where = where
        self._creds = creds
        self._region = region
        self._connect_s = connect_s
        self._read_s = read_s
        self.attempts = attempts
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._keys: dict[str, bytes] = {}
        self._tls: ssl.SSLContext | None = None

    def _signing_key(self, day: str) -> bytes:
        key = self._keys.get(day)
        if key is None:
            key = _hmac(("AWS4" + self._creds.secret_key).encode(), day)
            for part in (self._region, "s3", "aws4_request"):
                key = _hmac(key, part)
            self._keys[day] = key
        return key

    def _signed(
        self, method: str, path: str, headers: dict[str, str], payload_sha: str, query: str = ""
    ) -> dict[str, str]:
        """`headers` plus Host, the SigV4 headers and Authorization (`query`: the canonical
        query string, as sent)."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        day = stamp[:8]
        signed = {k.lower(): v.strip() for k, v in headers.items()}
        signed.update({"host": self.where.host_header, "x-amz-date": stamp,
                       "x-amz-content-sha256": payload_sha})  # fmt: skip
        if self._creds.token:
            signed["x-amz-security-token"] = self._creds.token
        names = sorted(signed)
        canonical = "\n".join(
            [method, path, query, *(f"{n}:{signed[n]}" for n in names), "", ";".join(names),
             payload_sha]
        )  # fmt: skip
        scope = f"{day}/{self._region}/s3/aws4_request"
        to_sign = "\n".join(
            ["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()]
        )
        signature = hmac.new(self._signing_key(day), to_sign.encode(), hashlib.sha256).hexdigest()
        signed["authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={self._creds.access_key}/{scope}, "
            f"SignedHeaders={';'.join(names)}, Signature={signature}"
        )
        signed["accept-encoding"] = "identity"
        return signed

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        w = self.where
        if not w.https:
            return http.client.HTTPConnection(w.host, w.port, timeout=self._connect_s), False
        with self._lock:
            if self._tls is None:
                self._tls = ssl.create_default_context(cafile=_ca_file())
        conn = http.client.HTTPSConnection(
            w.host, w.port, timeout=self._connect_s, context=self._tls
        )
        return conn, False

    def release(self, conn: http.client.HTTPConnection, response: http.client.HTTPResponse) -> None:
        """Keep `conn` for the next request when its answer was read to the end."""
        if response.isclosed() and not response.will_close:
            with self._lock:
                if len(self._idle) < _IDLE:
                    self._idle.append(conn)
                    return
        conn.close()

    def request(
        self,
        method: str,
        key: str | None,
        headers: dict[str, str],
        body: bytes = b"",
        stop: Callable[[], bool] = lambda: False,
        query: dict[str, str] | None = None,
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Send one signed request for object `key` (None: the bucket, with `query`'s
        parameters): its connection and answer (headers read, the body not). A server error
        (5xx, 429) is tried again as botocore's standard mode would (`attempts` in all, with
        its backoff, none once `stop()`), then Failed.
        Declined when no answer came (after one retry on a fresh connection where a
        kept-alive one had been closed by the server)."""
        if key is None:
            path = self.where.prefix or "/"
        else:
            path = self.where.prefix + "/" + quote(key, safe="/~")
        canonical_query = "&".join(
            f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}"
            for k, v in sorted((query or {}).items())
        )
        payload = hashlib.sha256(body).hexdigest() if body else _EMPTY_SHA
        for attempt in range(self.attempts):
            if attempt:
                time.sleep(random.random() * min(20.0, 2.0**attempt))  # botocore's backoff
                if stop():
                    break
            conn, response = self._answer(method, path, headers, body, payload, canonical_query)
            if response.status < 500 and response.status != 429:
                return conn, response
            code = self.error_code(response)
            self.release(conn, response)
        raise Failed(response.status, code)

    def _answer(
        self,
        method: str,
        path: str,
        headers: dict[str, str],
        body: bytes,
        payload: str,
        query: str = "",
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        for _try in range(2):
            conn, reused = self._connection()
            try:
                if conn.sock is None:
                    conn.connect()
                    sock: socket.socket = conn.sock  # type: ignore[assignment]
                    sock.settimeout(self._read_s)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                signed = self._signed(method, path, headers, payload, query)
                conn.request(method, f"{path}?{query}" if query else path, body or None, signed)
                return conn, conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                if not reused:
                    raise Declined(type(exc).__name__) from None
        raise Declined("no answer")

    def error_code(self, response: http.client.HTTPResponse) -> str:
        """The S3 error code of an error answer (its small XML body; '' when none)."""
        try:
            found = _CODE.search(response.read(65536))
        except (OSError, http.client.HTTPException):
            return ""
        return found.group(1).decode() if found else ""


_S3_XML = "{http://s3.amazonaws.com/doc/2006-03-01/}"
# A listing page of at most 1,000 keys is ~0.3 MB; a larger answer is not one.
LISTING_LIMIT = 16 * 1024 * 1024


def listing_query(prefix: str, token: str | None, max_keys: int | None) -> dict[str, str]:
    """ListObjectsV2's parameters as botocore sends them (keys URL-encoded in the answer)."""
    query = {"list-type": "2", "prefix": prefix, "encoding-type": "url"}
    if token:
        query["continuation-token"] = token
    if max_keys is not None:
        query["max-keys"] = str(max_keys)
    return query


def parse_listing(body: bytes) -> dict[str, Any]:
    """A ListObjectsV2 answer in botocore's shape (Contents: Key, Size, LastModified as an
    aware datetime; IsTruncated; NextContinuationToken); Declined where it is not one, so
    botocore asks again and decides."""
    try:
        root = ElementTree.fromstring(body)
        if root.tag != f"{_S3_XML}ListBucketResult":
            raise Declined(f"a listing answered {root.tag!r}")
        contents: list[dict[str, Any]] = [
            {
                "Key": unquote_plus(item.findtext(f"{_S3_XML}Key") or ""),
                "Size": int(item.findtext(f"{_S3_XML}Size") or 0),
                "LastModified": datetime.fromisoformat(
                    item.findtext(f"{_S3_XML}LastModified") or ""
                ),
            }
            for item in root.iterfind(f"{_S3_XML}Contents")
        ]
    except (ElementTree.ParseError, ValueError) as exc:
        raise Declined(f"an unreadable listing ({exc})") from None
    if any(not c["Key"] or c["LastModified"].tzinfo is None for c in contents):
        raise Declined("a listing entry without its key or time zone")
    return {
        "Contents": contents,
        "IsTruncated": root.findtext(f"{_S3_XML}IsTruncated") == "true",
        "NextContinuationToken": root.findtext(f"{_S3_XML}NextContinuationToken"),
    }
