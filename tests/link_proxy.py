"""A simulated network link on loopback: a TCP proxy in front of a server (SeaweedFS in the
S3 tests and benchmarks/bench_s3.py) that limits bandwidth per connection and in total, adds
round-trip latency, and can freeze (stop forwarding, keep every connection open).

In a test:

    with Link(("127.0.0.1", 8333), total_mbit=320, rtt_ms=20) as link:
        env["AWS_ENDPOINT_URL_S3"] = link.endpoint
        ...
        link.freeze()        # a server that hangs mid-transfer: nothing moves, nothing closes

From a benchmark (its own process, so that its threads do not share an interpreter lock with
what is measured): `python tests/link_proxy.py --target 127.0.0.1:8333 --total-mbit 320
--conn-mbit 720 --rtt-ms 20` prints `listening on PORT` and runs until SIGTERM.

Latency: each chunk read from one side is forwarded no earlier than half the round-trip time
after it was read (a queue per direction, so a stream's throughput does not suffer from it);
a request-response exchange costs one round trip, as on a real link. Bandwidth: token buckets
(bytes per second) per connection and for the whole link, taken before each chunk is sent.
TCP's slow start and losses are not simulated.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import signal
import socket
import sys
import threading
import time
from types import TracebackType

CHUNK = 256 * 1024
QUEUE_CHUNKS = 32  # per direction: at most 8 MiB in flight inside the proxy


class TokenBucket:
    """`rate` bytes per second; a taker of n bytes waits until they are available (taking
    more than there is leaves a debt that the next taker waits out)."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.capacity = max(float(CHUNK), rate * 0.005)
        self.tokens = self.capacity
        self.last = time.monotonic()
        self.lock = threading.Lock()

    def take(self, n: int) -> None:
        with self.lock:
            now = time.monotonic()
            self.tokens = min(self.capacity, self.tokens + (now - self.last) * self.rate)
            self.last = now
            self.tokens -= n
            wait = -self.tokens / self.rate if self.tokens < 0 else 0.0
        if wait > 0:
            time.sleep(wait)


def _mbit(value: float | None) -> float | None:
    return value * 1e6 / 8 if value else None


class _Pipe:
    """One direction of one connection: a reader thread that stamps chunks, a sender thread
    that forwards each when it is due, through the buckets, unless the link is frozen."""

    def __init__(self, link: Link, src: socket.socket, dst: socket.socket,
                 conn: _Connection) -> None:  # fmt: skip
        self.link, self.src, self.dst = link, src, dst
        self.conn = conn
        self.queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self.cond = threading.Condition()
        self.closed = False

    def start(self) -> None:
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._send, daemon=True).start()

    def _read(self) -> None:
        one_way = self.link.rtt_s / 2
        while True:
            try:
                data = self.src.recv(CHUNK)
            except OSError:
                data = b""
            with self.cond:
                while len(self.queue) >= QUEUE_CHUNKS and not self.closed:
                    self.cond.wait()
                self.queue.append((time.monotonic() + one_way, data))
                self.cond.notify_all()
            if not data:
                return

    def _send(self) -> None:
        try:
            while True:
                with self.cond:
                    while not self.queue:
                        self.cond.wait()
                    due, data = self.queue.popleft()
                    self.cond.notify_all()
                delay = due - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                self.link._flowing.wait()
                if not data:
                    with contextlib.suppress(OSError):
                        self.dst.shutdown(socket.SHUT_WR)
                    self.conn.end(failed=False)
                    return
                view = memoryview(data)
                while view:
                    piece = view[: self.link.piece]
                    for bucket in (self.conn.bucket, self.link.total_bucket):
                        if bucket is not None:
                            bucket.take(len(piece))
                    self.link._flowing.wait()
                    self.dst.sendall(piece)
                    self.link._count(len(piece))
                    view = view[len(piece) :]
        except OSError:
            self.conn.end(failed=True)
        finally:
            with self.cond:
                self.closed = True
                self.cond.notify_all()


class _Connection:
    """Both directions of one proxied connection: closed when both ended or one failed."""

    def __init__(self, bucket: TokenBucket | None, *socks: socket.socket) -> None:
        self.bucket = bucket
        self.socks = socks
        self.ended = 0
        self.lock = threading.Lock()

    def end(self, *, failed: bool) -> None:
        with self.lock:
            self.ended += 1
            finished = failed or self.ended == 2
        if finished:
            for sock in self.socks:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


class Link:
    """The proxy: `endpoint` (http://127.0.0.1:PORT) stands for the target server."""

    def __init__(
        self,
        target: tuple[str, int],
        *,
        total_mbit: float | None = None,
        conn_mbit: float | None = None,
        rtt_ms: float = 0.0,
        port: int = 0,
    ) -> None:
        self.target = target
        self.rtt_s = rtt_ms / 1000
        total, per_conn = _mbit(total_mbit), _mbit(conn_mbit)
        self.total_bucket = TokenBucket(total) if total else None
        self.conn_rate = per_conn
        # Bytes sent at once: small enough that the buckets shape the flow smoothly.
        slowest = min(r for r in (total, per_conn, 1e12) if r)
        self.piece = int(min(CHUNK, max(16 * 1024, slowest * 0.002)))
        self._flowing = threading.Event()
        self._flowing.set()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self.connections = 0
        self.forwarded_bytes = 0
        self._listener = socket.create_server(("127.0.0.1", port))
        self.port = self._listener.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _count(self, n: int) -> None:
        with self._lock:
            self.forwarded_bytes += n

    def freeze(self) -> None:
        """Stop forwarding in both directions, keeping every connection open (a server
        frozen mid-transfer); new connections are accepted and hang too."""
        self._flowing.clear()

    def thaw(self) -> None:
        """Forward again."""
        self._flowing.set()

    def _accept(self) -> None:
        while True:
            try:
                client, _addr = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self.connections += 1
                self._sockets += [client, upstream]
            bucket = TokenBucket(self.conn_rate) if self.conn_rate else None
            conn = _Connection(bucket, client, upstream)
            for src, dst in ((client, upstream), (upstream, client)):
                _Pipe(self, src, dst, conn).start()

    def close(self) -> None:
        """Stop accepting and drop every connection."""
        self._flowing.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            socks, self._sockets = self._sockets, []
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def __enter__(self) -> Link:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True, help="HOST:PORT of the server")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (0: any free)")
    parser.add_argument("--total-mbit", type=float, default=None, help="the whole link")
    parser.add_argument("--conn-mbit", type=float, default=None, help="each connection")
    parser.add_argument("--rtt-ms", type=float, default=0.0, help="added round-trip time")
    args = parser.parse_args()
    host, _, port = args.target.rpartition(":")
    link = Link((host, int(port)), total_mbit=args.total_mbit, conn_mbit=args.conn_mbit,
                rtt_ms=args.rtt_ms, port=args.port)  # fmt: skip
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print(f"listening on {link.port}", flush=True)
    stop.wait()
    print(f"forwarded {link.forwarded_bytes} bytes over {link.connections} connections",
          file=sys.stderr)  # fmt: skip
    link.close()


if __name__ == "__main__":
    main()
