"""Helpers for the store tests: drive `fxcache restore` / `save` as real subprocesses."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.conftest import TORCH_PYTHON, RunFxcache


@dataclass
class Store:
    """A tiny store root plus the CLI runner."""

    root: Path
    run: RunFxcache
    env: dict[str, str]

    def restore(
        self,
        *extra: str,
        state: str = "state.json",
        env: dict[str, str] | None = None,
        ok: bool = True,
        python: str = TORCH_PYTHON,
    ) -> dict[str, Any]:
        """Run `fxcache restore --json`; return the state object (stderr under `_stderr`)."""
        proc = self.run(
            "restore",
            "--root",
            str(self.root),
            "--python",
            python,
            "--json",
            "--state-file",
            str(self.root.parent / state),
            *extra,
            env={**self.env, **(env or {})},
        )
        assert proc.returncode == 0, proc.stderr
        data: dict[str, Any] = json.loads(proc.stdout)
        data["_stderr"] = proc.stderr
        return data

    def save(self, state: str = "state.json", env: dict[str, str] | None = None) -> Any:
        """Run `fxcache save --json`; return the completed process."""
        return self.run(
            "save",
            "--json",
            "--state-file",
            str(self.root.parent / state),
            env={**self.env, **(env or {})},
        )


def lease_holders(root: Path) -> list[int]:
    """The pids of the processes holding the leases under store `root` (store.scopes)."""
    pids = []
    for lease in (root / ".leases").glob("*/*.json"):
        try:
            pid = json.loads(lease.read_text()).get("holder_pid")
        except (OSError, ValueError):
            continue
        if isinstance(pid, int):
            pids.append(pid)
    return pids


def end_lease_holders(root: Path) -> None:
    """Kill the lease holders of store `root` (a test's jobs whose owner, the test process,
    outlives them: a holder keeps its lease file open, so a filesystem could not unmount)."""
    for pid in lease_holders(root):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def mount_tmpfs(path: Path, size: str) -> bool:
    """Mount a tmpfs of `size` at `path` (made here): a tiny filesystem to fill; False when
    this user may not mount."""
    path.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        check=False,
    )
    return proc.returncode == 0


def write_files(base: str | Path, files: dict[str, bytes]) -> None:
    """Write `files` (relative path -> content) under `base`, as Inductor would (tmp + rename)."""
    for rel, content in files.items():
        path = Path(base) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(content)
        os.replace(tmp, path)


def committed_scope(
    root: Path, key: str, files: dict[str, bytes], signing_key: str | None = None
) -> Any:
    """Scope `key` of the store at `root` committed with `files` as a save leaves it (signed
    with `signing_key` when given): its `manifest.Committed`."""
    from ci_fxcache.store import manifest as mf
    from ci_fxcache.store.layout import Layout

    layout = Layout(root)
    write_files(layout.scope(key), files)
    found, problems = mf.scan(layout.scope(key))
    assert problems == []
    entries = mf.file_entries(layout.scope(key), found)
    stamp = "2026-12-06T00:00:00Z"
    manifest = {"schema": mf.SCHEMA, "scope_key": key, "fingerprint": {}, "torch_paths": [],
                "created_at": stamp, "updated_at": stamp, "last_used_at": stamp,
                "verification": {"references": []}, "files": entries,
                "total_bytes": sum(m["size"] for m in entries.values())}  # fmt: skip
    if signing_key:
        mf.sign(manifest, signing_key)
    (root / ".locks").mkdir(parents=True, exist_ok=True)
    mf.write_atomic(layout.manifest(key), manifest, root / ".locks")
    return mf.Committed.read(layout.manifest(key))


def tree_digest(base: str | Path) -> dict[str, str]:
    """Relative path -> sha256 of every regular file under `base`."""
    base = Path(base)
    return {
        p.relative_to(base).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(base.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


SAMPLE = {
    "inductor/fxgraph/ab/entry1": b"graph-one" * 100,
    "inductor/aotautograd/cd/entry2": b"autograd" * 50,
    "triton/KERNELHASH/kernel.so": bytes(range(256)) * 40,
}


class FailingFile(io.BytesIO):
    """A file whose second read fails: a multipart upload that dies after its first part."""

    reads = 0

    def read(self, n: int | None = -1) -> bytes:
        self.reads += 1
        if self.reads > 1:
            raise OSError("disk gone")
        return super().read(n)


def unsigned_jwt(claims: dict[str, Any]) -> str:
    """A JWT of `claims` with no signature (what the token stand-ins issue and take)."""

    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part(claims)}.c2ln"
