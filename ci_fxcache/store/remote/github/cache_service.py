"""GitHub's Actions cache service (v2, the one actions/cache speaks), spoken by the toolkit.

The end-of-job save runs in a JavaScript action's post step, where actions/cache cannot be
called, so the toolkit uploads and restores `store: github` entries itself. Protocol (read
from the public actions/toolkit sources): Twirp JSON calls to
`$ACTIONS_RESULTS_URL/twirp/github.actions.results.api.v1.CacheService/<Method>` with the
job's `ACTIONS_RUNTIME_TOKEN` as bearer token; `CreateCacheEntry` returns a signed Azure blob
URL, the archive is uploaded there (Put Blob, or Put Block + Put Block List when large), and
`FinalizeCacheEntryUpload` commits it; `GetCacheEntryDownloadURL` finds the entry by exact key
or, failing that, the newest entry whose key starts with a restore key. Only JavaScript (and
container) actions receive those variables; `run:` steps do not.

Entries are ours alone (one scope under our own `version`), so both directions live here;
actions/cache never reads them. The legacy v1 service (`_apis/artifactcache`, still the only
one on GitHub Enterprise Server) is not spoken.

Archive: the remote tiers' pack format as one stream (store.remote.github.archive), written
from the committed scope and unpacked while it downloads, by measurement: a gzip tar decoded
at ~60 MB/s on one core here and was most of a restore; a zstd tar left tarfile's work per
member as most of it (benchmarks/bench_github.py). Entries of the earlier formats (gzip tar,
zstd tar) have another `version`, so the service never offers them: they are foreign, and
the next save writes the new format.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO
from urllib.parse import urlsplit, urlunsplit

from ci_fxcache import __version__
from ci_fxcache.errors import FxcacheError
from ci_fxcache.store import manifest as mf
from ci_fxcache.store.remote.github import archive

if TYPE_CHECKING:
    import requests

SERVICE = "github.actions.results.api.v1.CacheService"
# Our archive format and its version string: entries of another format never match
# ("fxcache-scope/1|tar|gzip" and "fxcache-scope/2|tar|zstd" before this one).
ARCHIVE_FORMAT = "fxcache-scope/3|packs|zstd"
ENTRY_VERSION = hashlib.sha256(ARCHIVE_FORMAT.encode()).hexdigest()
AZURE_API_VERSION = "2024-11-04"
SINGLE_SHOT_BYTES = 128 * 1024 * 1024  # larger archives go up in blocks, like actions/cache
BLOCK_BYTES = 64 * 1024 * 1024
MAX_KEY_LENGTH = 512
MAX_KEYS = 10


class CacheServiceError(FxcacheError):
    """A cache service or blob request that failed for good; `status`: the service's HTTP
    status, when it answered one."""

    exit_code = 1

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ArchiveUnusable(CacheServiceError):
    """An entry that downloaded but is not an archive a save wrote, or whose bytes do not
    match its manifest: the remote copy is broken (never the network's fault)."""


@dataclass(frozen=True)
class Runtime:
    """Where the job's cache service is and the token for it."""

    results_url: str
    token: str


def runtime(env: Mapping[str, str] | None = None) -> tuple[Runtime | None, str | None]:
    """The cache service of this step, or None and why not (the one place that decides)."""
    env = os.environ if env is None else env
    url, token = env.get("ACTIONS_RESULTS_URL", ""), env.get("ACTIONS_RUNTIME_TOKEN", "")
    if not url or not token:
        return None, (
            "no Actions cache service in this step's environment (ACTIONS_RESULTS_URL, "
            "ACTIONS_RUNTIME_TOKEN): the runner gives them to JavaScript actions only"
        )
    if not env.get("ACTIONS_CACHE_SERVICE_V2"):
        return None, (
            "this runner offers only the legacy cache service (v1, e.g. GitHub Enterprise "
            "Server), which fxcache does not speak: use store local there"
        )
    return Runtime(url, token), None


def check_key(key: str) -> None:
    """Keys as the service accepts them: at most 512 characters, no comma."""
    if not key or len(key) > MAX_KEY_LENGTH or "," in key:
        raise CacheServiceError(f"cache key {key!r} is empty, longer than 512, or has a comma")


class CacheService:
    """Twirp JSON client of the cache service plus the signed-URL blob transfers."""

    def __init__(
        self,
        where: Runtime,
        *,
        max_attempts: int = 5,
        backoff_s: float = 3.0,
        timeout_s: float = 60.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        import requests

        self._base = where.results_url
        self._token = where.token
        self._max_attempts = max_attempts
        self._backoff_s = backoff_s
        self._timeout_s = timeout_s
        self._sleep = sleep
        self._session = requests.Session()
        self._session.headers["User-Agent"] = f"fxcache/{__version__}"

    def _url(self, method: str) -> str:
        split = urlsplit(self._base)  # the method path replaces any path of the base URL
        return urlunsplit((split.scheme, split.netloc, f"/twirp/{SERVICE}/{method}", "", ""))

    def _retrying(self, what: str, send: Callable[[], requests.Response]) -> requests.Response:
        """`send()` until a final answer: 5xx and connection errors retry with backoff."""
        import requests

        for attempt in range(self._max_attempts):
            try:
                response = send()
            except requests.RequestException as exc:
                problem = type(exc).__name__
            else:
                if response.status_code < 500:
                    return response
                problem = f"HTTP {response.status_code}"
            if attempt + 1 < self._max_attempts:
                self._sleep(self._backoff_s * 1.5**attempt)
        raise CacheServiceError(f"{what}: {problem} after {self._max_attempts} attempts")

    def call(self, method: str, body: dict[str, Any]) -> dict[str, Any]:
        """One Twirp call; CacheServiceError on a Twirp error (`{"code", "msg"}`)."""
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            "Authorization": f"Bearer {self._token}",
        }
        response = self._retrying(
            method,
            lambda: self._session.post(
                self._url(method), json=body, headers=headers, timeout=self._timeout_s
            ),
        )
        try:
            answer = response.json()
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise CacheServiceError(
                f"{method}: HTTP {response.status_code}, not a JSON object", response.status_code
            )
        if response.status_code >= 300:
            msg = answer.get("msg") or answer.get("code") or "error"
            raise CacheServiceError(
                f"{method}: HTTP {response.status_code}: {msg}", response.status_code
            )
        return answer

    def lookup(self, key: str, restore_keys: list[str]) -> tuple[str, str] | None:
        """(signed download URL, matched key) of the exact key or the newest entry whose key
        starts with a restore key; None when there is none."""
        for k in [key, *restore_keys]:
            check_key(k)
        if len(restore_keys) + 1 > MAX_KEYS:
            raise CacheServiceError(f"at most {MAX_KEYS} keys per lookup")
        body = {"key": key, "restore_keys": restore_keys, "version": ENTRY_VERSION}
        answer = self.call("GetCacheEntryDownloadURL", body)
        if not answer.get("ok"):
            return None
        return str(answer["signed_download_url"]), str(answer.get("matched_key") or key)

    def create(self, key: str) -> str | None:
        """Reserve `key`: the signed upload URL, or None when the key exists (entries are
        immutable) or the service refused with a reason it gave."""
        check_key(key)
        try:
            answer = self.call("CreateCacheEntry", {"key": key, "version": ENTRY_VERSION})
        except CacheServiceError as exc:
            if exc.status == 409:  # the key exists
                return None
            raise
        if not answer.get("ok"):
            return None
        return str(answer["signed_upload_url"])

    def finalize(self, key: str, size: int) -> int:
        """Commit the uploaded archive of `size` bytes; the entry id."""
        body = {"key": key, "size_bytes": str(size), "version": ENTRY_VERSION}
        answer = self.call("FinalizeCacheEntryUpload", body)
        if not answer.get("ok"):
            raise CacheServiceError(f"FinalizeCacheEntryUpload refused: {answer.get('message')}")
        return int(answer.get("entry_id") or 0)

    # -- Azure blob transfers (the signed URLs carry their own authorization) ----------------
    def _blob(self, method: str, url: str, **kwargs: Any) -> requests.Response:
        headers = {"x-ms-version": AZURE_API_VERSION, **kwargs.pop("headers", {})}
        response = self._retrying(
            f"blob {method}",
            lambda: self._session.request(
                method, url, headers=headers, timeout=self._timeout_s, **kwargs
            ),
        )
        if response.status_code >= 300:
            raise CacheServiceError(f"blob {method}: HTTP {response.status_code}")
        return response

    def upload(self, url: str, archive: Path) -> None:
        """Put Blob for an archive up to SINGLE_SHOT_BYTES, else Put Block per BLOCK_BYTES +
        Put Block List; the body is read from the file as it is sent, never held whole."""
        size = archive.stat().st_size
        with archive.open("rb") as f:
            if size <= SINGLE_SHOT_BYTES:
                headers = {"x-ms-blob-type": "BlockBlob", "Content-Type": _OCTETS}
                self._blob("PUT", url, data=_Slice(f, 0, size), headers=headers)
                return
            ids = []
            for index, start in enumerate(range(0, size, BLOCK_BYTES)):
                block = base64.b64encode(f"{index:08d}".encode()).decode()
                ids.append(block)
                body = _Slice(f, start, min(BLOCK_BYTES, size - start))
                self._blob("PUT", url, params={"comp": "block", "blockid": block}, data=body,
                           headers={"Content-Type": _OCTETS})  # fmt: skip
        xml = "".join(f"<Latest>{b}</Latest>" for b in ids)
        body_xml = f'<?xml version="1.0" encoding="utf-8"?><BlockList>{xml}</BlockList>'
        self._blob("PUT", url, params={"comp": "blocklist"}, data=body_xml.encode(),
                   headers={"Content-Type": "application/xml"})  # fmt: skip

    @contextlib.contextmanager
    def reading(self, url: str) -> Iterator[Callable[[int], bytes]]:
        """Get Blob, streamed: yields `read(n)`, which returns n bytes (fewer only where the
        blob ends); CacheServiceError when the connection fails in the middle."""
        import urllib3

        response = self._blob("GET", url, stream=True)

        def read(n: int) -> bytes:
            pieces: list[bytes] = []
            got = 0
            while got < n:
                try:
                    piece = response.raw.read(n - got)
                except (urllib3.exceptions.HTTPError, OSError) as exc:
                    raise CacheServiceError(f"blob GET: {type(exc).__name__} mid-body") from None
                if not piece:
                    break
                pieces.append(piece)
                got += len(piece)
            return pieces[0] if len(pieces) == 1 else b"".join(pieces)

        try:
            yield read
        finally:
            response.close()


_OCTETS = "application/octet-stream"


class _Slice:
    """Bytes `start` .. `start + length` of an open file as a request body that is read as
    it is sent (a retry reads it again from its start)."""

    def __init__(self, f: BinaryIO, start: int, length: int) -> None:
        self._f, self._start, self._length = f, start, length
        self._at = 0

    def __len__(self) -> int:  # requests sends it with a Content-Length, not chunked
        return self._length

    def __iter__(self) -> Iterator[bytes]:
        self._at = 0
        while self._at < self._length:
            self._f.seek(self._start + self._at)
            piece = self._f.read(min(1 << 20, self._length - self._at))
            if not piece:
                return
            self._at += len(piece)
            yield piece


_RUN_PART = re.compile(r"run[0-9]+\.[0-9]+")


def entry_key(prefix: str, run_id: str, attempt: str) -> str:
    """The unique key a run saves under: the scope's prefix (scope key, key suffix) and
    `run<id>.<attempt>`."""
    return f"{prefix}run{run_id}.{attempt}"


def entry_of(matched: str, key: str, prefixes: list[str]) -> bool:
    """Is `matched` the exact key, or a prefix followed by nothing but `run<id>.<attempt>`?
    The service matches by prefix only: `<scope>-` also matches `<scope>-modelB-run1.1`,
    and `<scope>-modelB-` matches `<scope>-modelB-x-run1.1`; neither is this job's entry."""
    return matched == key or any(
        matched.startswith(p) and _RUN_PART.fullmatch(matched[len(p) :]) for p in prefixes
    )


@dataclass(frozen=True)
class Restored:
    """An entry restored: its key, and what its archive wrote (archive.Unpacked)."""

    matched: str
    unpacked: archive.Unpacked


def save_directory(
    service: CacheService, directory: Path, key: str, committed: mf.Committed | None = None
) -> dict[str, Any]:
    """Upload committed scope `directory` (manifest `committed`: archive.write) as a new entry
    `key`: {"uploaded": bool, "key", "bytes"?, "reason"?}. CacheServiceError when the scope
    is not as its manifest says."""
    url = service.create(key)
    if url is None:
        return {"uploaded": False, "key": key, "reason": "the key exists or was refused"}
    with tempfile.TemporaryDirectory(prefix="fxcache-upload-") as tmp:
        path = Path(tmp) / "scope.fxscope"
        try:
            size = archive.write(directory, path, committed)
        except archive.ArchiveError as exc:
            raise CacheServiceError(f"not uploaded: {exc}") from None
        service.upload(url, path)
        entry = service.finalize(key, size)
    return {"uploaded": True, "key": key, "bytes": size, "entry_id": entry}


def restore_directory(
    service: CacheService, directory: Path, key: str, restore_keys: list[str]
) -> Restored | None:
    """Download the entry for `key` (else the newest by prefix) into `directory`, which must
    not exist yet, unpacking it as it arrives; None for no entry. A download or an archive
    that fails half-way leaves nothing behind."""
    found = service.lookup(key, restore_keys)
    if found is None:
        return None
    url, matched = found
    if not entry_of(matched, key, restore_keys):
        raise CacheServiceError(
            f"the newest entry under the prefix, {matched}, has a longer key suffix than this "
            "job's (another workflow's): not restoring it"
        )
    directory.parent.mkdir(parents=True, exist_ok=True)
    try:
        with service.reading(url) as read:
            unpacked = archive.extract(read, directory)
    except archive.ArchiveError as exc:
        _remove(directory)
        raise ArchiveUnusable(f"unusable cache archive: {exc}") from None
    except BaseException:
        _remove(directory)
        raise
    return Restored(matched, unpacked)


def _remove(directory: Path) -> None:
    """What a failed restore wrote (read-only files in writable directories)."""
    if os.path.lexists(directory):
        shutil.rmtree(directory, ignore_errors=True)
