"""`fxcache invalidate`'s result (the JSON it prints with `--json`) rendered: the terminal's
lines for the S3 inventory, and markdown for the scheduled workflow's job summary."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ci_fxcache.report import text_table
from ci_fxcache.report.render import md_text
from ci_fxcache.store import policies

_REMOVING = ("would remove", "removed")
_HEADER = ["action", "scope", "torch", "arch", "files", "size", "in bucket", "last used", "why"]


def when(epoch: float | None) -> str:
    """A time of last use, in UTC to the minute ("never" for none)."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M") if epoch else "never"


def human_bytes(n: float | None) -> str:
    """1536 -> '1.5 KiB' ('?' when unknown)."""
    return "?" if n is None else policies.human_bytes(n)


def _first_upper(text: str) -> str:
    return text[:1].upper() + text[1:]


def freed_bytes(result: dict[str, Any]) -> int:
    """What the run frees (or would): the removed local and GitHub caches' bytes, and for S3
    what its collection deletes (packs shared with kept scopes stay, so the removed scopes'
    sizes are not added up)."""
    own = sum(r["bytes"] for r in result["rows"] if r["store"] != "s3" and r["action"] in _REMOVING)
    s3 = result.get("s3")
    return own + (s3["gc"]["bytes_removed"] if s3 else 0)


def _arch(row: dict[str, Any]) -> str:
    return "_".join(row["archs"]) or str(row["accel"])


def _inventory_cells(row: dict[str, Any]) -> list[str]:
    files = row["files"]
    action = str(row["action"])
    return [
        f"{action} (head unreadable)" if row["problem"] else action,
        str(row["scope"]),
        str(row["torch"]),
        _arch(row),
        "?" if files is None else str(files),
        human_bytes(row["bytes"]),
        human_bytes(row["stored_bytes"]),
        when(row["last_used"]),
        "; ".join(row["reasons"]) or (row["problem"] or ""),
    ]


def _versions_clause(bucket: dict[str, Any]) -> str:
    """What a versioned bucket stores besides the current objects (nothing otherwise)."""
    if "noncurrent_versions" not in bucket:
        return ""
    return (
        f"; versioning {bucket['versioning']}: {bucket['noncurrent_versions']} noncurrent "
        f"version(s) and {bucket['delete_markers']} delete marker(s), "
        f"{human_bytes(bucket['noncurrent_bytes'])} more"
    )


def _gc_sentence(s3: dict[str, Any]) -> str:
    gc = s3["gc"]
    verb = "would remove" if s3["dry_run"] else "removed"
    text = (
        f"{verb} {gc['objects_removed']} unreferenced object(s) "
        f"({human_bytes(gc['bytes_removed'])}), kept {gc['kept_in_grace']} in the grace period"
    )
    if gc.get("unreadable"):
        kept = sum(u["kept_objects"] for u in gc["unreadable"])
        text += f"; {len(gc['unreadable'])} unreadable head(s): kept the {kept} object(s) they name"
    if "versions_removed" in gc:
        text += (
            f"; {verb} {gc['versions_removed']} noncurrent version(s) and delete marker(s) "
            f"({human_bytes(gc['version_bytes_removed'])})"
        )
    if gc.get("error"):
        text += f"; collection stopped: {gc['error']}"
    if gc.get("needs_key"):
        text += f"; {gc['needs_key']}"
    return text


def s3_lines(s3: dict[str, Any]) -> list[str]:
    """The S3 inventory and collection as terminal lines."""
    lines = [f"S3 {s3['url']}:"]
    if s3["scopes"]:
        table = [_HEADER] + [_inventory_cells(r) for r in s3["scopes"]]
        lines.extend(text_table.lines(table, right={4, 5, 6}, rule=True))
    bucket = s3["bucket"]
    lines.append(
        f"bucket: {bucket['scopes']} scope(s), {bucket['objects']} pack/segment object(s), "
        f"{human_bytes(bucket['bytes'])}{_versions_clause(bucket)}"
    )
    lines.append(_gc_sentence(s3))
    return lines


def markdown(result: dict[str, Any]) -> str:
    """The job summary of an `invalidate` run (every store it covered)."""
    verb = "would free" if result["dry_run"] else "freed"
    out = [f"## fxcache invalidate{' (dry run)' if result['dry_run'] else ''}", ""]
    others = [r for r in result["rows"] if r["store"] != "s3"]
    if others:
        out += ["| action | store | cache | size | last used | why |", "|---|---|---|--:|---|---|"]
        for r in others:
            cells = [r["action"], r["store"], r["scope"], human_bytes(r["bytes"]),
                     when(r["last_used"]), "; ".join(r["reasons"])]  # fmt: skip
            out.append("| " + " | ".join(md_text(c) for c in cells) + " |")
        out.append("")
    s3 = result.get("s3")
    if s3:
        bucket = s3["bucket"]
        out += [
            f"### S3 {md_text(s3['url'])}",
            "",
            f"{bucket['scopes']} scope(s), {bucket['objects']} pack/segment object(s), "
            f"{human_bytes(bucket['bytes'])} in the bucket{_versions_clause(bucket)}.",
            "",
        ]
        if s3["scopes"]:
            out += ["| " + " | ".join(_HEADER) + " |", "|---|---|---|---|--:|--:|--:|---|---|"]
            for r in s3["scopes"]:
                out.append("| " + " | ".join(md_text(c) for c in _inventory_cells(r)) + " |")
            out.append("")
        out += [_first_upper(md_text(_gc_sentence(s3))) + ".", ""]
    redis = result.get("redis")
    if redis:
        out += [
            f"Redis {md_text(redis['url'])}: scanned {redis['scanned']} keys, "
            f"{'would remove' if redis['dry_run'] else 'removed'} {redis['would_remove']} idle "
            f"ones ({human_bytes(redis['bytes'])}).",
            "",
        ]
    out.append(f"{_first_upper(verb)} {human_bytes(freed_bytes(result))}.")
    return "\n".join(out) + "\n"
