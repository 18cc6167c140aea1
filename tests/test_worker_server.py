"""The fork server's check of the CPU's vector instructions (worker/server.py): only for a CPU
phase, and never a reason for the server to stop (the phases then check for themselves)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from ci_fxcache.worker import server


def _request(kind: str, device: str) -> dict[str, object]:
    return {"id": 1, "kind": kind, "spec": {"combo": {"device": device}}}


@pytest.mark.parametrize(
    ("kind", "device"), [("phase", "cuda"), ("check", "cpu"), ("identity", "cpu")]
)
def test_only_a_cpu_phase_starts_the_check(kind: str, device: str) -> None:
    assert server._check_vector_isa(_request(kind, device)) is False


def test_no_temp_dir_to_write_to_skips_the_check_without_raising(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "missing"))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    assert server._check_vector_isa(_request("phase", "cpu")) is True
    assert not (tmp_path / "missing").exists()
