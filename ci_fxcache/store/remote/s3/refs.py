"""References: what a save adds when it could not fold into the head at once.

A save that loses the head's conditional PUT (publish.py) does not re-read and retry: it
writes one immutable reference, `scopes/<key>/refs/<ms>-<random>[-<mac>]`, a head-shaped
object under its own schema (index.REF_SCHEMA) listing only the segments that save added.
Its name is unique (`If-None-Match: *` cannot lose) and sorts by the writer's clock. A
reader's view of a scope is the head's index, then each reference's in name order: a later
entry for a path wins, as a later segment does in a head.

Which saves fold: a save lists the references and reads and folds them when there are at
most FOLD_READS, when the oldest is older than FOLD_STALE_S (a backlog, not a burst), or else
with the probability FOLD_READS / their number; a save that does not fold reads none and
writes its own reference at once. So a save reads FOLD_READS references on average whatever
the number of savers at once, and the references of a burst are folded by the saves that
follow it (or the collection).

With a signing key (what a bucket writer without it can do: PUT any object): a reference's
name ends with a MAC of the scope and the name's time and random part, and its body is
signed together with its name. So a reader with the key skips a planted name without
reading it (a flood costs listing pages, never GETs), and a signed body replayed under
another name (newer, or over a newer reference) is refused: its order is signed too. Keyed
saves and the keyed collection delete the names their key did not make. What the key does
not prevent: a signed object PUT again under its own name after it was deleted (old signed
bytes, as an old head PUT again would be), or any object overwritten or deleted.

Bounds: a reader lists at most LISTED_NAMES names (page after page, so planted names that
sort first never hide the later ones within that) and reads the oldest MAX_REFS it takes,
each at most MAX_REF_BYTES, and at most REFS_BYTES of references and their segments in all
per restore or save. The view is always the head plus a prefix of the saves after it, the
same prefix the next fold takes, so a fold never puts an older entry after a newer one. Past
a bound the reader warns, naming the first reference it did not read; those wait for the
folds of the next saves or the scheduled `fxcache invalidate --s3`.

Trust: with a signing key, a reference that is unsigned, signed with another key or under
another name, truncated, malformed, or whose segments cannot be read is left out of the view
with one warning per read, never served (its files compile again and the next save
publishes them).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ci_fxcache import gha
from ci_fxcache.store import manifest as mf
from ci_fxcache.store.layout import Layout
from ci_fxcache.store.remote.packs import Index
from ci_fxcache.store.remote.s3 import parallel
from ci_fxcache.store.remote.s3.client import S3Missing, S3TooLarge, S3Unavailable
from ci_fxcache.store.remote.s3.index import (
    MAX_SEGMENT_OBJECT,
    REF_SCHEMA,
    Head,
    check_signature,
    decode_segment,
    encode_head,
    parse_head,
)
from ci_fxcache.store.remote.s3.objects import S3Objects
from ci_fxcache.store.remote.tier import RemoteCorrupt, RemoteUnavailable

# References one read takes, the oldest first, and their GETs in parallel (parallel.py's
# pool) with their segments.
MAX_REFS = 256
# Names one read lists at most (S3 answers up to 1,000 a request): a planted flood costs a
# reader at most these pages.
LISTED_NAMES = 10_000
# One reference lists the segments of one save and their packs: kilobytes. A larger object
# is refused by its Content-Length before it is read.
MAX_REF_BYTES = 1024 * 1024
# What one restore or save reads of references and their segments in all: 24 planted
# references of 16 MiB made every keyed restore download 384 MiB before this bound.
REFS_BYTES = 64 * 1024 * 1024
# Names its key did not make that one keyed save deletes at most (the collection: all).
JUNK_DELETES = 1000
# A save reads (and folds) the references it lists when there are at most this many, else
# with the probability FOLD_READS / their number (publish.py): a save reads FOLD_READS
# references on average, whatever the backlog, and the backlog still drains.
FOLD_READS = 16
# ... and always when the oldest it lists is older than this (by its writer's clock): not a
# burst of savers at once but a backlog, which the next save folds.
FOLD_STALE_S = 30.0
_NAME = re.compile(r"^([0-9]{13}-[0-9a-f]{16})(?:-([0-9a-f]{32}))?$")
_NAME_CONTEXT = b"fxcache-s3-ref-name/1\0"


def new_name(key: str, signing_key: str | None) -> str:
    """A reference's name: the writer's clock in milliseconds, 64 random bits, and with a
    key their MAC (bound to scope `key`)."""
    stem = f"{int(time.time() * 1000):013d}-{secrets.token_hex(8)}"
    return f"{stem}-{_name_mac(signing_key, key, stem)}" if signing_key else stem


def _name_mac(signing_key: str, key: str, stem: str) -> str:
    payload = _NAME_CONTEXT + f"{key}\0{stem}".encode()
    return hmac.new(signing_key.encode(), payload, hashlib.sha256).hexdigest()[:32]


def taken(name: str, key: str, signing_key: str | None) -> bool:
    """Does a reader of scope `key` (with `signing_key`, or none) take reference `name`?
    Without a key, any name of the format; with one, only a name that key made."""
    match = _NAME.match(name)
    if match is None or not signing_key:
        return match is not None
    mac = match[2]
    return mac is not None and hmac.compare_digest(mac, _name_mac(signing_key, key, match[1]))


def sign(body: Head, name: str, signing_key: str) -> Head:
    """Reference `body` signed together with its `name` (so its order)."""
    named = {**body.to_json(), "reference": name}
    named.pop("signature", None)
    mf.sign(named, signing_key)
    return body.with_signature(named["signature"])


def signature_problem(body: Head, name: str, signing_key: str) -> str | None:
    """Why reference `body` is not signed with `signing_key` under `name`, or None."""
    reason = mf.signature_problem({**body.to_json(), "reference": name}, signing_key)
    return reason.replace("manifest", "reference", 1) if reason else None


@dataclass
class Ref:
    """One readable, trusted reference: its name, its body and the files its segments give."""

    name: str
    body: Head
    files: Index


@dataclass
class Listed:
    """A listing of a scope's references: the names a reader takes (oldest first), whether
    there are more than it takes, and the names its key did not make (`junk`)."""

    names: list[str] = field(default_factory=list)
    more: bool = False
    junk: list[str] = field(default_factory=list)


@dataclass
class Found:
    """The references a read took (oldest first), those it left out (name -> why), those the
    bound on bytes kept it from reading (`skipped`), and whether the listing held more than
    it read."""

    refs: list[Ref] = field(default_factory=list)
    ignored: dict[str, str] = field(default_factory=dict)
    more: bool = False
    skipped: list[str] = field(default_factory=list)

    def files(self) -> Index:
        """The references' entries merged in order (a later one wins)."""
        merged: Index = {}
        for ref in self.refs:
            merged.update(ref.files)
        return merged


