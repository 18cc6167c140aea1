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
from ci_fxcache.store.remote.s3 import client, index  # noqa: E402
from ci_fxcache.store.remote.s3.client import S3Conflict, S3Missing  # noqa: E402

KEY = "fxcache-v1-linux-x86_64-torch2.13.0-cpu-py3.11-sim"
FOLD_AT = 64  # the refs design: a save that finds this many references folds them


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

    def listing(self, prefix: str) -> list[dict[str, Any]]:
        self._request("list_objects_v2")
        with self.store.lock:
            keys = sorted(k for k in self.store.objects if k.startswith(prefix))
        return [{"Key": k, "Size": len(self.store.objects[k][0]), "LastModified": 0} for k in keys]

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


def _head_design(store: Store, layout: Layout, out: dict[str, Any], t0: float) -> None:
    """The real publish path (store.remote.s3.publish) against the stand-in."""
    from ci_fxcache.store.remote.s3 import publish
    from ci_fxcache.store.remote.tier import RemoteUnavailable

    objects = _objects(store)
    objects.start()
    try:
        got = publish.publish(objects, layout, KEY, None)
    except RemoteUnavailable as exc:
        got = {"published": False, "error": str(exc)}
    out.update(got, requests=sum(objects.bucket.requests.values()), wall=time.perf_counter() - t0)


def _refs_design(store: Store, layout: Layout, out: dict[str, Any], t0: float) -> None:
    """The alternative, modelled with the same requests a save would send: read the head
    and list the references (what the bucket has), PUT the pack and the segment, PUT an
    immutable reference named by the segment (If-None-Match: never loses), then, when it
    found FOLD_AT references or more, fold them into the head once (a conditional PUT; a
    lost race is left to a later save) and delete the folded references."""
    objects = _objects(store)
    bucket: SimBucket = objects.bucket
    local = mf.load(layout.manifest(KEY))
    head_key = objects.head_key(KEY)
    refs_prefix = objects.where.key("scopes", KEY, "refs") + "/"
    try:
        head, etag = bucket.get(head_key, limit=index.MAX_HEAD_BYTES)
    except S3Missing:
        head, etag = b"[]", None
    listed = bucket.listing(refs_prefix)
    entries = {rel: {"sha256": e["sha256"], "size": e["size"]} for rel, e in local["files"].items()}
    segment = json.dumps(entries, sort_keys=True).encode()
    digest = hashlib.sha256(segment).hexdigest()
    bucket.put(objects.pack_key(digest), b"pack bytes")
    bucket.put(objects.segment_key(digest), segment)
    bucket.put(refs_prefix + digest, b"", if_absent=True)
    out.update(published=True, attempts=1, wall=time.perf_counter() - t0)
    if len(listed) >= FOLD_AT:
        folded = set(json.loads(head))
        names = [item["Key"].rsplit("/", 1)[1] for item in listed]
        for name in names:  # a folding save reads the segments it merges
            bucket.get(objects.segment_key(name), limit=index.MAX_SEGMENT_OBJECT)
        bucket.put(objects.segment_key(digest + "-merged"), segment)
        try:
            bucket.put(head_key, json.dumps(sorted(folded | set(names))).encode(),
                       if_match=etag, if_absent=etag is None)  # fmt: skip
            for name in names:
                bucket.delete(refs_prefix + name)
        except S3Conflict:
            pass
    out["requests"] = sum(bucket.requests.values())


def _found(store: Store, design: str) -> set[str]:
    """The files a reader finds: the head's index (head design) or the head's folded
    segments plus the listed references (refs design)."""
    objects = _objects(store)
    if design == "head":
        head, _etag = objects.read_head(KEY)
        if head is None:
            return set()
        return set(objects.index(Layout(Path(tempfile.mkdtemp())), head))
    head_key = objects.head_key(KEY)
    folded = set(json.loads(store.objects[head_key][0])) if head_key in store.objects else set()
    prefix = objects.where.key("scopes", KEY, "refs") + "/"
    names = folded | {k.rsplit("/", 1)[1] for k in store.objects if k.startswith(prefix)}
    found: set[str] = set()
    for name in names:
        found |= set(json.loads(store.objects[objects.segment_key(name)][0]))
    return found


def simulate(design: str, savers: int, latency: float, work: Path) -> dict[str, Any]:
    """One round: `savers` runners publish at once; the figures."""
    layouts = [_runner(work / f"{design}{savers}", n) for n in range(savers)]
    store = Store(latency)
    results: list[dict[str, Any]] = [{} for _ in layouts]
    run = _head_design if design == "head" else _refs_design
    go = threading.Event()
    t0 = [0.0]

    def saver(n: int) -> None:
        go.wait()
        run(store, layouts[n], results[n], t0[0])

    threads = [threading.Thread(target=saver, args=(n,)) for n in range(savers)]
    for t in threads:
        t.start()
    t0[0] = time.perf_counter()
    go.set()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0[0]
    wanted = {f"inductor/fxgraph/r{n}/e{i}" for n in range(savers) for i in range(2)}
    lost = len(wanted - _found(store, design))
    attempts = [r.get("attempts", 0) for r in results]
    requests = [r.get("requests", 0) for r in results]
    walls = [r["wall"] for r in results if r.get("published")]
    return {
        "design": design, "savers": savers, "published": len(walls), "lost": lost,
        "attempts": (statistics.median(attempts), max(attempts)),
        "requests": (statistics.median(requests), max(requests)),
        "publish_s": (statistics.median(walls), max(walls)) if walls else (0.0, 0.0),
        "wall": wall,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--savers", default="100,500,1000")
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--designs", default="head,refs")
    args = parser.parse_args()
    os.environ.setdefault("FXCACHE_S3_DEADLINE", "3600")  # the longest a save may take
    work = Path(tempfile.mkdtemp(prefix="fxcache-sim-"))
    print(f"per-request latency {args.latency_ms:g} ms; load average {os.getloadavg()[0]:.2f}")
    print("design  savers  published  lost  attempts (med / max)  requests (med / max)  "
          "publish s (med / max)  wall s")  # fmt: skip
    try:
        for design in args.designs.split(","):
            for count in (int(n) for n in args.savers.split(",")):
                r = simulate(design, count, args.latency_ms / 1000, work)
                print(f"{r['design']:6s}  {r['savers']:6d}  {r['published']:9d}  {r['lost']:4d}  "
                      f"{r['attempts'][0]:8g} / {r['attempts'][1]:<8d}  "
                      f"{r['requests'][0]:8g} / {r['requests'][1]:<8d}  "
                      f"{r['publish_s'][0]:8.1f} / {r['publish_s'][1]:<8.1f}  {r['wall']:.1f}",
                      flush=True)  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
