"""The loopback HTTP server under the strict fakes (fake_github, fake_cache_service): a free
port chosen by the system, one thread per request, every method handed to `_handle`."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self


class LocalServer:
    """Serves on 127.0.0.1 while used as a context manager; subclasses implement `_handle`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        raise NotImplementedError

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # keep test output quiet
                pass

            def _dispatch(self) -> None:
                server._handle(self)

            do_GET = do_HEAD = do_POST = do_PATCH = do_DELETE = do_PUT = _dispatch

        return Handler