def folds(listed: list[str]) -> bool:
    """Does a save that listed references `listed` (oldest first) read and fold them?"""
    n = len(listed)
    if n <= FOLD_READS or time.time() - int(listed[0][:13]) / 1000 > FOLD_STALE_S:
        return True
    return secrets.randbelow(n) < FOLD_READS


def names(objects: S3Objects, key: str, signing_key: str | None, first: int | None) -> Listed:
    """Scope `key`'s references as a reader with `signing_key` lists them: the names it takes
    in order (with `first`: the first `first`), within LISTED_NAMES listed names."""
    prefix = objects.refs_prefix(key)
    try:
        listed, truncated = objects.bucket.listing_upto(prefix, LISTED_NAMES)
    except S3Unavailable as exc:
        raise RemoteUnavailable(str(exc)) from None
    found = Listed(more=truncated)
    for item in listed:
        name = item["Key"][len(prefix) :]
        (found.names if taken(name, key, signing_key) else found.junk).append(name)
    found.names.sort()
    if first is not None and len(found.names) > first:
        found.names, found.more = found.names[:first], True
    return found


def read(
    objects: S3Objects,
    layout: Layout,
    key: str,
    signing_key: str | None,
    first: int | None,
    *,
    warn: bool = True,
) -> Found:
    """Scope `key`'s references as a reader takes them (the oldest `first`; None: all within
    the bounds), each checked (module docstring); one warning for those left out, one for
    those not read, unless `warn` is false."""
    return read_listed(objects, layout, key, signing_key, names(objects, key, signing_key, first),
                       warn=warn)  # fmt: skip


