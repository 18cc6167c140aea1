"""The S3 API as the S3 tier uses it: a few calls, bounded timeouts and retries, and errors
sorted into "the bucket is unusable" (warn, go local-only) and "an object is missing".

Endpoint, region and credentials come from the standard AWS chain (`AWS_ENDPOINT_URL_S3` /
`AWS_ENDPOINT_URL`, `AWS_REGION`, access keys, profiles, web identity): botocore (boto3's
core, which reads the same chain) reads them, so AWS S3, R2, GCS's S3 API, MinIO, Ceph and
SeaweedFS work without options of ours. The client is botocore's own, without boto3's layer:
importing boto3 also imports its transfer manager (s3transfer), ~0.1 s of every restore for
nothing the tier calls. Where the environment alone determines a request, the restore's GETs
and plain PUTs go without botocore (lean.py), which is then made only when a request needs it.
No message of this module carries a credential: errors are reported by their S3 code and HTTP
status.
"""

from __future__ import annotations

import contextlib
import http.client
import importlib.util
import os
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO, TypeVar
from urllib.parse import urlsplit

from ci_fxcache.errors import UsageError
from ci_fxcache.store.remote.s3 import lean
from ci_fxcache.store.remote.s3.deadline import (
    DEADLINE_ENV,
    Deadline,
    DeadlinePassed,
    configured_seconds,
)

URL_ENV = "FXCACHE_S3_URL"
# Seconds for connecting and for each read of one request (never beyond what is left of the
# operation's Deadline, deadline.py, which bounds the whole restore, save or invalidate).
TIMEOUT_ENV = "FXCACHE_S3_TIMEOUT"
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 30.0
MAX_ATTEMPTS = 3
# Connections kept open: a restore reads on s3.parallel.FETCH_WORKERS at once, a save on
# s3.parallel.WORKERS; a few more for the index reads beside them.
POOL = 24
# An object larger than this goes up in parts of PART_BYTES (S3's parts are 5 MiB to 5 GiB),
# each read from its file while it is sent: a save holds one part per upload, not the object.
MULTIPART_BYTES = 64 * 1024 * 1024
PART_BYTES = 8 * 1024 * 1024
# Lean reads' buffers kept idle (one per concurrent range read of a restore; one frame each).
_IDLE_BUFFERS = 16
_BUFFER_BYTES = 4 * 1024 * 1024
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
T = TypeVar("T")
Buffer = bytes | memoryview


class S3Unavailable(Exception):
    """The bucket cannot be used at all (unreachable, credentials, missing bucket, throttled):
    one warning, then local-only operation."""


class S3NotModified(Exception):
    """A conditional GET's object is unchanged (304 Not Modified)."""


class S3Missing(Exception):
    """An object the tier expected is not in the bucket."""


class S3Conflict(Exception):
    """A conditional PUT lost (412 Precondition Failed, or 409 from a concurrent write)."""


class S3TooLarge(Exception):
    """An object (or range) larger than its reader allows: refused before it is read."""

    def __init__(self, key: str, etag: str = "") -> None:
        super().__init__(key)
        self.etag = etag


@dataclass(frozen=True)
class Location:
    """A bucket and a key prefix (no leading or trailing slash; may be empty)."""

    bucket: str
    prefix: str

    def url(self) -> str:
        """`s3://BUCKET/PREFIX` (never holds a credential: s3 URLs have none)."""
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")

    def key(self, *parts: str) -> str:
        """An object key under the prefix."""
        return "/".join(p for p in (self.prefix, *parts) if p)


def parse_url(url: str, what: str = "--s3-url") -> Location:
    """`s3://BUCKET/PREFIX` -> Location; UsageError (the value is not repeated) otherwise."""
    split = urlsplit(url)
    if split.scheme != "s3" or not split.netloc or split.query or split.fragment:
        raise UsageError(f"{what} is not an s3://BUCKET/PREFIX URL")
    if "@" in split.netloc or ":" in split.netloc:
        raise UsageError(
            f"{what}: put no credentials or port in the URL; they come from the AWS "
            "variables (AWS_ENDPOINT_URL_S3, AWS_ACCESS_KEY_ID, ...)"
        )
    if not _BUCKET.match(split.netloc):
        raise UsageError(f"{what}: {split.netloc!r} is not a valid bucket name")
    prefix = split.path.strip("/")
    if any(part in ("", ".", "..") for part in prefix.split("/")) and prefix:
        raise UsageError(f"{what}: the prefix has an empty, '.' or '..' part")
    return Location(split.netloc, prefix)


