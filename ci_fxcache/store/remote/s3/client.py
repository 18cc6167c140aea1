"""The S3 API as the S3 tier uses it: a few calls, bounded timeouts and retries, and errors
sorted into "the bucket is unusable" (warn, go local-only) and "an object is missing".

Every request goes through obstore (the Rust object_store crate's Python bindings): one
transport, ~0.02 s of CPU to import and make, SigV4, path-style custom endpoints, conditional
PUT and GET, multipart uploads (aborted by obstore when a part fails), retries with backoff,
and typed errors (a conflict, an unchanged object, a missing one, refused credentials are told
by their exception's type, never by a message). Endpoint, region and credentials come from the
standard AWS variables (`AWS_ENDPOINT_URL_S3` / `AWS_ENDPOINT_URL`, `AWS_REGION`, access keys
and session token, web identity, container credentials, `AWS_CA_BUNDLE`); only a profile
(`AWS_PROFILE` or a shared config or credentials file: SSO, credential_process, assumed
roles) makes the client ask boto3's credential chain (obstore.auth.boto3, imported then), and
only a versioned bucket's clean-up calls botocore (ListObjectVersions and deletes by version
id, which obstore lacks). No message of this module carries a credential: errors are reported
by their kind, S3 code and HTTP status.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, BinaryIO, TypeVar
from urllib.parse import urlsplit

from ci_fxcache.errors import UsageError
from ci_fxcache.store.remote.s3.deadline import (
    DEADLINE_ENV,
    Deadline,
    DeadlinePassed,
    configured_seconds,
)

URL_ENV = "FXCACHE_S3_URL"
OBJECT_URL_ENV = "FXCACHE_OBJECT_URL"
# The services an object-store URL may name (`--store object --object-url`): S3, GCS, Azure
# Blob Storage, each through obstore's store of that service, and a directory on a shared
# mount (`file:///PATH`: obstore's LocalStore).
SCHEMES = ("s3", "gs", "az", "file")
# file://: the lock files of conditional writes (LocalStore has no compare-and-swap on an
# existing object), a directory of the store root that listings leave out.
FILE_LOCKS = ".fxcache-locks"
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
# A ranged GET's body arrives in pieces of at least this many bytes (one frame is read whole).
_PIECE_BYTES = 1024 * 1024
# file://: fcntl locks belong to the process, so threads of one process (saves running side
# by side in it) are kept apart by this lock too, held around the lock file's.
_THREADS = threading.Lock()
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
    """A bucket (a GCS bucket, an Azure container) and a key prefix (no leading or trailing
    slash; may be empty); `scheme` names the service (SCHEMES)."""

    bucket: str
    prefix: str
    scheme: str = "s3"

    def url(self) -> str:
        """`SCHEME://BUCKET/PREFIX` (never holds a credential: these URLs have none);
        `file:///PATH` for a directory (its path is the bucket)."""
        return f"{self.scheme}://{self.bucket}/{self.prefix}".rstrip("/")

    def key(self, *parts: str) -> str:
        """An object key under the prefix."""
        return "/".join(p for p in (self.prefix, *parts) if p)


def parse_url(url: str, what: str = "--s3-url", schemes: tuple[str, ...] = ("s3",)) -> Location:
    """`SCHEME://BUCKET/PREFIX` (SCHEME one of `schemes`) -> Location; UsageError (the value
    is not repeated) otherwise."""
    split = urlsplit(url)
    if split.scheme == "file" and "file" in schemes and not (split.query or split.fragment):
        return _directory(split.netloc, split.path, what)
    if split.scheme not in schemes or not split.netloc or split.query or split.fragment:
        shown = " or ".join(
            "file:///PATH" if s == "file" else f"{s}://BUCKET/PREFIX" for s in schemes
        )
        raise UsageError(f"{what} is not an {shown} URL")
    if "@" in split.netloc or ":" in split.netloc:
        raise UsageError(
            f"{what}: put no credentials or port in the URL; they come from the service's "
            "variables (AWS_*, GOOGLE_*, AZURE_*: docs/store.md)"
        )
    if not _BUCKET.match(split.netloc):
        raise UsageError(f"{what}: {split.netloc!r} is not a valid bucket name")
    prefix = split.path.strip("/")
    if any(part in ("", ".", "..") for part in prefix.split("/")) and prefix:
        raise UsageError(f"{what}: the prefix has an empty, '.' or '..' part")
    return Location(split.netloc, prefix, split.scheme)


def _directory(host: str, path: str, what: str) -> Location:
    """`file:///PATH` (a directory, absolute, on this machine) -> Location with the path as
    its bucket and no prefix."""
    if host not in ("", "localhost"):
        raise UsageError(f"{what}: a file:// URL names a directory on this machine "
                         "(file:///PATH), not a host")  # fmt: skip
    parts = path.strip("/").split("/")
    if not path.startswith("/") or any(part in ("", ".", "..") for part in parts):
        raise UsageError(f"{what}: file:///PATH needs an absolute path without empty, '.' or "
                         "'..' parts")  # fmt: skip
    return Location("/" + "/".join(parts), "", "file")


def resolve_url(url: str | None) -> Location:
    """`--s3-url`, else `$FXCACHE_S3_URL`; UsageError when unset or malformed."""
    what = "--s3-url" if url else URL_ENV
    url = url or os.environ.get(URL_ENV) or None
    if not url:
        raise UsageError("the s3 store needs --s3-url s3://BUCKET/PREFIX (or FXCACHE_S3_URL)")
    return parse_url(url, what)


def resolve_object_url(url: str | None) -> Location:
    """`--object-url`, else `$FXCACHE_OBJECT_URL`: any service of SCHEMES; UsageError when
    unset or malformed."""
    what = "--object-url" if url else OBJECT_URL_ENV
    url = url or os.environ.get(OBJECT_URL_ENV) or None
    if not url:
        raise UsageError(
            "the object store needs --object-url s3://, gs:// or az://BUCKET/PREFIX, or "
            "file:///PATH "
            f"(or {OBJECT_URL_ENV})"
        )
    return parse_url(url, what, SCHEMES)


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


# The S3 error code and HTTP status in obstore's message of a failure obstore has no type for
# (a listing's failure, a 5xx after its retries): read only to phrase the warning ("does not
# exist", "credentials refused", "throttled"); what the tier does is decided by the type.
_CODE = re.compile(r"<Code>([A-Za-z]{1,64})</Code>")
_STATUS = re.compile(r"status code: (\d{3})")
# The variables a request header carries: a character no header may hold (a token read from a
# file with its line break) is refused before obstore sees it, naming the variable only.
_HEADER_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
# A GCS token renewal that failed inside obstore (gcs_auth.TokenRefused, whose line is safe).
_TOKEN_REFUSED = re.compile(r"credential provider: TokenRefused: ([^\n]*)")


def _describe(exc: BaseException) -> str:
    """One phrase for a failure: its kind, S3 code and HTTP status, never the request's
    headers (obstore's messages carry none; the phrase carries nothing else of them)."""
    text = str(exc)
    refused = _TOKEN_REFUSED.search(text)  # gcs_auth's own line, when a token renewal failed
    if refused:
        return refused.group(1)
    code, status = _CODE.search(text), _STATUS.search(text)
    parts = [code.group(1) if code else type(exc).__name__]
    if status:
        parts.append(f"(HTTP {status.group(1)})")
    return " ".join(parts)


_OS_ERROR = re.compile(r"([^:\n]*: [^:\n]*\(os error \d+\))")


def _file_error(exc: BaseException) -> str:
    """A LocalStore failure in one line: the OS's reason and the path (its message holds the
    path and `... (os error N)`), else the exception's kind."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror} ({exc.filename or 'the directory'})"
    found = _OS_ERROR.search(str(exc))
    return found.group(1).strip() if found else type(exc).__name__


def _header_safe(name: str) -> None:
    value = os.environ.get(name)
    if value and not all(" " <= c <= "~" for c in value):
        raise S3Unavailable(
            f"{name} holds a line break or another character no request header can carry "
            "(its value is not shown)"
        )


def _uses_profile() -> bool:
    """Whether credentials are to come from an AWS profile (boto3's chain: SSO,
    credential_process, assumed roles, the shared credentials file): `AWS_PROFILE`, or no key
    nor web identity in the environment and a shared config or credentials file present."""
    env = os.environ
    if env.get("AWS_PROFILE"):
        return True
    if env.get("AWS_ACCESS_KEY_ID") or env.get("AWS_WEB_IDENTITY_TOKEN_FILE"):
        return False
    if env.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI") or env.get(
        "AWS_CONTAINER_CREDENTIALS_FULL_URI"
    ):
        return False
    files = (
        env.get("AWS_CONFIG_FILE") or "~/.aws/config",
        env.get("AWS_SHARED_CREDENTIALS_FILE") or "~/.aws/credentials",
    )
    for name in files:
        with contextlib.suppress(OSError):
            if Path(name).expanduser().stat().st_size > 0:
                return True
    return False


def _profile_credentials() -> Any:
    """obstore's credential provider over boto3's chain (boto3 imported here only)."""
    try:
        import boto3
        from obstore.auth.boto3 import Boto3CredentialProvider

        return Boto3CredentialProvider(boto3.Session())
    except Exception as exc:  # a profile that does not exist, no credentials, ...
        raise S3Unavailable(f"S3 client not configured: {type(exc).__name__}") from None


def make_store(where: Location, connect: float, read: float, total: float) -> Any:
    """obstore's store of `where` (its scheme's service) from that service's variables;
    S3Unavailable (one line, no value of a variable) when they cannot make one."""
    if where.scheme != "s3":
        client = _client_options(connect, read, total, None)
        return _other_store(where, client, _retry(total), total)
    from obstore.store import S3Store

    for name in _HEADER_VARIABLES:
        _header_safe(name)
    env = os.environ
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None
    client = _client_options(connect, read, total, endpoint)
    bundle = env.get("AWS_CA_BUNDLE")
    if bundle:
        try:
            client["root_certificate"] = Path(bundle).read_bytes()
        except OSError as exc:
            raise S3Unavailable(f"AWS_CA_BUNDLE cannot be read ({type(exc).__name__})") from None
    config: Any = {
        "region": env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1",
        "conditional_put": "etag",
    }
    if endpoint:
        config["endpoint"] = endpoint
    provider = _profile_credentials() if _uses_profile() else None
    try:
        return S3Store(where.bucket, config=config, client_options=client,
                       retry_config=_retry(total), credential_provider=provider)  # fmt: skip
    except Exception as exc:  # obstore's configuration errors (a malformed endpoint, ...)
        raise S3Unavailable(f"S3 client not configured: {_describe(exc)}") from None


def _client_options(connect: float, read: float, total: float, endpoint: str | None) -> Any:
    """The HTTP client's timeouts and pool (every service alike)."""
    return {
        "connect_timeout": timedelta(seconds=connect),
        "read_timeout": timedelta(seconds=read),
        "timeout": timedelta(seconds=max(total, connect)),
        "pool_max_idle_per_host": str(POOL),
        "user_agent": "fxcache",
        "allow_http": bool(endpoint and endpoint.startswith("http://")),
    }