class _Skipped(Exception):
    """The bound on the bytes of references one read takes kept a reference from being read."""


class _Budget:
    """REFS_BYTES shared by the parallel reads of one read: each read is granted a limit
    before it starts (waiting while other grants are out and too little is left), and what it
    did not use goes back. So never more than the bound is read, whatever the timing."""

    def __init__(self, total: int) -> None:
        self.left = total
        self.out = 0
        self.cond = threading.Condition()

    def charged(self, most: int, read: Callable[[int], bytes]) -> bytes:
        """`read(limit)` with a limit of up to `most` granted from what is left; _Skipped
        when nothing is left."""
        with self.cond:
            while self.left < most and self.out:
                self.cond.wait()
            granted = min(most, self.left)
            self.left -= granted
            self.out += 1
        used = 0
        try:
            if granted == 0:
                raise _Skipped
            raw = read(granted)
            used = min(len(raw), granted)
            return raw
        finally:
            with self.cond:
                self.left += granted - used
                self.out -= 1
                self.cond.notify_all()


def read_listed(
    objects: S3Objects,
    layout: Layout,
    key: str,
    signing_key: str | None,
    listed: Listed,
    *,
    warn: bool = True,
) -> Found:
    """References `listed` (names()), as read() takes them."""
    got: dict[str, Ref | str | None] = {}
    lock = threading.Lock()
    budget = _Budget(REFS_BYTES)

    def one(name: str) -> None:
        try:
            found: Ref | str | None = _read_one(objects, layout, key, name, signing_key, budget)
        except RemoteCorrupt as exc:
            found = str(exc)
        except _Skipped:
            found = None
        with lock:
            got[name] = found

    parallel.run(one, listed.names, parallel.FETCH_WORKERS)
    result = Found(more=listed.more)
    for name in listed.names:
        item = got.get(name, "removed while being read")
        if item is None or (result.skipped and isinstance(item, Ref)):
            result.skipped.append(name)  # the view stays a prefix of the saves
        elif isinstance(item, Ref):
            result.refs.append(item)
        elif item != "gone":
            result.ignored[name] = item
    if warn:
        _warn(objects, key, result, len(listed.names))
    return result


def _warn(objects: S3Objects, key: str, found: Found, first: int) -> None:
    if found.ignored:
        name, why = next(iter(sorted(found.ignored.items())))
        gha.warn(
            f"{objects.describe()}: {len(found.ignored)} reference(s) of {key} left out, never "
            f"served (first: {name}: {why}); their files compile again"
        )
    if found.skipped:
        gha.warn(
            f"{objects.describe()}: {len(found.skipped)} reference(s) of {key} not read: a "
            f"restore or save reads at most {REFS_BYTES:,} bytes of references (first not "
            f"read: {found.skipped[0]}); their files compile again until a save or "
            "`fxcache invalidate --s3` folds them"
        )
    if found.more:
        gha.warn(
            f"{objects.describe()}: {key} has more than {first} unfolded references (or more "
            f"than {LISTED_NAMES:,} names under them); read the oldest, the newer wait for the "
            "next folds (a save, or `fxcache invalidate --s3`)"
        )


def _read_one(
    objects: S3Objects,
    layout: Layout,
    key: str,
    name: str,
    signing_key: str | None,
    budget: _Budget,
) -> Ref | str:
    """Reference `name`, checked, within `budget`; "gone" when a fold removed it meanwhile
    (its files are in the head); RemoteCorrupt when it is left out, _Skipped when the budget
    kept it from being read."""
    copy = objects.runner_dir(layout) / "refs" / key / name
    try:
        raw = budget.charged(MAX_REF_BYTES, lambda limit: _read_copy(copy, limit))
        return _checked(objects, layout, key, name, raw, signing_key, budget)
    except (OSError, RemoteCorrupt):
        pass  # no copy, or not a good one: the bucket's
    try:
        raw = budget.charged(MAX_REF_BYTES, lambda limit: _get(objects, key, name, limit))
    except S3Missing:
        return "gone"
    ref = _checked(objects, layout, key, name, raw, signing_key, budget)
    copy.parent.mkdir(parents=True, exist_ok=True)
    tmp = copy.with_name(f".{name}.{os.getpid()}.{threading.get_ident()}")
    tmp.write_bytes(raw)
    os.replace(tmp, copy)
    return ref


