"""Scope manifests: per-file size, mtime and sha256, the fingerprint, times, an optional HMAC.

A manifest is the commit point of a scope: it is written to a temporary file and renamed over
`manifest.json`, so a reader sees the old one or the new one, never a mix.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import stat
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from ci_fxcache import atomic_write
from ci_fxcache.store import in_place, modes, stat_batch
from ci_fxcache.store.layout import CACHE_DIRS, SCOPE_ENTRIES

SCHEMA = "fxcache-manifest/1"


class ManifestError(Exception):
    """The manifest is missing fields, malformed or not ours."""


@dataclass(frozen=True)
class Problem:
    """One integrity failure: kind is missing, truncated, altered, unexpected, symlink, escape."""

    kind: str
    path: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind}: {self.path}" + (f" ({self.detail})" if self.detail else "")


UNLISTED = "not in the manifest"


def is_unlisted(problem: Problem) -> bool:
    """A regular file inside a cache dir that the manifest does not list (not yet saved)."""
    return problem.kind == "unexpected" and problem.detail == UNLISTED


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file's content."""
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def safe_relpath(rel: str) -> bool:
    """True when `rel` names a file inside one of the scope's cache dirs (no `..`, not absolute)."""
    # Substring tests run in C: this is called once per file on every restore.
    framed = "/" + rel + "/"
    return (
        rel.partition("/")[0] in CACHE_DIRS
        and "/" in rel
        and "//" not in framed
        and "/./" not in framed
        and "/../" not in framed
        and "\\" not in rel
        and "\0" not in rel
    )


def _safe_dir(rel: str) -> bool:
    """True when `rel` names a cache dir or a directory inside one."""
    return safe_relpath(rel + "/_")


def _top_level_problems(root: str) -> list[Problem]:
    """Top-level entries that are not part of the scope layout, or are symlinks."""
    problems: list[Problem] = []
    for entry in os.scandir(root):
        if entry.name not in SCOPE_ENTRIES:
            problems.append(Problem("unexpected", entry.name, "not part of the scope layout"))
        elif entry.is_symlink():
            problems.append(Problem("symlink", entry.name, f"-> {os.readlink(entry.path)}"))
    return problems


def _files(
    root: str,
    problems: list[Problem],
    start: list[str] | None = None,
    stamps: dict[str, stat_batch.DirStamp] | None = None,
    locks: list[str] | None = None,
) -> Iterator[tuple[os.DirEntry[str], str]]:
    """Each regular file under the directories `start` (default: the scope's cache dirs), with
    its relative POSIX path; a symlink (never followed) or anything else that is not a plain
    file goes to `problems`. Lock files are not cache content (store.in_place): skipped, and
    their paths added to `locks` when given. With `stamps`, directories already in it are not
    listed (a seal vouches for them) and each listed one is stamped into it before it is
    listed.

    Plain strings and scandir's cached d_type: this runs on every restore and every save."""
    stack = list(CACHE_DIRS if start is None else start)
    queued = set(stack)
    tops = set(stack)
    while stack:
        rel = stack.pop()
        path = os.path.join(root, rel)
        if stamps is not None or rel in tops:
            try:
                st = os.lstat(path)
            except OSError:
                continue  # gone: reported by path as missing, if the manifest lists files in it
            if not stat.S_ISDIR(st.st_mode):
                continue  # a symlink or file: reported by the listing of its parent
            if stamps is not None:
                stamps[rel] = stat_batch.dir_stamp(st)
        with os.scandir(path) as it:
            for entry in it:
                child = rel + "/" + entry.name
                # Regular files first: they are nearly every entry (d_type, no syscall).
                if entry.is_file(follow_symlinks=False):
                    if not in_place.is_lock(entry.name):
                        yield entry, child
                    elif locks is not None:
                        locks.append(child)
                elif entry.is_dir(follow_symlinks=False):
                    if child not in queued and (stamps is None or child not in stamps):
                        queued.add(child)
                        stack.append(child)
                elif entry.is_symlink():
                    problems.append(Problem("symlink", child, f"-> {os.readlink(entry.path)}"))
                else:
                    problems.append(Problem("unexpected", child, "not a regular file"))