def _retry(total: float) -> Any:
    """MAX_ATTEMPTS tries with backoff, never past the operation's bound."""
    return {
        "max_retries": MAX_ATTEMPTS - 1,
        "retry_timeout": timedelta(seconds=total),
        "backoff": {"init_backoff": timedelta(seconds=0.1), "max_backoff": timedelta(seconds=5)},
    }


def _other_store(where: Location, client: Any, retry: Any, total: float) -> Any:
    """A GCS bucket (`gs://`: GOOGLE_APPLICATION_CREDENTIALS, GOOGLE_SERVICE_ACCOUNT*,
    GOOGLE_BEARER_TOKEN, GOOGLE_BASE_URL) or an Azure container (`az://`: AZURE_STORAGE_*,
    AZURE_CLIENT_ID with AZURE_FEDERATED_TOKEN_FILE, AZURE_USE_AZURE_CLI, the emulator's
    AZURE_STORAGE_USE_EMULATOR), each read by obstore itself; a GCS credentials file obstore
    cannot read (an `external_account` one) through google-auth (gcs_auth)."""
    from obstore.store import AzureStore, GCSStore

    env = os.environ
    if where.scheme == "file":
        return _directory_store(where)
    provider = _gcs_token_provider(env, total) if where.scheme == "gs" else None
    try:
        if where.scheme == "gs":
            base = env.get("GOOGLE_BASE_URL")
            client["allow_http"] = bool(base and base.startswith("http://"))
            return GCSStore(where.bucket, client_options=client, retry_config=retry,
                            credential_provider=provider)  # fmt: skip
        emulated = (env.get("AZURE_STORAGE_USE_EMULATOR") or "").lower() == "true"
        client["allow_http"] = emulated
        return AzureStore(where.bucket, client_options=client, retry_config=retry)
    except Exception as exc:  # obstore's configuration errors (no account, ...)
        raise S3Unavailable(f"{where.scheme}:// client not configured: {_describe(exc)}") from None


