"""Concurrent savers of one scope without a server: an in-process stand-in for the bucket
with a per-request latency, driven by the real publish path (one shared head replaced by a
conditional PUT, store.remote.s3.publish) and by a model of the alternative (each save adds
its own immutable segment reference that readers list and merge; a save folds them into the
head now and then). Issue 40: which design keeps a save's cost flat as runners are added.

Per design and saver count: attempts per save (median / max), requests per save (median /
max), time from the start until the save published (median / max), and files lost (what a
reader of the bucket afterwards does not find). Every saver starts at once.

Usage: python benchmarks/sim_savers.py [--savers 100,500,1000] [--latency-ms 20]
           [--designs head,refs]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, cast

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ci_fxcache.store import manifest as mf  # noqa: E402
from ci_fxcache.store.layout import Layout  # noqa: E402
from ci_fxcache.store.remote.s3 import client  # noqa: E402
from ci_fxcache.store.remote.s3.client import S3Conflict, S3Missing  # noqa: E402

KEY = "fxcache-v1-linux-x86_64-cp311-torch2.13.0-cpu-0123456789ab-sim"  # scopekey.KEY_RE


@dataclass
class Store:
    """The bucket's objects and their ETags; every request waits `latency` outside the lock
    (the network), then is applied atomically (S3's strong consistency)."""

    latency: float
    objects: dict[str, tuple[bytes, str]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    serial: int = 0


class SimBucket:
    """client.Bucket's interface over a Store, counting this saver's requests."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.requests: dict[str, int] = {}
        self.sent_bytes = 0
        self.received_bytes = 0

    def use(self, deadline: Any) -> None:
        """Deadlines are the publish path's own (deadline.py)."""

    def _request(self, what: str) -> None:
        self.requests[what] = self.requests.get(what, 0) + 1
        time.sleep(self.store.latency)

    def get(self, key: str, if_none_match: str | None = None, *, limit: int) -> Any:
        self._request("get_object")
        with self.store.lock:
            got = self.store.objects.get(key)
        if got is None:
            raise S3Missing(key)
        if len(got[0]) > limit:
            raise client.S3TooLarge(key, got[1])
        self.received_bytes += len(got[0])
        return got

    def put(self, key: str, body: bytes, *, if_match: str | None = None,
            if_absent: bool = False, content_type: str = "") -> str:  # fmt: skip
        self._request("put_object")
        self.sent_bytes += len(body)
        with self.store.lock:
            now = self.store.objects.get(key)
            if (if_match and (now is None or now[1] != if_match)) or (if_absent and now):
                raise S3Conflict(key)
            self.store.serial += 1
            etag = f'"{self.store.serial}"'
            self.store.objects[key] = (body, etag)
        return etag

    def put_file(self, key: str, f: BinaryIO, size: int) -> None:
        f.seek(0)
        self.put(key, f.read(size))

    def listing(self, prefix: str, first: int | None = None) -> list[dict[str, Any]]:
        self._request("list_objects_v2")
        with self.store.lock:
            keys = sorted(k for k in self.store.objects if k.startswith(prefix))
        keys = keys if first is None else keys[: first + 1]
        return [{"Key": k, "Size": len(self.store.objects[k][0]), "LastModified": 0} for k in keys]

    listing_upto = client.Bucket.listing_upto  # the client's own, over this listing

    def versioning(self) -> str:
        return "off"

    def delete(self, key: str) -> None:
        self._request("delete_object")
        with self.store.lock:
            self.store.objects.pop(key, None)


def _runner(base: Path, n: int) -> Layout:
    """Runner n: scope KEY committed with two files of its own."""
    layout = Layout(base / f"runner{n}")
    scope = layout.scope(KEY)
    listed: dict[str, dict[str, Any]] = {}
    for i in range(2):
        rel = f"inductor/fxgraph/r{n}/e{i}"
        data = f"runner {n} entry {i}\n".encode() * 40
        (scope / rel).parent.mkdir(parents=True, exist_ok=True)
        (scope / rel).write_bytes(data)
        listed[rel] = {"size": len(data), "mtime_ns": (scope / rel).stat().st_mtime_ns,
                       "sha256": hashlib.sha256(data).hexdigest()}  # fmt: skip
    manifest = {
        "schema": mf.SCHEMA, "scope_key": KEY, "fingerprint": {}, "torch_paths": [],
        "created_at": "2026-12-04T00:00:00Z", "updated_at": "2026-12-04T00:00:00Z",
        "last_used_at": "2026-12-04T00:00:00Z", "verification": {"references": []},
        "files": listed, "total_bytes": sum(int(e["size"]) for e in listed.values()),
    }  # fmt: skip
    (layout.root / ".locks").mkdir(parents=True, exist_ok=True)
    mf.write_atomic(layout.manifest(KEY), manifest, layout.root / ".locks")
    return layout


def _objects(store: Store) -> Any:
    from ci_fxcache.store.remote.s3.objects import S3Objects

    return S3Objects(client.Location("sim", "fxcache"), cast(Any, SimBucket(store)))


def _save(store: Store, layout: Layout, out: dict[str, Any], t0: float) -> None:
    """The real publish path (store.remote.s3.publish) against the stand-in."""
    from ci_fxcache.store.remote.s3 import publish
    from ci_fxcache.store.remote.tier import RemoteUnavailable

    objects = _objects(store)
    objects.start()
    try:
        committed = mf.Committed.read(layout.manifest(KEY))
        got = publish.publish(objects, layout, KEY, committed, None).to_dict()
    except RemoteUnavailable as exc:
        got = {"published": False, "error": str(exc)}
    out.update(got, requests=sum(objects.bucket.requests.values()), wall=time.perf_counter() - t0)


def _found(store: Store, work: Path) -> tuple[set[str], int]:
    """The files a reader finds (store.remote.s3.refs.view: the head and at most
    refs.MAX_REFS references), and how many references are left unfolded."""
    from ci_fxcache.store.remote.s3 import refs

    objects = _objects(store)
    objects.start()
    _meta, entries = refs.view(objects, Layout(Path(tempfile.mkdtemp(dir=work))), KEY, None)
    return set(entries), len(refs.names(objects, KEY, None, None).names)


def _fold(store: Store) -> dict[str, Any]:
    """The scheduled collection's fold (store.remote.s3.invalidate), every reference."""
    from ci_fxcache.store.policies import Policy
    from ci_fxcache.store.remote.s3 import invalidate

    objects = _objects(store)
    done = invalidate.run(objects, Policy(), dry_run=False)
    return cast(dict[str, Any], done["gc"])


def simulate(savers: int, latency: float, work: Path) -> dict[str, Any]:
    """One round: `savers` runners publish at once; the figures."""
    layouts = [_runner(work / f"savers{savers}", n) for n in range(savers)]
    store = Store(latency)
    results: list[dict[str, Any]] = [{} for _ in layouts]
    go = threading.Event()
    t0 = [0.0]

    def saver(n: int) -> None:
        go.wait()
        _save(store, layouts[n], results[n], t0[0])

    threads = [threading.Thread(target=saver, args=(n,)) for n in range(savers)]
    for t in threads:
        t.start()
    t0[0] = time.perf_counter()
    cpu = time.process_time()
    go.set()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0[0]
    cpu = time.process_time() - cpu
    wanted = {f"inductor/fxgraph/r{n}/e{i}" for n in range(savers) for i in range(2)}
    seen, unfolded = _found(store, work)
    folded = _fold(store)
    after, left = _found(store, work)
    attempts = [r.get("attempts", 0) for r in results]
    requests = [r.get("requests", 0) for r in results]
    walls = [r["wall"] for r in results if r.get("published")]
    via = [r.get("via") for r in results]
    return {
        "savers": savers, "published": len(walls), "lost": len(wanted - after),
        "unseen_before_fold": len(wanted - seen), "unfolded": unfolded, "left": left,
        "via_head": via.count("head"), "gc": folded,
        "attempts": (statistics.median(attempts), max(attempts)),
        "requests": (statistics.median(requests), max(requests)),
        "publish_s": (statistics.median(walls), max(walls)) if walls else (0.0, 0.0),
        "wall": wall, "cpu_ms_per_save": 1000 * cpu / savers,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--savers", default="100,500,1000")
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--max-refs", type=int, default=None,
                        help="references a reader takes (refs.MAX_REFS)")  # fmt: skip
    args = parser.parse_args()
    if args.max_refs:
        from ci_fxcache.store.remote.s3 import refs

        refs.MAX_REFS = args.max_refs
    os.environ.setdefault("FXCACHE_S3_DEADLINE", "3600")  # the longest a save may take
    work = Path(tempfile.mkdtemp(prefix="fxcache-sim-"))
    print(f"per-request latency {args.latency_ms:g} ms; load average {os.getloadavg()[0]:.2f}")
    print("savers  published  head/ref  attempts (med / max)  requests (med / max)  "
          "publish s (med / max)  wall s  refs left  unseen  lost after gc")  # fmt: skip
    try:
        for count in (int(n) for n in args.savers.split(",")):
            r = simulate(count, args.latency_ms / 1000, work)
            refs = r["savers"] - r["via_head"]
            print(f"{r['savers']:6d}  {r['published']:9d}  {r['via_head']:4d}/{refs:<4d}  "
                  f"{r['attempts'][0]:8g} / {r['attempts'][1]:<8d}  "
                  f"{r['requests'][0]:8g} / {r['requests'][1]:<8d}  "
                  f"{r['publish_s'][0]:8.2f} / {r['publish_s'][1]:<8.2f}  {r['wall']:6.1f}  "
                  f"{r['unfolded']:9d}  {r['unseen_before_fold']:6d}  {r['lost']:4d}"
                  f"  cpu {r['cpu_ms_per_save']:.0f} ms/save  after gc: {r['left']} refs, "
                  f"{json.dumps(r['gc'])}", flush=True)  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