def scan(scope_dir: Path) -> tuple[dict[str, os.stat_result], list[Problem]]:
    """Regular files under the cache dirs (relative POSIX path -> lstat) and what is not allowed.

    Symlinks are never followed: each one is a problem (it could point outside the scope), as is
    any top-level entry that is not part of the layout, and anything that is not a plain file.
    """
    root = str(scope_dir)
    problems = _top_level_problems(root)
    files = {rel: entry.stat(follow_symlinks=False) for entry, rel in _files(root, problems)}
    return files, problems


def file_entries(scope_dir: Path, files: dict[str, os.stat_result]) -> dict[str, dict[str, Any]]:
    """Size, mtime and sha256 of each file (hashes every file: the save is the trust anchor)."""
    return {
        rel: {
            "size": st.st_size,
            "mtime_ns": st.st_mtime_ns,
            "sha256": sha256_file(scope_dir / rel),
        }
        for rel, st in sorted(files.items())
    }


def make_read_only(scope_dir: Path, files: dict[str, os.stat_result]) -> None:
    """Drop write permission on committed files so an in-place write fails instead of altering
    a file shared by hardlinks (renames, which Inductor and Triton use, still work). Files
    torch writes in place (store.in_place) are never committed, so never passed here."""
    wanted: dict[int, int] = {}  # by mode: the umask read once per mode, not twice per file
    for rel, st in files.items():
        mode = stat.S_IMODE(st.st_mode)
        read_only = wanted.get(mode)
        if read_only is None:
            read_only = wanted[mode] = modes.read_only_mode(mode)
        if mode != read_only:
            os.chmod(scope_dir / rel, read_only)


def regular_files(directory: Path) -> Iterator[os.stat_result]:
    """The lstat of each regular file under `directory` (symlinks not followed; a file that
    vanishes during the walk is skipped)."""
    for dirpath, _dirs, names in os.walk(directory):
        for name in names:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                yield st


def holds_committed_files(directory: Path) -> bool:
    """Whether `directory` holds a regular file a save committed (`make_read_only` took its
    write permission; hardlinked overlays share it). Used by whoever would empty a directory
    under a scope: committed files are never deleted by a job, only by the store."""
    return any(not st.st_mode & 0o222 for st in regular_files(directory))


def _payload(manifest: dict[str, Any]) -> bytes:
    body = {k: v for k, v in manifest.items() if k != "signature"}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")


def sign(manifest: dict[str, Any], key: str) -> None:
    """Add an HMAC-SHA256 of the manifest's canonical JSON (everything but the signature)."""
    digest = hmac.new(key.encode("utf-8"), _payload(manifest), hashlib.sha256).hexdigest()
    manifest["signature"] = {"alg": "hmac-sha256", "value": digest}


def signature_problem(manifest: dict[str, Any], key: str) -> str | None:
    """None when the manifest carries a valid HMAC for `key`, else why not."""
    sig = manifest.get("signature")
    if not isinstance(sig, dict) or sig.get("alg") != "hmac-sha256":
        return "manifest is not signed"
    try:
        payload = _payload(manifest)
    except (ValueError, RecursionError):
        return "manifest cannot be canonicalised for its signature"
    expected = hmac.new(key.encode("utf-8"), payload, hashlib.sha256).hexdigest()
    value = str(sig.get("value", "")).encode("utf-8", "surrogatepass")
    if not hmac.compare_digest(expected.encode("ascii"), value):
        return "manifest signature does not match the signing key"
    return None