def _gcs_token_provider(env: Mapping[str, str], total: float) -> Any:
    """google-auth's tokens for a GOOGLE_APPLICATION_CREDENTIALS file obstore cannot read,
    the first one made here (so that a refused trade is one clear line, not obstore's
    `UnauthenticatedError` on the first request); None when obstore reads the credentials
    itself. S3Unavailable when the file cannot give a token or google-auth is missing."""
    from ci_fxcache.store.remote.s3 import gcs_auth

    try:
        info = gcs_auth.foreign_file(env)
        if info is None:
            return None
        kind = gcs_auth.kind_of(info)
        provider = gcs_auth.TokenProvider(info, total)
        provider()
    except ImportError:
        raise S3Unavailable(
            f"{gcs_auth.FILE_ENV} names a credentials file of type {kind!r}, which needs "
            f"google-auth ({gcs_auth.EXTRA}); or pass an access token as GOOGLE_BEARER_TOKEN "
            "(google-github-actions/auth with token_format: access_token gives one)"
        ) from None
    except gcs_auth.TokenRefused as exc:
        raise S3Unavailable(str(exc)) from None
    return provider


def _directory_store(where: Location) -> Any:
    """obstore's LocalStore on directory `where.bucket`, which must exist (a shared mount that
    is not mounted is unavailable, never a directory made on the runner's own disk)."""
    from obstore.store import LocalStore

    if not os.path.isdir(where.bucket):
        raise S3Unavailable(f"{where.url()} is not a directory (is the shared mount there?)")
    try:
        return LocalStore(where.bucket)
    except Exception as exc:  # a directory it cannot canonicalize (permissions)
        raise S3Unavailable(f"{where.url()} cannot be used: {_file_error(exc)}") from None


