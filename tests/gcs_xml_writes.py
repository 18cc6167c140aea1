"""What fake-gcs-server lacks to take a save: GCS's XML-API object PUT, obstore's every
write. fake-gcs-server serves the XML API's reads, listings and deletes, but answers a PUT
with 400 unless it is a signed-URL upload, which ignores preconditions. This relay sits in
front of it and turns that one request into the JSON API's multipart upload, where the
emulator checks the precondition itself:

    PUT /BUCKET/OBJECT            x-goog-if-generation-match: G (optional; 0: must not exist)
 -> POST /upload/storage/v1/b/BUCKET/o?uploadType=multipart&name=OBJECT&ifGenerationMatch=G

and answers as GCS's XML API does (https://cloud.google.com/storage/docs/xml-api/put-object-upload):
200 with the object's `ETag` and `x-goog-generation`, or 412 with an XML error. The XML
multipart upload (obstore's for a pack over MULTIPART_BYTES) the same way: the relay keeps
each part until the completion, which must list every part with the ETag it was answered
(the MD5 GCS gives), then uploads the whole; an abort (`DELETE ?uploadId=`) drops the parts.
Every other request goes through unchanged; a copy (`x-goog-copy-source`) is refused (501),
as the tests never send one. It decides nothing the emulator can: the generation check and
the stored bytes are the emulator's."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import uuid
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, quote, unquote, urlsplit

from tests.local_server import Answer, Relay


class GcsXmlWrites(Relay):
    """The relay, in front of the fake-gcs-server at `upstream`. `puts` counts the uploads
    it made (a PUT, a completed multipart upload), `refused` the 412s the emulator answered,
    `parts` the multipart parts taken and `aborted` the multipart uploads dropped."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.puts = 0
        self.refused = 0
        self.parts = 0
        self.aborted = 0
        self._uploads: dict[str, dict[int, bytes]] = {}

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        body = self.body(h)
        query = parse_qs(urlsplit(h.path).query, keep_blank_values=True)
        if "uploads" in query or "uploadId" in query:
            answer = self._multipart(h, query, body)
        elif h.command == "PUT":
            answer = self._put(h, body)
        else:
            answer = self.forward(h, body)
        self.reply(h, answer)

    def _multipart(
        self, h: BaseHTTPRequestHandler, query: dict[str, list[str]], body: bytes
    ) -> Answer:
        """Initiate (POST ?uploads), a part (PUT ?partNumber&uploadId), complete (POST
        ?uploadId) or abort (DELETE ?uploadId), as GCS's XML API answers them."""
        bucket, _, name = urlsplit(h.path).path.lstrip("/").partition("/")
        if h.command == "POST" and "uploads" in query:
            upload = uuid.uuid4().hex
            with self._lock:
                self._uploads[upload] = {}
            return 200, [], (f"<InitiateMultipartUploadResult><Bucket>{bucket}</Bucket>"
                             f"<Key>{unquote(name)}</Key><UploadId>{upload}</UploadId>"
                             "</InitiateMultipartUploadResult>").encode()  # fmt: skip
        upload = query["uploadId"][0]
        with self._lock:
            parts = self._uploads.get(upload)
        if parts is None:
            return 404, [], b"<Error><Code>NoSuchUpload</Code></Error>"
        if h.command == "PUT":
            with self._lock:
                parts[int(query["partNumber"][0])] = body
                self.parts += 1
            return 200, [("ETag", f'"{_md5(body)}"')], b""
        if h.command == "DELETE":
            with self._lock:
                del self._uploads[upload]
                self.aborted += 1
            return 204, [], b""
        listed = [
            (int(_field(part, b"PartNumber") or 0), _field(part, b"ETag").strip('"'))
            for part in re.findall(rb"<Part>(.*?)</Part>", body, re.S)
        ]
        if not listed or listed != [(n, _md5(parts[n])) for n in sorted(parts)]:
            return 400, [], b"<Error><Code>InvalidPart</Code></Error>"
        with self._lock:
            del self._uploads[upload]
        whole = b"".join(parts[n] for n in sorted(parts))
        status, headers, _ = self._upload(bucket, name, whole, None, "application/octet-stream")
        if status != 200:
            return status, [], b""
        etag = dict(headers)["ETag"]
        return 200, headers, (f"<CompleteMultipartUploadResult><Bucket>{bucket}</Bucket>"
                              f"<Key>{unquote(name)}</Key><ETag>{etag}</ETag>"
                              "</CompleteMultipartUploadResult>").encode()  # fmt: skip

    def _put(self, h: BaseHTTPRequestHandler, body: bytes) -> Answer:
        where = urlsplit(h.path)
        bucket, _, name = where.path.lstrip("/").partition("/")
        if where.query or "x-goog-copy-source" in h.headers or not name:
            return 501, [], b"<Error><Code>NotImplemented</Code></Error>"
        content_type = h.headers.get("Content-Type") or "application/octet-stream"
        return self._upload(
            bucket, name, body, h.headers.get("x-goog-if-generation-match"), content_type
        )

    def _upload(
        self, bucket: str, name: str, body: bytes, generation: str | None, content_type: str
    ) -> Answer:
        """`body` as object `name` through the JSON API's multipart upload, on condition of
        `generation` (the XML API's x-goog-if-generation-match) when given."""
        query = f"uploadType=multipart&name={quote(unquote(name), safe='')}"
        if generation is not None:
            query += f"&ifGenerationMatch={int(generation)}"
        boundary = uuid.uuid4().hex
        meta = json.dumps({"name": unquote(name), "contentType": content_type}).encode()
        upload = b"".join([
            f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n".encode(),
            meta, f"\r\n--{boundary}\r\nContent-Type: {content_type}\r\n\r\n".encode(),
            body, f"\r\n--{boundary}--\r\n".encode(),
        ])  # fmt: skip
        headers = {"Content-Type": f"multipart/related; boundary={boundary}"}
        status, _, data = self.ahead(
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


def _md5(body: bytes) -> str:
    """GCS's ETag of an object or part it took whole: the base64 MD5 of its bytes."""
    return base64.b64encode(hashlib.md5(body).digest()).decode()


def _field(part: bytes, name: bytes) -> str:
    """The text of element `name` in one <Part> of a completion ('' when missing)."""
    found = re.search(rb"<" + name + rb">([^<]*)</" + name + rb">", part)
    return found.group(1).decode() if found else ""
