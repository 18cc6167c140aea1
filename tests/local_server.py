"""The loopback HTTP server under the strict fakes (fake_github, fake_cache_service): a free
port chosen by the system, one thread per request, every method handed to `_handle`; and
`Relay`, one in front of a real server that passes requests on."""

from __future__ import annotations

import http.client
import json
import ssl
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Self
from urllib.parse import urlsplit

Answer = tuple[int, list[tuple[str, str]], bytes]  # status, headers, body
_HOP = {"host", "connection", "transfer-encoding", "content-length"}  # set per connection


def certificates(where: Path) -> tuple[Path, Path, Path]:
    """A CA (its certificate is the bundle a runner trusts) and a server certificate for
    127.0.0.1 it signed, with its key (rustls refuses a CA certificate as a server's)."""
    ca, ca_key = where / "ca.pem", where / "ca.key"
    cert, key, request = where / "server.pem", where / "server.key", where / "server.csr"
    extensions = where / "server.ext"
    extensions.write_text("basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1\n")
    for cmd in (
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test CA",
         "-keyout", ca_key, "-out", ca],
        ["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", key,
         "-out", request],
        ["x509", "-req", "-in", request, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
         "-days", "1", "-extfile", extensions, "-out", cert],
    ):  # fmt: skip
        subprocess.run(["openssl", *map(str, cmd)], check=True, capture_output=True)
    return ca, cert, key


class LocalServer:
    """Serves on 127.0.0.1 while used as a context manager; subclasses implement `_handle`.
    With `tls` (a certificate and its key), over HTTPS."""

    def __init__(self, tls: tuple[Path, Path] | None = None) -> None:
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._scheme = "https" if tls else "http"
        if tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{self._scheme}://{host}:{port}"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        raise NotImplementedError

    @staticmethod
    def answer_json(h: BaseHTTPRequestHandler, status: int, answer: object) -> None:
        """Answer `h` with `answer` as a JSON body (the token endpoints' stand-ins)."""
        body = json.dumps(answer).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # keep test output quiet
                pass

            def _dispatch(self) -> None:
                server._handle(self)

            do_GET = do_HEAD = do_POST = do_PATCH = do_DELETE = do_PUT = _dispatch

        return Handler


class Relay(LocalServer):
    """In front of the plain-HTTP server at `upstream`: `forward` passes a request on as it
    came (less the per-connection headers and those in `dropped`), `reply` answers one."""

    def __init__(self, upstream: str) -> None:
        super().__init__()
        self.upstream = urlsplit(upstream)

    @staticmethod
    def body(h: BaseHTTPRequestHandler) -> bytes:
        length = int(h.headers.get("Content-Length") or 0)
        return h.rfile.read(length) if length else b""

    def ahead(self, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> Answer:
        """One request to the upstream server; its answer."""
        conn = http.client.HTTPConnection(self.upstream.hostname or "", self.upstream.port,
                                          timeout=30)  # fmt: skip
        try:
            conn.request(method, path, body=body, headers=headers)
            answer = conn.getresponse()
            return answer.status, answer.getheaders(), answer.read()
        finally:
            conn.close()

    def forward(
        self, h: BaseHTTPRequestHandler, body: bytes, dropped: frozenset[str] = frozenset()
    ) -> Answer:
        """`h`'s request, passed on with its headers."""
        sent = {k: v for k, v in h.headers.items() if k.lower() not in _HOP | dropped}
        return self.ahead(h.command, h.path, body or None, sent)

    @staticmethod
    def reply(h: BaseHTTPRequestHandler, answer: Answer) -> None:
        status, headers, data = answer
        h.send_response(status)
        for name, value in headers:
            if name.lower() not in _HOP:
                h.send_header(name, value)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(data)
