"""triton's version is read from its dist-info (any of its distribution names), without import."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import TORCH_PYTHON, RunFxcache


@pytest.mark.parametrize("dist", ["triton", "pytorch_triton"])
def test_triton_version_from_dist_info(run_fxcache: RunFxcache, tmp_path: Path, dist: str) -> None:
    site = tmp_path / "site"
    (site / "triton").mkdir(parents=True)
    (site / "triton" / "__init__.py").write_text("raise SystemExit('triton was imported')\n")
    (site / f"{dist}-3.5.1+gitabc123.dist-info").mkdir()
    env = {"PYTHONPATH": str(site)}
    proc = run_fxcache("fingerprint", "--json", "--python", TORCH_PYTHON, env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["fingerprint"]["triton_version"] == "3.5.1+gitabc123"
    with_triton = run_fxcache("key", "--python", TORCH_PYTHON, env=env).stdout
    without = run_fxcache("key", "--python", TORCH_PYTHON).stdout
    assert with_triton != without  # triton can change generated code: it is keyed
