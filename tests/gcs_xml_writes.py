"""What fake-gcs-server lacks to take a save: GCS's XML-API object PUT, obstore's every
write. fake-gcs-server serves the XML API's reads, listings and deletes, but answers a PUT
with 400 unless it is a signed-URL upload, which ignores preconditions. This relay sits in
front of it and turns that one request into the JSON API's multipart upload, where the
emulator checks the precondition itself:

    PUT /BUCKET/OBJECT            x-goog-if-generation-match: G (optional; 0: must not exist)
 -> POST /upload/storage/v1/b/BUCKET/o?uploadType=multipart&name=OBJECT&ifGenerationMatch=G

and answers as GCS's XML API does (https://cloud.google.com/storage/docs/xml-api/put-object-upload):
200 with the object's `ETag` and `x-goog-generation`, or 412 with an XML error. Every other
request goes through unchanged. What it refuses (501): the XML multipart upload (`?uploads`,
`?uploadId=`) and a copy (`x-goog-copy-source`), which the tests here never send; it decides
nothing itself: the generation check and the stored bytes are the emulator's."""

from __future__ import annotations

import http.client
import json
import uuid
from http.server import BaseHTTPRequestHandler
from urllib.parse import quote, unquote, urlsplit

from tests.local_server import LocalServer

_HOP = {"host", "connection", "transfer-encoding", "content-length"}


class GcsXmlWrites(LocalServer):
    """The relay, in front of the fake-gcs-server at `upstream`. `puts` counts the PUTs it
    turned into uploads and `refused` the 412s the emulator answered them with."""

    def __init__(self, upstream: str) -> None:
        super().__init__()
        self.upstream = urlsplit(upstream)
        self.puts = 0
        self.refused = 0

    def _ahead(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str]
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(self.upstream.hostname or "", self.upstream.port,
                                          timeout=30)  # fmt: skip
        try:
            conn.request(method, path, body=body, headers=headers)
            answer = conn.getresponse()
            return answer.status, answer.getheaders(), answer.read()
        finally:
            conn.close()

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        if h.command == "PUT":
            status, headers, data = self._put(h, body)
        else:
            sent = {k: v for k, v in h.headers.items() if k.lower() not in _HOP}
            status, headers, data = self._ahead(h.command, h.path, body or None, sent)
        h.send_response(status)
        for name, value in headers:
            if name.lower() not in _HOP:
                h.send_header(name, value)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(data)

    def _put(
        self, h: BaseHTTPRequestHandler, body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        where = urlsplit(h.path)
        bucket, _, name = where.path.lstrip("/").partition("/")
        if where.query or "x-goog-copy-source" in h.headers or not name:
            return 501, [], b"<Error><Code>NotImplemented</Code></Error>"
        query = f"uploadType=multipart&name={quote(unquote(name), safe='')}"
        generation = h.headers.get("x-goog-if-generation-match")
        if generation is not None:
            query += f"&ifGenerationMatch={int(generation)}"
        boundary = uuid.uuid4().hex
        content_type = h.headers.get("Content-Type") or "application/octet-stream"
        meta = json.dumps({"name": unquote(name), "contentType": content_type}).encode()
        upload = b"".join([
            f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n".encode(),
            meta, f"\r\n--{boundary}\r\nContent-Type: {content_type}\r\n\r\n".encode(),
            body, f"\r\n--{boundary}--\r\n".encode(),
        ])  # fmt: skip
        headers = {"Content-Type": f"multipart/related; boundary={boundary}"}
        status, _, data = self._ahead(
            "POST", f"/upload/storage/v1/b/{bucket}/o?{query}", upload, headers
        )
        with self._lock:
            self.puts += 1
            self.refused += status == 412
        if status == 412:
            return 412, [], b"<Error><Code>ConditionNotMet</Code></Error>"
        if status != 200:
            return status, [], data
        stored = json.loads(data)
        return 200, [("ETag", f'"{stored["etag"]}"'),
                     ("x-goog-generation", str(stored["generation"]))], b""  # fmt: skip
