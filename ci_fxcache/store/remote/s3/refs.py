"""References: what a save adds when it could not fold into the head at once.

A save that loses the head's conditional PUT (publish.py) does not re-read and retry: it
writes one immutable reference, `scopes/<key>/refs/<ms>-<random>`, a head-shaped object under
its own schema (index.REF_SCHEMA) listing only the segments that save added, signed like
the head when there is a key. Its name is unique (`If-None-Match: *` cannot lose) and sorts
by the writer's clock. A reader's view of a scope is the head's index, then each
reference's in name order: a later entry for a path wins, as a later segment does in a head.

Which saves fold: a save lists the references (one LIST) and reads and folds them when there
are at most FOLD_READS, when the oldest is older than FOLD_STALE_S (a backlog, not a burst),
or else with the probability FOLD_READS / their number; a save that does not fold reads none
and writes its own reference at once. So a save reads FOLD_READS references on average
whatever the number of savers at once, and the references of a burst are folded by the saves
that follow it (or the collection).

Bounds: a reader lists at most MAX_REFS references (one LIST request) and reads those, the
oldest first: the view is always the head plus a prefix of the saves after it, the same
prefix the next fold takes, so a fold never puts an older entry after a newer one. Past
MAX_REFS the reader warns; the newer references wait for the folds of the next saves (each
takes up to MAX_REFS) or the scheduled `fxcache invalidate --s3`, which folds them all.

Trust: with a signing key, a reference that is unsigned, signed with another key,
truncated, malformed, or whose segments cannot be read is left out of the view with one
warning per read, never served (its files compile again and the next save publishes them).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ci_fxcache import gha
from ci_fxcache.store.layout import Layout
from ci_fxcache.store.remote.s3 import parallel
from ci_fxcache.store.remote.s3.client import S3Missing, S3TooLarge, S3Unavailable
from ci_fxcache.store.remote.s3.index import (
    MAX_HEAD_BYTES,
    REF_SCHEMA,
    check_signature,
    parse_head,
)
from ci_fxcache.store.remote.s3.index import signature_problem as head_signature_problem
from ci_fxcache.store.remote.s3.objects import S3Objects
from ci_fxcache.store.remote.tier import RemoteCorrupt, RemoteUnavailable

# References one read takes: one LIST page (S3 answers at most 1,000 keys a request), and
# their GETs in parallel (parallel.py's pool) with their segments.
MAX_REFS = 256
# A save reads (and folds) the references it lists when there are at most this many, else
# with the probability FOLD_READS / their number (publish.py): a save reads FOLD_READS
# references on average, whatever the backlog, and the backlog still drains.
FOLD_READS = 16
# ... and always when the oldest it lists is older than this (by its writer's clock): not a
# burst of savers at once but a backlog, which the next save folds.
FOLD_STALE_S = 30.0
_NAME = re.compile(r"^[0-9]{13}-[0-9a-f]{16}$")


def new_name() -> str:
    """A reference's name: the writer's clock in milliseconds, then 64 random bits."""
    return f"{int(time.time() * 1000):013d}-{secrets.token_hex(8)}"


@dataclass
class Ref:
    """One readable, trusted reference: its name, its body and the files its segments give."""

    name: str
    body: dict[str, Any]
    files: dict[str, dict[str, Any]]


@dataclass
class Found:
    """The references a read took (oldest first), those it left out (name -> why), and
    whether the listing held more than it read."""

    refs: list[Ref] = field(default_factory=list)
    ignored: dict[str, str] = field(default_factory=dict)
    more: bool = False

    def files(self) -> dict[str, dict[str, Any]]:
        """The references' entries merged in order (a later one wins)."""
        merged: dict[str, dict[str, Any]] = {}
        for ref in self.refs:
            merged.update(ref.files)
        return merged


def folds(listed: list[str]) -> bool:
    """Does a save that listed references `listed` (oldest first) read and fold them?"""
    n = len(listed)
    if n <= FOLD_READS or time.time() - int(listed[0][:13]) / 1000 > FOLD_STALE_S:
        return True
    return secrets.randbelow(n) < FOLD_READS


def names(objects: S3Objects, key: str, first: int | None) -> tuple[list[str], bool]:
    """The names of scope `key`'s references in order (with `first`: the first `first`, one
    request), and whether there are more."""
    prefix = objects.refs_prefix(key)
    try:
        listed = objects.bucket.listing(prefix, first)
    except S3Unavailable as exc:
        raise RemoteUnavailable(str(exc)) from None
    found = sorted(n for n in (i["Key"][len(prefix) :] for i in listed) if _NAME.match(n))
    if first is not None and len(found) > first:
        return found[:first], True
    return found, False


