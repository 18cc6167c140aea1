"""A TCP endpoint that stalls S3 clients the way a hung server does: it accepts connections and
reads requests, then either never answers ("silent") or answers 200 with a Content-Length and
part of the body and then sends nothing more ("freeze-body"). Connections stay open until
`close()`: nothing here ever ends a client's wait for it."""

from __future__ import annotations

import socket
import threading
from types import TracebackType


class StallingServer:
    """A loopback listener on a free port (`endpoint`); counts the requests it saw."""

    def __init__(self, mode: str = "silent", body_bytes: int = 1 << 20) -> None:
        assert mode in ("silent", "freeze-body"), mode
        self.mode = mode
        self.body_bytes = body_bytes
        self.requests = 0
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.endpoint = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self._open.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            with self._lock:
                self.requests += 1
            if self.mode == "freeze-body":
                head = (
                    f"HTTP/1.1 200 OK\r\nContent-Length: {self.body_bytes}\r\n"
                    'ETag: "frozen"\r\nContent-Type: application/octet-stream\r\n\r\n'
                )
                conn.sendall(head.encode() + b"x" * (self.body_bytes // 4))
            self._closed.wait()  # then nothing more, until the test ends
        except OSError:
            return

    def close(self) -> None:
        """Stop listening and drop every connection."""
        self._closed.set()
        self._sock.close()
        with self._lock:
            for conn in self._open:
                conn.close()

    def __enter__(self) -> StallingServer:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