def _read_copy(copy: os.PathLike[str], limit: int) -> bytes:
    with open(copy, "rb") as f:
        raw = f.read(limit + 1)
    if len(raw) > limit:
        raise OSError("larger than the read's limit")
    return raw


def _get(objects: S3Objects, key: str, name: str, limit: int) -> bytes:
    try:
        got = objects.bucket.get(objects.where.key("scopes", key, "refs", name), limit=limit)
    except S3TooLarge:
        if limit < MAX_REF_BYTES:
            raise _Skipped from None
        raise RemoteCorrupt("larger than any reference a save writes") from None
    except S3Unavailable as exc:
        raise RemoteUnavailable(str(exc)) from None
    assert got is not None
    return got[0]


def _segment(objects: S3Objects, layout: Layout, digest: str, budget: _Budget) -> bytes:
    def read(limit: int) -> bytes:
        try:
            return objects.segment_bytes(layout, digest, limit)
        except RemoteCorrupt:
            if limit < MAX_SEGMENT_OBJECT:
                raise _Skipped from None
            raise

    return budget.charged(MAX_SEGMENT_OBJECT, read)


def _checked(
    objects: S3Objects,
    layout: Layout,
    key: str,
    name: str,
    body: bytes,
    signing_key: str | None,
    budget: _Budget,
) -> Ref:
    try:
        parsed = parse_head(body, key, REF_SCHEMA)
    except RemoteCorrupt as exc:
        raise RemoteCorrupt(str(exc).replace("remote head", "reference")) from None
    if signing_key:
        problem = signature_problem(parsed, name, signing_key)
        if problem:
            raise RemoteCorrupt(problem)
    files: Index = {}
    for seg in parsed.segments:
        raw = _segment(objects, layout, seg.sha256, budget)
        files.update(decode_segment(raw, seg.sha256, set(seg.packs)))
    return Ref(name, parsed, files)


def put(objects: S3Objects, key: str, body: Head, signing_key: str | None) -> str:
    """Write reference `body` of scope `key` under a new name (never overwrites one), signed
    together with its name when there is a key; its name."""
    name = new_name(key, signing_key)
    if signing_key:
        body = sign(body, name, signing_key)
    objects.bucket.put(objects.where.key("scopes", key, "refs", name), encode_head(body),
                       if_absent=True, content_type="application/json")  # fmt: skip
    return name


def delete(objects: S3Objects, key: str, folded: list[str]) -> int:
    """Delete references a head now covers (or that no reader takes), best-effort (one left
    behind is folded or deleted again, harmlessly); how many went."""
    gone: list[str] = []
    lock = threading.Lock()

    def one(name: str) -> None:
        objects.bucket.delete(objects.where.key("scopes", key, "refs", name))
        with lock:
            gone.append(name)

    with contextlib.suppress(S3Unavailable, S3Missing):
        parallel.run(one, folded)
    return len(gone)


def view(
    objects: S3Objects, layout: Layout, key: str, signing_key: str | None
) -> tuple[Head | None, Index]:
    """What a restore of scope `key` writes: the fields of its head (else of its newest
    reference; None when it has neither) and the head's index with the references' entries
    over it. RemoteCorrupt when the head is not one a save wrote or, with a key, is not signed
    with it (as without references). The head and its segments are read beside the listing
    of the references and their reads: no round trip more when there are none."""
    got: dict[str, Any] = {}

    def one(what: str) -> None:
        if what == "refs":
            got[what] = read(objects, layout, key, signing_key, MAX_REFS)
            return
        head, _etag = objects.read_head(key)
        if head is not None and signing_key:
            check_signature(head, signing_key)
        got[what] = (head, objects.index(layout, head) if head is not None else {})

    parallel.run(one, ["head", "refs"])
    head, entries = got["head"]
    found: Found = got["refs"]
    entries.update(found.files())
    return (head or (found.refs[-1].body if found.refs else None)), entries