_OURS = (S3Unavailable, S3NotModified, S3Missing, S3Conflict, S3TooLarge)


class Bucket:
    """One bucket through one thread-safe obstore store (an S3Store made from the AWS
    variables, or `store`: any obstore store, the tests' in-memory one); every request
    within `deadline` (replaced per operation by `use`)."""

    def __init__(
        self, where: Location, deadline: Deadline | None = None, store: Any = None
    ) -> None:
        if importlib.util.find_spec("obstore") is None:
            raise S3Unavailable("the S3 client is not installed (pip install 'ci-fxcache[s3]')")
        import obstore

        self._obs = obstore
        self.deadline = deadline or Deadline(configured_seconds())
        connect, read = _timeouts()
        self.where = where
        self.requests: dict[str, int] = {}
        self._lock = threading.Lock()
        self.sent_bytes = 0
        self.received_bytes = 0
        # Only an S3 bucket has versions to clean up (versions(), through botocore).
        self._s3_api = store is None and where.scheme == "s3"
        # A directory (file://): conditional updates under a lock file (_put_locked), listings
        # sorted here (a directory walk has no key order).
        self._directory = where.scheme == "file"
        self._store = store if store is not None else make_store(
            where, self.deadline.capped(connect), self.deadline.capped(read),
            self.deadline.seconds)  # fmt: skip
        # The version (a GCS generation) of each (key, ETag) this client read or wrote: a
        # conditional PUT on GCS names the generation, on S3 and Azure the ETag.
        self._versions: dict[tuple[str, str], str] = {}
        self._botocore: Any = None  # a versioned bucket's clean-up only (versions())
        self._making = threading.Lock()

    def warm(self) -> None:
        """Nothing left to make ahead: kept for callers (the client is made with the bucket)."""

    def use(self, deadline: Deadline) -> None:
        """Bound every later request by `deadline` (one per restore, save or invalidate)."""
        self.deadline = deadline

    def within(self, work: Callable[[], T], what: str, deadline: Deadline | None = None) -> T:
        """`work()` (network I/O: a call, a body's read) within `deadline` when given, else the
        operation's; S3Unavailable when the bound is spent first."""
        try:
            return (deadline or self.deadline).run(work, what)
        except DeadlinePassed as exc:
            raise S3Unavailable(f"{exc} ({DEADLINE_ENV})") from None

    def _count(self, what: str, sent: int = 0, received: int = 0) -> None:
        with self._lock:  # transfers run on several threads
            self.requests[what] = self.requests.get(what, 0) + 1
            self.sent_bytes += sent
            self.received_bytes += received

    def _fail(self, exc: BaseException, key: str) -> BaseException:
        """The exception to raise for a failed request on `key`, by the type obstore raised
        (its message only phrases a warning: _describe)."""
        from obstore import exceptions as ox

        if isinstance(exc, ox.NotModifiedError):
            return S3NotModified(key)
        if isinstance(exc, FileNotFoundError):
            return S3Missing(key)
        if isinstance(exc, ox.AlreadyExistsError | ox.PreconditionError):
            return S3Conflict(key)
        if self._directory:  # no credential in a file system's errors: its reason is shown
            return S3Unavailable(f"{self.where.url()}: {_file_error(exc)}")
        described = _describe(exc)
        if isinstance(exc, ox.PermissionDeniedError | ox.UnauthenticatedError):
            return S3Unavailable(f"credentials refused: {described}")
        if described.startswith("NoSuchBucket"):
            return S3Unavailable(f"bucket {self.where.bucket!r} does not exist")
        if described.startswith(("SignatureDoesNotMatch", "InvalidAccessKeyId", "AccessDenied")):
            return S3Unavailable(f"credentials refused: {described}")
        if described.startswith(("SlowDown", "ServiceUnavailable")) or "(HTTP 503)" in described:
            return S3Unavailable(f"throttled: {described} after {MAX_ATTEMPTS} attempts")
        return S3Unavailable(f"request failed: {described}")

    def _call(
        self,
        what: str,
        key: str,
        work: Callable[[], T],
        sent: int = 0,
        deadline: Deadline | None = None,
    ) -> T:
        """One request (`work`, obstore's retries included) counted and within `deadline` when
        given, else the operation's; its failure as the tier's exception."""
        self._count(what, sent=sent)

        def request() -> T:
            try:
                return work()
            except (DeadlinePassed, *_OURS):
                raise
            except Exception as exc:  # obstore's errors (BaseError, FileNotFoundError, ...)
                raise self._fail(exc, key) from None

        return self.within(request, what, deadline)

    def get(
        self, key: str, if_none_match: str | None = None, *, limit: int
    ) -> tuple[bytes, str] | None:
        """(body, ETag) of `key`; None when it is unchanged from ETag `if_none_match`.
        S3Missing when absent; S3TooLarge when it is larger than `limit` bytes (refused by
        its size before the body is read)."""
        options: Any = {"if_none_match": if_none_match} if if_none_match else None

        def request() -> tuple[bytes, str] | None:  # the body's read is inside the bound too
            try:
                answer = self._obs.get(self._store, key, options=options)
            except Exception as exc:
                if isinstance(self._fail(exc, key), S3NotModified):
                    return None
                raise
            etag = str(answer.meta.get("e_tag") or "")
            self._seen(key, etag, answer.meta.get("version"))
            if int(answer.meta["size"]) > limit:
                raise S3TooLarge(key, etag)
            return bytes(answer.bytes()), etag

        got = self._call("get_object", key, request)
        if got is not None:
            with self._lock:
                self.received_bytes += len(got[0])
        return got

    @contextlib.contextmanager
    def get_range(self, key: str, start: int, end: int) -> Iterator[Callable[[int], Buffer]]:
        """Bytes `start` to `end` (exclusive) of `key`, streamed: yields `read(n)`, which
        returns n bytes (fewer only where the object ends). S3Missing when `key` is absent or
        ends before `start`; S3TooLarge when the answer would be longer than the range. The
        request and every read are within the deadline: a server that freezes mid-body costs
        at most what is left of it."""

        def request() -> Any:
            try:
                return self._obs.get(self._store, key, options={"range": (start, end)})
            except FileNotFoundError:
                raise
            except self._obs.exceptions.GenericError:  # 416: the object ends before `start`?
                if int(self._obs.head(self._store, key)["size"]) <= start:
                    raise FileNotFoundError(key) from None
                raise

        answer = self._call("get_object", key, request)
        first, last = answer.range
        if last - first > end - start:
            raise S3TooLarge(key)
        pieces = iter(answer.stream(min_chunk_size=_PIECE_BYTES))
        held = bytearray()

        def next_piece() -> bytes | None:
            try:
                return next(pieces, None)
            except Exception as exc:  # a connection dropped or timed out mid-body
                raise S3Unavailable(f"reading {key}: {_describe(exc)}") from None

        def read(n: int) -> Buffer:
            while len(held) < n:
                piece = self.within(next_piece, "get_object body")
                if piece is None:
                    break
                held.extend(memoryview(piece))
            out = bytes(held[:n])
            del held[:n]
            with self._lock:
                self.received_bytes += len(out)
            return out

        yield read

    def put(
        self,
        key: str,
        body: bytes,
        *,
        if_match: str | None = None,
        if_absent: bool = False,
        content_type: str = "application/octet-stream",
        deadline: Deadline | None = None,
    ) -> str:
        """PUT `key`; with `if_match` (an ETag) or `if_absent`, only under that condition
        (S3Conflict when it does not hold); within `deadline` instead of the operation's when
        given (a request beside the operation's own). Its new ETag."""
        if if_match and self._directory:
            return self._put_locked(key, body, if_match)
        mode: Any = "create" if if_absent else None
        if if_match:
            mode = {"e_tag": if_match}
            version = self._versions.get((key, if_match))
            if version:
                mode["version"] = version
        # LocalStore keeps no attributes (a Content-Type is for the services' consoles only)
        attributes = None if self._directory else {"Content-Type": content_type}
        answer = self._call("put_object", key, lambda: self._obs.put(
            self._store, key, body, mode=mode, use_multipart=False,
            attributes=attributes), sent=len(body), deadline=deadline)  # fmt: skip
        etag = str(answer.get("e_tag") or "")
        self._seen(key, etag, answer.get("version"))
        return etag

    def _put_locked(self, key: str, body: bytes, if_match: str) -> str:
        """A directory's conditional update, which LocalStore lacks: under an exclusive lock
        (a file of FILE_LOCKS, per key; fcntl locks, which NFSv4 and local disks honour,
        and _THREADS for this process's other threads, which fcntl does not hold off),
        S3Conflict unless `key`'s ETag is still `if_match`, else an atomic replace (LocalStore
        writes a staging file and renames it: a new inode, so a new ETag)."""
        import fcntl
        import hashlib

        locks = Path(self.where.bucket) / FILE_LOCKS
        name = hashlib.sha256(key.encode()).hexdigest()[:32]

        def update() -> Any:
            locks.mkdir(exist_ok=True)
            # Closing any descriptor of the file drops the process's fcntl lock on it: the
            # descriptor is opened and closed while _THREADS is held.
            with _THREADS:
                fd = os.open(locks / name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
                try:
                    fcntl.lockf(fd, fcntl.LOCK_EX)
                    return checked()
                finally:
                    os.close(fd)  # closing releases the lock

        def checked() -> Any:
            try:
                current = str(self._obs.head(self._store, key).get("e_tag") or "")
            except FileNotFoundError:  # removed meanwhile: S3 answers 412 too
                raise S3Conflict(key) from None
            if current != if_match:
                raise S3Conflict(key)
            return self._obs.put(self._store, key, body, use_multipart=False)

        answer = self._call("put_object", key, update, sent=len(body))
        return str(answer.get("e_tag") or "")

    def _seen(self, key: str, etag: str, version: str | None) -> None:
        if etag and version:
            with self._lock:
                self._versions[(key, etag)] = version

    def put_file(self, key: str, f: BinaryIO, size: int) -> None:
        """PUT `key` from the `size` bytes of seekable file `f` (from its start), streamed:
        one request up to MULTIPART_BYTES, else a multipart upload of PART_BYTES parts (one
        part read at a time); obstore aborts an upload whose part fails."""
        f.seek(0)
        multipart = size > MULTIPART_BYTES
        what = "create_multipart_upload" if multipart else "put_object"
        self._call(what, key, lambda: self._obs.put(
            self._store, key, f, use_multipart=multipart, chunk_size=PART_BYTES,
            max_concurrency=1))  # fmt: skip
        if multipart:  # the requests obstore made: its parts, and the completion
            for _ in range(-(-size // PART_BYTES)):
                self._count("upload_part")
            self._count("complete_multipart_upload")
        with self._lock:
            self.sent_bytes += size

    def delete(self, key: str) -> None:
        """Delete `key` (absent is fine)."""
        with contextlib.suppress(S3Missing):
            self._call("delete_object", key, lambda: self._obs.delete(self._store, key))

    def listing(self, prefix: str, first: int | None = None) -> list[dict[str, Any]]:
        """Every object under `prefix` (a `/`-ended key prefix; with `first`: the first
        `first` keys in key order, and one more when there are more): dicts with Key, Size,
        LastModified (epoch seconds). Keys are the server's, as it sent them (obstore asks
        for no URL encoding and decodes none)."""
        limit = None if first is None else first + 1
        ordered = not self._directory  # a directory is walked whole, then sorted

        def request() -> list[dict[str, Any]]:
            found: list[dict[str, Any]] = []
            for chunk in self._obs.list(self._store, prefix or None, chunk_size=1000):
                for item in chunk:
                    if not ordered and item["path"].startswith(FILE_LOCKS + "/"):
                        continue
                    found.append({"Key": item["path"], "Size": int(item["size"]),
                                  "LastModified": item["last_modified"].timestamp()})  # fmt: skip
                    if ordered and limit is not None and len(found) >= limit:
                        return found
            if not ordered:
                found.sort(key=lambda item: item["Key"])
            return found if limit is None else found[:limit]

        return self._call("list_objects_v2", prefix, request)

    def listing_upto(self, prefix: str, most: int) -> tuple[list[dict[str, Any]], bool]:
        """The first `most` objects under `prefix` in key order (as `listing` gives them),
        page after page, and whether there are more: what a planted flood of keys costs a
        reader is bounded, and never hides the keys after it within `most`."""
        found = self.listing(prefix, first=most)
        return (found[:most], True) if len(found) > most else (found, False)

    # -- a versioned bucket's clean-up: botocore, which alone has these calls --------------------
    @property
    def _s3(self) -> Any:
        """botocore's client (versioned-bucket clean-up only), made on first use."""
        with self._making:
            if self._botocore is None:
                self._botocore = self._make_botocore()
        return self._botocore

    def _make_botocore(self) -> Any:
        if importlib.util.find_spec("botocore") is None:
            raise S3Unavailable("a versioned bucket's clean-up needs botocore (pip install boto3)")
        import botocore.session
        from botocore.config import Config

        connect, read = _timeouts()
        config = Config(connect_timeout=connect, read_timeout=read,
                        retries={"total_max_attempts": MAX_ATTEMPTS, "mode": "standard"},
                        user_agent_extra="fxcache")  # fmt: skip
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        try:
            made = botocore.session.get_session().create_client(
                "s3", config=config, region_name=region or "us-east-1"
            )
        except Exception as exc:  # botocore's configuration errors (a bad profile, ...)
            raise S3Unavailable(f"S3 client not configured: {type(exc).__name__}") from None
        made.meta.events.register("before-send.s3", self._before_send)
        return made

    def _before_send(self, **event: Any) -> None:
        self.deadline.refuse_if_passed(**event)

    def _botocore_call(self, what: str, key: str, **kwargs: Any) -> Any:
        def request() -> Any:
            try:
                return getattr(self._s3, what)(Bucket=self.where.bucket, **kwargs)
            except (DeadlinePassed, S3Unavailable):
                raise
            except Exception as exc:  # botocore's ClientError, BotoCoreError
                raise _botocore_fail(exc, key) from None

        self._count(what)
        return self.within(request, what)

    def versioning(self) -> str:
        """The bucket's versioning: `Enabled`, `Suspended`, `off` (never enabled), or
        `unknown` when it may not be read (s3:GetBucketVersioning); `off` for a store
        that is not S3."""
        if not self._s3_api:
            return "off"
        try:
            answer = self._botocore_call("get_bucket_versioning", "")
        except S3Unavailable:  # refused, or not implemented by this server
            return "unknown"
        return str(answer.get("Status") or "off")

    def versions(self, prefix: str) -> list[dict[str, Any]]:
        """Every version and delete marker under `prefix`: dicts with Key, VersionId, Latest,
        Marker (a delete marker), Size, LastModified (epoch seconds)."""
        found: list[dict[str, Any]] = []
        markers: dict[str, str] = {}
        while True:
            answer = self._botocore_call("list_object_versions", prefix, Prefix=prefix, **markers)
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
            self._botocore_call("delete_object", key, Key=key, VersionId=version)


def _botocore_fail(exc: BaseException, key: str) -> BaseException:
    """A botocore failure of the versioned clean-up: S3Missing for a 404, else S3Unavailable
    by its S3 code and HTTP status (botocore's structured answer)."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return S3Unavailable(type(exc).__name__)
    status = int((response.get("ResponseMetadata") or {}).get("HTTPStatusCode") or 0)
    code = str((response.get("Error") or {}).get("Code") or "error")
    if status == 404 and code != "NoSuchBucket":
        return S3Missing(key)
    return S3Unavailable(f"{code} (HTTP {status})" if status else code)