def read(
    objects: S3Objects,
    layout: Layout,
    key: str,
    signing_key: str | None,
    first: int | None,
    *,
    warn: bool = True,
) -> Found:
    """Scope `key`'s references as a reader takes them (the oldest `first`; None: all),
    each checked (module docstring); one warning for those left out and one when there are
    more than `first`, unless `warn` is false."""
    listed, more = names(objects, key, first)
    return read_listed(objects, layout, key, signing_key, listed, more, warn=warn)


def read_listed(
    objects: S3Objects,
    layout: Layout,
    key: str,
    signing_key: str | None,
    listed: list[str],
    more: bool,
    *,
    warn: bool = True,
) -> Found:
    """References `listed` (names(): `more` when the listing held more), as read() takes
    them."""
    first = len(listed)
    got: dict[str, Ref | str] = {}
    lock = threading.Lock()

    def one(name: str) -> None:
        try:
            found: Ref | str = _read_one(objects, layout, key, name, signing_key)
        except RemoteCorrupt as exc:
            found = str(exc)
        with lock:
            got[name] = found

    parallel.run(one, listed, parallel.FETCH_WORKERS)
    result = Found(more=more)
    for name in listed:
        item = got.get(name, "removed while being read")
        if isinstance(item, Ref):
            result.refs.append(item)
        elif item != "gone":
            result.ignored[name] = item
    if warn:
        _warn(objects, key, result, first)
    return result


def _warn(objects: S3Objects, key: str, found: Found, first: int | None) -> None:
    if found.ignored:
        name, why = next(iter(sorted(found.ignored.items())))
        gha.warn(
            f"{objects.describe()}: {len(found.ignored)} reference(s) of {key} left out, never "
            f"served (first: {name}: {why}); their files compile again"
        )
    if found.more:
        gha.warn(
            f"{objects.describe()}: {key} has more than {first} unfolded references; read the "
            "oldest, the newer wait for the next folds (a save, or `fxcache invalidate --s3`)"
        )


def _read_one(
    objects: S3Objects, layout: Layout, key: str, name: str, signing_key: str | None
) -> Ref | str:
    """Reference `name`, checked; "gone" when a fold removed it meanwhile (its files are in
    the head); RemoteCorrupt when it is left out."""
    copy = objects.runner_dir(layout) / "refs" / key / name
    try:
        return _checked(objects, layout, key, name, copy.read_bytes(), signing_key)
    except (OSError, RemoteCorrupt):
        pass  # no copy, or not a good one: the bucket's
    try:
        got = objects.bucket.get(objects.where.key("scopes", key, "refs", name),
                                 limit=MAX_HEAD_BYTES)  # fmt: skip
    except S3Missing:
        return "gone"
    except S3TooLarge:
        raise RemoteCorrupt("larger than any reference a save writes") from None
    except S3Unavailable as exc:
        raise RemoteUnavailable(str(exc)) from None
    assert got is not None
    ref = _checked(objects, layout, key, name, got[0], signing_key)
    copy.parent.mkdir(parents=True, exist_ok=True)
    tmp = copy.with_name(f".{name}.{os.getpid()}.{threading.get_ident()}")
    tmp.write_bytes(got[0])
    os.replace(tmp, copy)
    return ref


def _checked(
    objects: S3Objects, layout: Layout, key: str, name: str, body: bytes, signing_key: str | None
) -> Ref:
    try:
        parsed = parse_head(body, key, REF_SCHEMA)
    except RemoteCorrupt as exc:
        raise RemoteCorrupt(str(exc).replace("remote head", "reference")) from None
    if signing_key:
        problem = head_signature_problem(parsed, signing_key)
        if problem:
            raise RemoteCorrupt(problem.replace("remote head", "reference"))
    files: dict[str, dict[str, Any]] = {}
    for seg in parsed["segments"]:
        files.update(objects.segment(layout, seg["sha256"], set(seg["packs"])))
    return Ref(name, parsed, files)


def put(objects: S3Objects, key: str, body: bytes) -> str:
    """Write a new reference of scope `key` (never overwrites one); its name."""
    name = new_name()
    objects.bucket.put(objects.where.key("scopes", key, "refs", name), body, if_absent=True,
                       content_type="application/json")  # fmt: skip
    return name


def delete(objects: S3Objects, key: str, folded: list[str]) -> int:
    """Delete references a head now covers, best-effort (one left behind is folded again,
    harmlessly); how many went."""
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
) -> tuple[dict[str, Any] | None, dict[str, dict[str, Any]]]:
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
