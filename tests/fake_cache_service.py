"""A local stand-in for GitHub's Actions cache service v2 and the Azure blob storage behind it.

Strict on purpose, like tests/fake_github.py: every request is checked against the protocol
actions/toolkit speaks (packages/cache: cacheTwirpClient.ts, the generated Twirp JSON client,
uploadUtils.ts via the Azure SDK) and anything off is recorded in `violations` (tests assert it
stays empty) and answered with an error.

- Twirp: `POST /twirp/github.actions.results.api.v1.CacheService/<Method>`,
  `Content-Type: application/json`, `Authorization: Bearer <runtime token>`, a JSON object
  body with the proto field names (`restore_keys`, `size_bytes` as an int64 string) and the
  documented fields only; errors answer `{"code", "msg"}` with the Twirp status.
- Blobs: the signed URLs point back here (`/blob/<n>?sv=..&sig=..`); Put Blob needs
  `x-ms-blob-type: BlockBlob`, every request `x-ms-version`; Put Block (`comp=block`,
  base64 `blockid`) and Put Block List (`comp=blocklist`, XML) assemble larger blobs.
"""

from __future__ import annotations

import base64
import json
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.local_server import LocalServer

SERVICE = "github.actions.results.api.v1.CacheService"
FIELDS = {
    "CreateCacheEntry": {"metadata", "key", "version"},
    "FinalizeCacheEntryUpload": {"metadata", "key", "size_bytes", "version"},
    "GetCacheEntryDownloadURL": {"metadata", "key", "restore_keys", "version"},
}
TWIRP_STATUS = {"invalid_argument": 400, "unauthenticated": 401, "permission_denied": 403,
                "not_found": 404, "already_exists": 409, "failed_precondition": 412}  # fmt: skip


@dataclass
class Entry:
    key: str
    version: str
    blob: int
    size: int = 0
    finalized: bool = False
    order: int = 0


@dataclass
class Blob:
    data: bytes | None = None
    blocks: dict[str, bytes] = field(default_factory=dict)