def resolve_url(url: str | None) -> Location:
    """`--s3-url`, else `$FXCACHE_S3_URL`; UsageError when unset or malformed."""
    what = "--s3-url" if url else URL_ENV
    url = url or os.environ.get(URL_ENV) or None
    if not url:
        raise UsageError("the s3 store needs --s3-url s3://BUCKET/PREFIX (or FXCACHE_S3_URL)")
    return parse_url(url, what)


def check_config() -> None:
    """UsageError for a malformed FXCACHE_S3_TIMEOUT or FXCACHE_S3_DEADLINE: called when the
    tier is made, before anything is restored or committed."""
    _timeouts()
    configured_seconds()


def _timeouts() -> tuple[float, float]:
    raw = os.environ.get(TIMEOUT_ENV)
    if not raw:
        return CONNECT_TIMEOUT_S, READ_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < 3600:
        raise UsageError(f"{TIMEOUT_ENV}={raw!r}: give seconds, more than 0 and under 3600")
    return value, value


def _describe(exc: BaseException) -> str:
    """One phrase for an S3 failure: its code and status, never the request's headers."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        error = response.get("Error") or {}
        status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        code = error.get("Code") or "error"
        return f"{code} (HTTP {status})" if status else str(code)
    return type(exc).__name__


def _code(exc: BaseException) -> tuple[str, int]:
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return "", 0
    status = int((response.get("ResponseMetadata") or {}).get("HTTPStatusCode") or 0)
    return str((response.get("Error") or {}).get("Code") or ""), status


class Bucket:
    """One bucket through one thread-safe botocore client; every request within `deadline`
    (replaced per operation by `use`)."""

    def __init__(self, where: Location, deadline: Deadline | None = None) -> None:
        if importlib.util.find_spec("botocore") is None:
            raise S3Unavailable("the S3 client is not installed (pip install 'ci-fxcache[s3]')")
        self.deadline = deadline or Deadline(configured_seconds())
        connect, read = _timeouts()
        self._timeouts = self.deadline.capped(connect), self.deadline.capped(read)
        self._region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        self.where = where
        self.requests: dict[str, int] = {}
        self._lock = threading.Lock()
        self.sent_bytes = 0
        self.received_bytes = 0
        # The restore's requests without botocore where the environment determines them
        # (lean.py); botocore's client is made on first need (~0.2 s of CPU).
        self._lean = lean.from_env(where.bucket, self._region or "us-east-1", *self._timeouts,
                                   MAX_ATTEMPTS)  # fmt: skip
        self._botocore: Any = None
        self._buffers: list[bytearray] = []  # the lean reads' idle buffers
        self._making = threading.Lock()
        if self._lean is None:  # needed at once (the caller makes this on a thread of its own)
            self._botocore = self._make_client()

    def warm(self) -> None:
        """Start making botocore's client on a thread of its own (an operation that will need
        it, a save's conditional writes, need not wait for it later); errors are left for the
        first request that needs it."""
        if self._botocore is None:
            threading.Thread(target=self._warm, name="fxcache-s3 botocore", daemon=True).start()

    def _warm(self) -> None:
        with contextlib.suppress(Exception):
            self._s3  # noqa: B018 - made and kept

    @property
    def _s3(self) -> Any:
        """botocore's client, made on first use (S3Unavailable when it cannot be)."""
        with self._making:
            if self._botocore is None:
                self._botocore = self._make_client()
        return self._botocore

    def _make_client(self) -> Any:
        import botocore.session
        from botocore.config import Config

        connect, read = self._timeouts
        config = Config(
            connect_timeout=connect,
            read_timeout=read,
            retries={"total_max_attempts": MAX_ATTEMPTS, "mode": "standard"},
            max_pool_connections=POOL,
            # Every byte is checked against the manifest's sha256: no CRC of 1 GiB besides.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            user_agent_extra="fxcache",
        )
        try:
            made = botocore.session.get_session().create_client(
                "s3", config=config, region_name=self._region or "us-east-1"
            )
        except Exception as exc:  # botocore's configuration errors (a bad profile, ...)
            raise S3Unavailable(f"S3 client not configured: {_describe(exc)}") from exc
        # No request, first try or retry, once the bound is spent.
        made.meta.events.register("before-send.s3", self._before_send)
        return made

    def use(self, deadline: Deadline) -> None:
        """Bound every later request by `deadline` (one per restore, save or invalidate)."""
        self.deadline = deadline

    def _before_send(self, **event: Any) -> None:
        self.deadline.refuse_if_passed(**event)

    def within(self, work: Callable[[], T], what: str) -> T:
        """`work()` (network I/O: a call, a body's read) within the deadline; S3Unavailable
        when the bound is spent first."""
        try:
            return self.deadline.run(work, what)
        except DeadlinePassed as exc:
            raise S3Unavailable(f"{exc} ({DEADLINE_ENV})") from None

    def _count(self, what: str, sent: int = 0, received: int = 0) -> None:
        with self._lock:  # transfers run on several threads
            self.requests[what] = self.requests.get(what, 0) + 1
            self.sent_bytes += sent
            self.received_bytes += received

    def _fail(self, exc: BaseException, key: str) -> BaseException:
        """The exception to raise for a failed request on `key`."""
        code, status = _code(exc)
        if status == 304:
            return S3NotModified(key)
        if code in ("NoSuchKey", "NotFound", "InvalidRange") or (
            status in (404, 416) and code != "NoSuchBucket"
        ):
            return S3Missing(key)
        if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412):
            return S3Conflict(key)
        if code == "NoSuchBucket":
            return S3Unavailable(f"bucket {self.where.bucket!r} does not exist")
        if code in ("SignatureDoesNotMatch", "InvalidAccessKeyId", "AccessDenied") or status in (
            401,
            403,
        ):
            return S3Unavailable(f"credentials refused: {_describe(exc)}")
        if code in ("SlowDown", "ServiceUnavailable") or status == 503:
            return S3Unavailable(f"throttled: {_describe(exc)} after {MAX_ATTEMPTS} attempts")
        return S3Unavailable(_describe(exc))

    def _call(self, what: str, key: str, **kwargs: Any) -> Any:
        body = kwargs.get("Body")
        self._count(what, sent=len(body) if isinstance(body, bytes) else 0)
        return self.within(lambda: self._send(what, key, **kwargs), what)

    def _send(self, what: str, key: str, **kwargs: Any) -> Any:
        s3 = self._s3
        try:
            return getattr(s3, what)(Bucket=self.where.bucket, **kwargs)
        except DeadlinePassed:
            raise
        except Exception as exc:  # botocore raises ClientError, BotoCoreError and subclasses
            raise self._fail(exc, key) from None

    def _listing_page(self, prefix: str, extra: dict[str, Any]) -> Any:
        """One ListObjectsV2 page: lean where it can (a restore lists its scope's references
        beside reading the head), else, or where the lean answer is not one it reads,
        botocore's."""
        if self._lean is not None:
            self._count("list_objects_v2")
            query = lean.listing_query(prefix, extra.get("ContinuationToken"), extra.get("MaxKeys"))
            page = self.within(lambda: self._lean_listing(prefix, query), "list_objects_v2")
            if page is not None:
                return page
        return self._call("list_objects_v2", prefix, Prefix=prefix, **extra)  # counted again

    def _lean_listing(self, prefix: str, query: dict[str, str]) -> Any:
        """A lean listing page in botocore's shape; None when botocore is to ask instead."""
        assert self._lean is not None
        try:
            conn, response = self._lean.request("GET", None, {}, stop=self.deadline.passed,
                                                query=query)  # fmt: skip
        except lean.Declined:
            return None
        except lean.Failed as exc:
            raise self._fail(exc, prefix) from None
        if response.status != 200:
            self._lean.error_code(response)
            self._lean.release(conn, response)
            return None
        try:
            body = response.read(lean.LISTING_LIMIT + 1)
        except (OSError, http.client.HTTPException):
            conn.close()
            return None
        self._lean.release(conn, response)
        with self._lock:
            self.received_bytes += len(body)
        if len(body) > lean.LISTING_LIMIT:
            return None
        with contextlib.suppress(lean.Declined):
            return lean.parse_listing(body)
        return None

    def get(
        self, key: str, if_none_match: str | None = None, *, limit: int
    ) -> tuple[bytes, str] | None:
        """(body, ETag) of `key`; None when it is unchanged from ETag `if_none_match`.
        S3Missing when absent; S3TooLarge when it is larger than `limit` bytes (refused by
        its Content-Length before the body is read, and never read past `limit`)."""
        extra = {"IfNoneMatch": if_none_match} if if_none_match else {}
        self._count("get_object")

        def request() -> tuple[bytes, str] | None:  # the body's read is inside the bound too
            if self._lean is not None:
                with contextlib.suppress(lean.Declined):
                    return self._lean_get(key, if_none_match, limit)
                self._count("get_object")  # botocore asks again, and decides
            try:
                answer = self._send("get_object", key, Key=key, **extra)
            except S3NotModified:
                return None
            etag = str(answer.get("ETag", ""))
            with self._body(answer, key, limit, etag) as read:
                return bytes(read(limit + 1)), etag

        got = self.within(request, "get_object")
        if got is None:
            return None
        body, etag = got
        if len(body) > limit:
            raise S3TooLarge(key, etag)
        return body, etag

    def _lean_get(
        self, key: str, if_none_match: str | None, limit: int
    ) -> tuple[bytes, str] | None:
        assert self._lean is not None
        headers = {"If-None-Match": if_none_match} if if_none_match else {}
        got = self._lean_open(key, headers)
        if got is None:
            raise lean.Declined("botocore asks")
        conn, response = got
        if response.status == 304:
            response.read()
            self._lean.release(conn, response)
            return None
        etag = response.getheader("ETag") or ""
        with self._lean_body(conn, response, key, limit, etag) as read:
            # What was announced (never more than `limit`: refused above), else up to the limit.
            length = response.length if isinstance(response.length, int) else limit + 1
            return bytes(read(length)), etag

    @contextlib.contextmanager
    def get_range(self, key: str, start: int, end: int) -> Iterator[Callable[[int], Buffer]]:
        """Bytes `start` to `end` (exclusive) of `key`, streamed: yields `read(n)`, which
        returns n bytes (fewer only where the object ends), valid until the next read (the
        lean path reuses one buffer). S3Missing when `key` is absent or ends before `start`;
        S3TooLarge when the answer would be longer than the range. The request and every read
        are within the deadline: a server that freezes mid-body costs at most what is left
        of it."""
        span = f"bytes={start}-{end - 1}"
        self._count("get_object")
        with contextlib.ExitStack() as stack:
            got = None
            read: Callable[[int], Buffer]
            if self._lean is not None:
                got = self.within(lambda: self._lean_open(key, {"Range": span}), "get_object")
                if got is None:
                    self._count("get_object")  # declined: botocore asks again, and decides
            if got is not None:
                read = stack.enter_context(self._lean_body(*got, key, end - start))
            else:
                answer = self.within(lambda: self._send("get_object", key, Key=key, Range=span),
                                     "get_object")  # fmt: skip
                read = stack.enter_context(self._body(answer, key, end - start))
            yield lambda n: self.within(lambda: read(n), "get_object body")

    def _lean_open(
        self, key: str, headers: dict[str, str]
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse] | None:
        """A lean GET's connection and answer (200, 206 or 304; headers read, the body not);
        S3Missing as botocore would tell it; None when botocore is to ask instead."""
        assert self._lean is not None
        try:
            conn, response = self._lean.request("GET", key, headers, stop=self.deadline.passed)
        except lean.Declined:
            return None
        except lean.Failed as exc:
            raise self._fail(exc, key) from None
        if response.status in (200, 206, 304):
            return conn, response
        code = self._lean.error_code(response)
        self._lean.release(conn, response)
        if response.status == 416 or code in ("NoSuchKey", "InvalidRange"):
            raise S3Missing(key)
        return None

    @contextlib.contextmanager
    def _lean_body(
        self,
        conn: http.client.HTTPConnection,
        response: http.client.HTTPResponse,
        key: str,
        limit: int,
        etag: str = "",
    ) -> Iterator[Callable[[int], memoryview]]:
        """_body for a lean answer: its reads go into one buffer reused from read to read,
        taken from the client's idle buffers and given back after (so a restore zero-fills and
        faults in one buffer per concurrent read, not one per range: at most one frame each,
        FETCH_WORKERS in all, as before); the connection is kept for the next request when
        the body was read to its end."""
        assert self._lean is not None
        reading = threading.Event()
        with self._lock:
            buffer = self._buffers.pop() if self._buffers else bytearray()
        try:
            length = response.length
            if isinstance(length, int) and length > limit:
                raise S3TooLarge(key, etag)

            def read(n: int) -> memoryview:
                nonlocal buffer
                if len(buffer) < n:
                    buffer = bytearray(n)
                view = memoryview(buffer)[:n]
                got = 0
                reading.set()
                try:
                    while got < n:
                        try:
                            piece = response.readinto(view[got:])
                        except (OSError, http.client.HTTPException) as exc:
                            raise S3Unavailable(f"reading {key}: {type(exc).__name__}") from None
                        if not piece:
                            break
                        got += piece
                finally:
                    reading.clear()
                with self._lock:
                    self.received_bytes += got
                return view[:got]

            yield read
        finally:
            if not reading.is_set():  # else a read abandoned at the deadline still runs
                self._lean.release(conn, response)
                with self._lock:
                    if len(self._buffers) < _IDLE_BUFFERS and len(buffer) <= _BUFFER_BYTES:
                        self._buffers.append(buffer)

    @contextlib.contextmanager
    def _body(
        self, answer: dict[str, Any], key: str, limit: int, etag: str = ""
    ) -> Iterator[Callable[[int], bytes]]:
        """A reader of a GET's body that was announced no longer than `limit` bytes."""
        body = answer["Body"]
        reading = threading.Event()  # set while a read runs (maybe abandoned at the deadline)
        try:
            length = answer.get("ContentLength")
            if isinstance(length, int) and length > limit:
                raise S3TooLarge(key, etag)

            def read(n: int) -> bytes:
                pieces: list[bytes] = []
                got = 0
                reading.set()
                try:
                    while got < n:
                        try:
                            piece = body.read(n - got)
                        except Exception as exc:  # a connection dropped or timed out mid-body
                            raise S3Unavailable(f"reading {key}: {_describe(exc)}") from None
                        if not piece:
                            break
                        pieces.append(piece)
                        got += len(piece)
                finally:
                    reading.clear()
                with self._lock:
                    self.received_bytes += got
                return pieces[0] if len(pieces) == 1 else b"".join(pieces)

            yield read
        finally:
            # Closing waits for a read in progress (the stream's lock): a read abandoned at
            # the deadline keeps its connection until it ends on its own.
            if not reading.is_set():
                with contextlib.suppress(Exception):
                    body.close()

    def put(
        self,
        key: str,
        body: bytes,
        *,
        if_match: str | None = None,
        if_absent: bool = False,
        content_type: str = "application/octet-stream",
    ) -> str:
        """PUT `key`; with `if_match` (an ETag) or `if_absent`, only under that condition
        (S3Conflict when it does not hold). Its new ETag."""
        if self._lean is not None and not (if_match or if_absent):
            self._count("put_object", sent=len(body))
            etag = self.within(lambda: self._lean_put(key, body, content_type), "put_object")
            if etag is not None:
                return etag
        extra: dict[str, str] = {}
        if if_match:
            extra["IfMatch"] = if_match
        elif if_absent:
            extra["IfNoneMatch"] = "*"
        answer = self._call(
            "put_object", key, Key=key, Body=body, ContentType=content_type, **extra
        )
        return str(answer.get("ETag", ""))

    def _lean_put(self, key: str, body: bytes, content_type: str) -> str | None:
        """A plain PUT without botocore: its ETag, or None when botocore is to make it."""
        assert self._lean is not None
        try:
            conn, response = self._lean.request(
                "PUT", key, {"Content-Type": content_type}, body, stop=self.deadline.passed
            )
        except lean.Declined:
            return None
        except lean.Failed as exc:
            raise self._fail(exc, key) from None
        ok = response.status == 200
        response.read()
        self._lean.release(conn, response)
        return (response.getheader("ETag") or "") if ok else None

    def put_file(self, key: str, f: BinaryIO, size: int) -> None:
        """PUT `key` from the `size` bytes of seekable file `f` (from its start), streamed:
        one request up to MULTIPART_BYTES, else a multipart upload of PART_BYTES parts (one
        part in memory at a time); an upload that fails is aborted."""
        if size <= MULTIPART_BYTES:
            f.seek(0)
            self._call("put_object", key, Key=key, Body=f)
            with self._lock:
                self.sent_bytes += size
            return
        started = self._call("create_multipart_upload", key, Key=key)
        upload = started["UploadId"]
        try:
            parts = []
            f.seek(0)
            for number in range(1, -(-size // PART_BYTES) + 1):
                body = f.read(PART_BYTES)
                answer = self._call("upload_part", key, Key=key, UploadId=upload,
                                    PartNumber=number, Body=body)  # fmt: skip
                parts.append({"ETag": answer["ETag"], "PartNumber": number})
                del body
            self._call("complete_multipart_upload", key, Key=key, UploadId=upload,
                       MultipartUpload={"Parts": parts})  # fmt: skip
        except BaseException:
            with contextlib.suppress(S3Unavailable, S3Missing, S3Conflict):
                self._call("abort_multipart_upload", key, Key=key, UploadId=upload)
            raise

    def delete(self, key: str) -> None:
        """Delete `key` (absent is fine)."""
        with contextlib.suppress(S3Missing):
            self._call("delete_object", key, Key=key)

    def versioning(self) -> str:
        """The bucket's versioning: `Enabled`, `Suspended`, `off` (never enabled), or
        `unknown` when it may not be read (s3:GetBucketVersioning)."""
        try:
            answer = self._call("get_bucket_versioning", "")
        except S3Unavailable:  # refused, or not implemented by this server
            return "unknown"
        return str(answer.get("Status") or "off")

    def versions(self, prefix: str) -> list[dict[str, Any]]:
        """Every version and delete marker under `prefix`: dicts with Key, VersionId, Latest,
        Marker (a delete marker), Size, LastModified (epoch seconds)."""
        found: list[dict[str, Any]] = []
        markers: dict[str, str] = {}
        while True:
            answer = self._call("list_object_versions", prefix, Prefix=prefix, **markers)
            for kind, marker in (("Versions", False), ("DeleteMarkers", True)):
                for item in answer.get(kind) or []:
                    found.append({
                        "Key": item["Key"], "VersionId": str(item.get("VersionId") or "null"),
                        "Latest": bool(item.get("IsLatest")), "Marker": marker,
                        "Size": int(item.get("Size") or 0),
                        "LastModified": item["LastModified"].timestamp(),
                    })  # fmt: skip
            if not answer.get("IsTruncated"):
                return found
            markers = {"KeyMarker": answer.get("NextKeyMarker") or "",
                       "VersionIdMarker": answer.get("NextVersionIdMarker") or ""}  # fmt: skip

    def delete_version(self, key: str, version: str) -> None:
        """Delete one version (or delete marker) of `key` for good (absent is fine)."""
        with contextlib.suppress(S3Missing):
            self._call("delete_object", key, Key=key, VersionId=version)

    def listing(self, prefix: str, first: int | None = None) -> list[dict[str, Any]]:
        """Every object under `prefix` (with `first`: the first `first` keys in key order,
        one request, and one more when there are more): dicts with Key, Size, LastModified
        (epoch seconds)."""
        found: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            extra: dict[str, Any] = {"ContinuationToken": token} if token else {}
            if first is not None:
                extra["MaxKeys"] = first + 1
            answer = self._listing_page(prefix, extra)
            for item in answer.get("Contents") or []:
                found.append(
                    {
                        "Key": item["Key"],
                        "Size": int(item.get("Size") or 0),
                        "LastModified": item["LastModified"].timestamp(),
                    }
                )
            if first is not None or not answer.get("IsTruncated"):
                return found
            token = answer.get("NextContinuationToken")

    def listing_upto(self, prefix: str, most: int) -> tuple[list[dict[str, Any]], bool]:
        """The first `most` objects under `prefix` in key order (as `listing` gives them),
        page after page (S3's pages hold up to 1,000 keys), and whether there are more: what
        a planted flood of keys costs a reader is bounded, and never hides the keys after
        it within `most`."""
        found: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            extra: dict[str, Any] = {"MaxKeys": min(1000, most - len(found) + 1)}
            if token:
                extra["ContinuationToken"] = token
            answer = self._listing_page(prefix, extra)
            for item in answer.get("Contents") or []:
                found.append({"Key": item["Key"], "Size": int(item.get("Size") or 0),
                              "LastModified": item["LastModified"].timestamp()})  # fmt: skip
            if len(found) > most:
                return found[:most], True
            token = answer.get("NextContinuationToken")
            if not answer.get("IsTruncated") or not token:
                return found, False