def is_count(value: object) -> bool:
    """A non-negative int (not a bool): a size, an offset, an mtime."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


_HEX = "0123456789abcdef"


def is_digest(value: object) -> bool:
    """A lowercase hex sha256."""
    # strip() runs in C: this is called once per file on every restore.
    return isinstance(value, str) and len(value) == 64 and not value.strip(_HEX)


# Exactly the fields `save` writes (a signature only with a signing key); anything else in a
# manifest is a quarantine. A new field is added here and in save.py together.
FIELDS = frozenset(
    {
        "schema", "scope_key", "fingerprint", "torch_paths", "created_at", "updated_at",
        "last_used_at", "verification", "files", "total_bytes",
    }
)  # fmt: skip
OPTIONAL_FIELDS = frozenset({"signature"})


def _is_strings(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _shape_problem(data: object) -> str | None:
    """Why a parsed manifest is not one `save` could have written, or None: every field of
    `FIELDS` present with the type save gives it, no other field, and a file list whose sizes
    add up to `total_bytes`."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        return "not an fxcache manifest"
    if not isinstance(data.get("scope_key"), str):
        return "manifest has no scope key"
    unknown = sorted(set(data) - FIELDS - OPTIONAL_FIELDS)
    if unknown:
        return f"manifest has unknown field(s): {', '.join(repr(k[:40]) for k in unknown[:5])}"
    missing = sorted(FIELDS - set(data))
    if missing:
        return f"manifest lacks field(s): {', '.join(missing)}"
    if not isinstance(data["fingerprint"], dict):
        return "manifest fingerprint is malformed"
    if not _is_strings(data["torch_paths"]):
        return "manifest torch_paths is malformed"
    if not all(isinstance(data[k], str) for k in ("created_at", "updated_at", "last_used_at")):
        return "manifest times are malformed"
    verification = data["verification"]
    if not (
        isinstance(verification, dict)
        and set(verification) == {"references"}
        and _is_strings(verification["references"])
    ):
        return "manifest verification is malformed"
    signature = data.get("signature")
    if "signature" in data and not (
        isinstance(signature, dict)
        and set(signature) == {"alg", "value"}
        and all(isinstance(signature[k], str) for k in ("alg", "value"))
    ):
        return "manifest signature is malformed"
    files = data["files"]
    if not isinstance(files, dict):
        return "manifest has no file list"
    for rel, meta in files.items():
        if not (
            isinstance(meta, dict)
            and is_count(meta.get("size"))
            and is_digest(meta.get("sha256"))
            and ("mtime_ns" not in meta or is_count(meta["mtime_ns"]))
            and len(meta) == 2 + ("mtime_ns" in meta)  # no other field
        ):
            return f"manifest entry {rel[:200]!r} is malformed"
    total = data["total_bytes"]
    if not is_count(total) or total != sum(meta["size"] for meta in files.values()):
        return "manifest total_bytes does not match its files"
    return None


class _Duplicate(ValueError):
    """A JSON object with a key twice: json keeps the last one, save never writes it."""


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        raise _Duplicate("duplicate key in a JSON object")
    return result


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def load(path: Path) -> dict[str, Any]:
    """Read and shape-check a manifest; ManifestError when it is unusable, whatever it holds
    (bad encodings, any nesting depth, huge numbers, wrong types)."""
    return read(path)[0]


def read(path: Path) -> tuple[dict[str, Any], str]:
    """`load`, and the sha256 of the manifest file (what a seal belongs to)."""
    raw, digest = read_raw(path)
    return parse(raw), digest


def read_raw(path: Path) -> tuple[bytes, str]:
    """The manifest file's bytes and their sha256, unparsed; ManifestError when unreadable."""
    try:
        raw = path.read_bytes()
    except PermissionError:
        raise  # not a sign of tampering: the caller falls back cold, the scope stays
    except OSError as exc:
        raise ManifestError(f"unreadable manifest: {str(exc)[:200]}") from exc
    return raw, hashlib.sha256(raw).hexdigest()


def parse(raw: bytes) -> dict[str, Any]:
    """A manifest file's bytes, parsed and shape-checked; ManifestError when unusable."""
    try:
        data = json.loads(
            raw.decode("utf-8"), object_pairs_hook=_unique, parse_constant=_no_constant
        )
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        # ValueError covers malformed JSON and integers beyond Python's digit limit.
        raise ManifestError(f"unreadable manifest: {str(exc)[:200]}") from exc
    problem = _shape_problem(data)
    if problem is not None:
        raise ManifestError(problem)
    assert isinstance(data, dict)
    return data


class Listed(NamedTuple):
    """Every file a manifest lists, in its order, with the size and mtime it records (-1 when
    it records none): all the fast check compares, without the sha256s."""

    names: list[str]
    sizes: list[int]
    mtimes: list[int]


def listed(manifest: Mapping[str, Any]) -> Listed:
    """The `Listed` of a shape-checked manifest."""
    files: dict[str, dict[str, Any]] = manifest["files"]
    metas = files.values()
    return Listed(list(files), [m["size"] for m in metas], [m.get("mtime_ns", -1) for m in metas])