class FakeCacheService(LocalServer):
    """The server plus its state; a context manager. `env()` gives the runtime variables."""

    def __init__(self, token: str = "fake-runtime-token") -> None:
        self.token = token
        self.read_only = False  # a read-only cache token (untrusted triggers since 2026-06)
        self.entries: list[Entry] = []
        self.blobs: dict[int, Blob] = {}
        self.requests: list[tuple[str, str]] = []
        self.violations: list[str] = []
        super().__init__()

    def env(self) -> dict[str, str]:
        """What the runner gives a JavaScript action's environment."""
        return {
            "ACTIONS_RESULTS_URL": f"{self.url}/",
            "ACTIONS_RUNTIME_TOKEN": self.token,
            "ACTIONS_CACHE_SERVICE_V2": "True",
        }

    def committed(self) -> list[Entry]:
        return [e for e in self.entries if e.finalized]

    def blob_bytes(self, entry: Entry) -> bytes:
        data = self.blobs[entry.blob].data
        assert data is not None
        return data

    def calls(self, method: str) -> int:
        return sum(1 for _, path in self.requests if path.endswith(f"/{method}"))

    # -- HTTP ---------------------------------------------------------------------------------
    def _send(self, h: BaseHTTPRequestHandler, status: int, body: Any = None,
              content_type: str = "application/json", headers: dict[str, str] | None = None
              ) -> None:  # fmt: skip
        data = (
            b"" if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
        )
        h.send_response(status)
        h.send_header("Content-Type", content_type)
        h.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(data)

    def _twirp_error(self, h: BaseHTTPRequestHandler, code: str, msg: str) -> None:
        self._send(h, TWIRP_STATUS[code], {"code": code, "msg": msg})

    def _violation(self, h: BaseHTTPRequestHandler, text: str, status: int = 400) -> None:
        self.violations.append(f"{h.command} {h.path}: {text}")
        if urlsplit(h.path).path.startswith("/twirp/"):
            self._send(h, status, {"code": "malformed", "msg": text})
        else:
            self._send(h, status, None)

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        split = urlsplit(h.path)
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        with self._lock:
            self.requests.append((h.command, split.path))
            if split.path.startswith("/twirp/"):
                return self._twirp(h, split.path, raw)
            match = re.fullmatch(r"/blob/(\d+)", split.path)
            if match:
                return self._blob(h, int(match[1]), parse_qs(split.query), raw)
            return self._violation(h, "no such endpoint", 404)

    # -- Twirp ----------------------------------------------------------------------------------
    def _twirp(self, h: BaseHTTPRequestHandler, path: str, raw: bytes) -> None:
        method = path.rsplit("/", 1)[-1]
        if h.command != "POST":
            return self._violation(h, "Twirp calls are POST", 405)
        if path != f"/twirp/{SERVICE}/{method}" or method not in FIELDS:
            return self._violation(h, f"no such method {path}", 404)
        if h.headers.get("Content-Type") != "application/json":
            return self._violation(h, "Content-Type must be application/json (Twirp JSON)")
        if h.headers.get("Authorization") != f"Bearer {self.token}":
            self.violations.append(f"POST {path}: bad or missing bearer runtime token")
            return self._twirp_error(h, "unauthenticated", "invalid token")
        try:
            body = json.loads(raw)
        except ValueError:
            return self._violation(h, "body is not JSON")
        if not isinstance(body, dict) or not set(body) <= FIELDS[method]:
            return self._violation(
                h, f"unexpected fields {sorted(body) if isinstance(body, dict) else body}"
            )
        key, version = body.get("key"), body.get("version")
        if not isinstance(key, str) or not key or len(key) > 512 or "," in key:
            return self._violation(h, f"bad key {key!r}")
        if not isinstance(version, str) or not re.fullmatch(r"[0-9a-f]{64}", version):
            return self._violation(h, f"version must be a sha256 hex digest, got {version!r}")
        handlers = {"CreateCacheEntry": self._create, "FinalizeCacheEntryUpload": self._finalize,
                    "GetCacheEntryDownloadURL": self._lookup}  # fmt: skip
        return handlers[method](h, body)

    def _create(self, h: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        if self.read_only:
            return self._twirp_error(h, "permission_denied", "cache write denied: read-only token")
        if any(e.key == body["key"] and e.version == body["version"] for e in self.entries):
            return self._twirp_error(h, "already_exists", "cache entry already exists")
        blob = len(self.blobs) + 1
        self.blobs[blob] = Blob()
        self.entries.append(Entry(body["key"], body["version"], blob, order=len(self.entries)))
        url = f"{self.url}/blob/{blob}?sv={'2024-11-04'}&sp=cw&sig=signed{blob}"
        self._send(h, 200, {"ok": True, "signed_upload_url": url})

    def _finalize(self, h: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        size = body.get("size_bytes")
        if not isinstance(size, str) or not size.isdigit():
            return self._violation(h, f"size_bytes must be an int64 string, got {size!r}")
        entry = next((e for e in self.entries if e.key == body["key"] and
                      e.version == body["version"] and not e.finalized), None)  # fmt: skip
        if entry is None:
            return self._twirp_error(h, "not_found", "no reserved cache entry")
        data = self.blobs[entry.blob].data
        if data is None or len(data) != int(size):
            return self._violation(h, f"size_bytes {size} but the blob holds "
                                      f"{None if data is None else len(data)} bytes")  # fmt: skip
        entry.size, entry.finalized = int(size), True
        self._send(h, 200, {"ok": True, "entry_id": str(1000 + entry.blob)})

    def _lookup(self, h: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        prefixes = body.get("restore_keys", [])
        if not isinstance(prefixes, list) or not all(isinstance(p, str) and p for p in prefixes):
            return self._violation(h, f"restore_keys must be a list of keys, got {prefixes!r}")
        if len(prefixes) + 1 > 10:
            return self._violation(h, "at most 10 keys")
        ours = [e for e in self.committed() if e.version == body["version"]]
        found = next((e for e in ours if e.key == body["key"]), None)
        for prefix in prefixes:
            if found is None:
                matches = [e for e in ours if e.key.startswith(prefix)]
                found = max(matches, key=lambda e: e.order) if matches else None
        if found is None:
            return self._send(h, 200, {})  # ok false: proto3 JSON leaves defaults out
        url = f"{self.url}/blob/{found.blob}?sv=2024-11-04&sp=r&sig=signed{found.blob}"
        self._send(h, 200, {"ok": True, "signed_download_url": url, "matched_key": found.key})

    # -- Azure blobs ------------------------------------------------------------------------------
    def _blob(
        self, h: BaseHTTPRequestHandler, n: int, query: dict[str, list[str]], raw: bytes
    ) -> None:
        if query.get("sig") != [f"signed{n}"] or n not in self.blobs:
            return self._violation(h, "blob URL without its signature", 403)
        if not h.headers.get("x-ms-version"):
            return self._violation(h, "x-ms-version header missing")
        if "Authorization" in h.headers:
            return self._violation(h, "the runtime token must not go to the blob store")
        blob = self.blobs[n]
        comp = query.get("comp", [""])[0]
        if h.command == "GET" and not comp:
            if blob.data is None:
                return self._violation(h, "blob not uploaded", 404)
            return self._send(h, 200, blob.data, "application/octet-stream",
                              {"x-ms-blob-type": "BlockBlob"})  # fmt: skip
        if h.command != "PUT":
            return self._violation(h, f"unexpected {h.command}", 405)
        if query.get("sp") != ["cw"]:
            return self._violation(h, "writing through a read-only URL", 403)
        if not comp:
            if h.headers.get("x-ms-blob-type") != "BlockBlob":
                return self._violation(h, "Put Blob needs x-ms-blob-type: BlockBlob")
            blob.data = raw
            return self._send(h, 201, None)
        if comp == "block":
            block = query.get("blockid", [""])[0]
            try:
                base64.b64decode(block, validate=True)
            except ValueError:
                return self._violation(h, f"blockid {block!r} is not base64")
            if not block or any(len(b) != len(block) for b in blob.blocks):
                return self._violation(h, "block ids must be non-empty and of equal length")
            blob.blocks[block] = raw
            return self._send(h, 201, None)
        if comp == "blocklist":
            try:
                ids = [el.text or "" for el in ET.fromstring(raw) if el.tag == "Latest"]
            except ET.ParseError:
                return self._violation(h, "block list is not XML")
            if not ids or any(i not in blob.blocks for i in ids):
                return self._violation(h, "block list names a block never put")
            blob.data = b"".join(blob.blocks[i] for i in ids)
            return self._send(h, 201, None)
        return self._violation(h, f"unexpected comp={comp}")