@dataclass(frozen=True)
class Committed:
    """A manifest as a save checked, signed and wrote it under the scope's lock: its parse
    and its exact text (a signature stays valid over the text). What a publish sends: never
    a re-read of `manifest.json`, which a key-less writer of the store can swap once the
    lock is released."""

    manifest: dict[str, Any]
    text: str

    @classmethod
    def of(cls, manifest: dict[str, Any]) -> Committed:
        """`manifest` and the text write_atomic writes for it: one line, without spaces.
        json's C encoder makes it; with `indent` json encodes in Python, 2.6x slower (0.4 s
        against 0.16 s for 100,000 files, on every save and every fetch of a scope)."""
        return cls(manifest, json.dumps(manifest, sort_keys=True, separators=(",", ":")) + "\n")

    @classmethod
    def read(cls, path: Path) -> Committed:
        """A manifest file as it is now, for tools that publish without a save (benchmarks,
        tests); ManifestError when unusable."""
        raw, _digest = read_raw(path)
        return cls(parse(raw), raw.decode("utf-8"))


def write_atomic(
    path: Path,
    manifest: dict[str, Any] | Committed,
    tmp_dir: Path,
    before_rename: Callable[[], None] | None = None,
) -> str:
    """Write the manifest as JSON through a temporary file in `tmp_dir` (same filesystem);
    the sha256 of what was written."""
    text = (manifest if isinstance(manifest, Committed) else Committed.of(manifest)).text
    atomic_write.write_text(path, text, tmp_dir, before_rename, modes.file_mode())
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Inspection:
    """What `inspect` found: the problems, and (when asked) the stamp of every directory under
    the cache dirs, taken before it was listed or matched against a seal, for the next seal."""

    problems: list[Problem]
    dir_stamps: dict[str, stat_batch.DirStamp]
    listed_dirs: int
    started_ns: int  # wall clock when the inspection began (see store.seal)
    locks: tuple[str, ...] = ()  # lock files in the directories it listed (store.in_place)


def _compare(
    root: str, dirs: stat_batch.Dirs, files: list[str], sizes: list[int], mtimes: list[int]
) -> tuple[set[int], list[int]]:
    """One stat batch: (indices into `dirs` whose inode or ctime changed, indices into `files`
    whose size or mtime differs from `sizes` / `mtimes`, which may be shorter than `files`: the
    rest are not compared)."""
    prefix = root + "/"
    paths = [prefix + rel for rel in dirs.names]
    paths += [prefix + rel for rel in files[: len(sizes)]]
    count = len(dirs.names)
    differ = stat_batch.mismatches(paths, count, dirs.inodes + sizes, dirs.ctimes + mtimes)
    return {i for i in differ if i < count}, [i - count for i in differ if i >= count]


def _walk(
    root: str,
    problems: list[Problem],
    dirs: stat_batch.Dirs,
    changed: set[int],
    stamp: bool,
    locks: list[str] | None = None,
) -> tuple[dict[str, stat_batch.DirStamp], list[str], int]:
    """List what no unchanged sealed directory vouches for: (the stamps of every directory
    checked, sealed ones first; the regular files found; how many directories were listed);
    the lock files found go to `locks`."""
    names, inodes, ctimes = dirs
    stamps = {names[i]: (inodes[i], ctimes[i]) for i in range(len(names)) if i not in changed}
    start = [top for top in CACHE_DIRS if top not in stamps]
    # A seal is input like any other file: only directories inside the cache dirs are listed.
    start += [names[i] for i in sorted(changed) if _safe_dir(names[i])]
    unchanged = len(stamps)
    walked = _files(root, problems, start, stamps if stamp else None, locks)
    found = [rel for _entry, rel in walked]
    return stamps, found, len(stamps) - unchanged


def inspect(
    scope_dir: Path,
    manifest: dict[str, Any],
    full: bool,
    sealed: stat_batch.Dirs | None = None,
    stamp: bool = True,
) -> Inspection:
    """Compare the scope's files with its manifest.

    Fast mode compares sizes and mtimes and re-hashes only files whose mtime changed; `full`
    re-hashes every file. Unlisted files, symlinks, anything else that is not a plain file and
    entries that would leave the scope are problems too. Directories in `sealed` (see
    store.seal) whose inode and ctime are unchanged are stat'ed instead of listed; `full`
    ignores seals. This runs on every restore: the stats are spread over CPUs (stat_batch).
    Without `stamp`, listed directories are not stamped (nobody will seal them).
    """
    started_ns = time.time_ns()
    entries: dict[str, dict[str, Any]] = manifest["files"]
    root = str(scope_dir)
    problems = _top_level_problems(root)
    dirs = sealed if sealed is not None and not full else stat_batch.NO_DIRS
    # Lock files listed by an older save are not content (store.in_place): never checked.
    safe = [rel for rel in entries if safe_relpath(rel)]
    files = [rel for rel in safe if not in_place.is_lock(rel)]
    if len(safe) != len(entries):
        problems.extend(
            Problem("escape", rel, "manifest entry leaves the scope")
            for rel in entries
            if not safe_relpath(rel)
        )
    metas = [] if full else [entries[rel] for rel in files]
    sizes = [meta["size"] for meta in metas]
    changed, differ = _compare(
        root, dirs, files, sizes, [meta.get("mtime_ns", -1) for meta in metas]
    )
    locks: list[str] = []
    stamps, found, listed = _walk(root, problems, dirs, changed, stamp, locks)
    problems.extend(Problem("unexpected", rel, UNLISTED) for rel in found if rel not in entries)
    prefix = root + "/"
    for i in range(len(files)) if full else differ:
        problem = _file_problem(files[i], prefix + files[i], entries[files[i]], full)
        if problem is not None:
            problems.append(problem)
    return Inspection(problems, stamps, listed, started_ns, tuple(locks))


def inspect_listed(scope_dir: Path, expected: Listed, sealed: stat_batch.Dirs) -> Inspection | None:
    """The fast check against a manifest's `Listed` alone (a seal's copy: see store.seal),
    without parsing the manifest: the Inspection when it finds nothing wrong, None as soon as
    anything differs (then `inspect` with the manifest says what). When every directory is as
    sealed, nothing is listed and `dir_stamps` is empty: the seal stands as it is."""
    started_ns = time.time_ns()
    root = str(scope_dir)
    problems = _top_level_problems(root)
    if problems or not len(expected.names) == len(expected.sizes) == len(expected.mtimes):
        return None
    changed, differ = _compare(root, sealed, expected.names, expected.sizes, expected.mtimes)
    if differ:
        return None
    if not changed and all(top in sealed.names for top in CACHE_DIRS):
        return Inspection([], {}, 0, started_ns)
    stamps, found, listed = _walk(root, problems, sealed, changed, True)
    if problems or (found and not set(found) <= set(expected.names)):
        return None
    return Inspection(problems, stamps, listed, started_ns)


def unchanged_since_written(
    scope_dir: Path, dirs: stat_batch.Dirs, files: list[str], inodes: list[int], ctimes: list[int]
) -> bool:
    """Whether every directory of `dirs` and every file of `files` still has the inode and
    ctime it had when written (`inodes`, `ctimes`: one each per file), and the scope holds
    nothing else at its top level (store.seal.Fresh says what this proves)."""
    root = str(scope_dir)
    if _top_level_problems(root) or not all(top in dirs.names for top in CACHE_DIRS):
        return False
    if not len(files) == len(inodes) == len(ctimes):
        return False
    prefix = root + "/"
    paths = [prefix + rel for rel in dirs.names] + [prefix + rel for rel in files]
    firsts, seconds = dirs.inodes + inodes, dirs.ctimes + ctimes
    return not stat_batch.mismatches(paths, len(dirs.names), firsts, seconds, files_by_inode=True)


def _file_problem(rel: str, path: str, meta: dict[str, Any], full: bool) -> Problem | None:
    """Why the file at `path` is not the manifest's entry `meta`, or None (same content)."""
    try:
        st = os.lstat(path)
    except OSError:
        return Problem("missing", rel)
    if not stat.S_ISREG(st.st_mode):
        return Problem("missing", rel)
    size = meta["size"]
    if st.st_size != size:
        kind = "truncated" if st.st_size < size else "altered"
        return Problem(kind, rel, f"{st.st_size} bytes, expected {size}")
    if (full or st.st_mtime_ns != meta.get("mtime_ns")) and sha256_file(Path(path)) != meta[
        "sha256"
    ]:
        return Problem("altered", rel, "sha256 differs")
    return None


def check(scope_dir: Path, manifest: dict[str, Any], full: bool) -> list[Problem]:
    """The problems `inspect` finds, without seals."""
    return inspect(scope_dir, manifest, full).problems
