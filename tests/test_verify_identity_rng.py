"""A workload identity that does not cry wolf (issue 47).

Real jobs (the README's flow: restore, verify, save; real compiles in fresh processes) of two
user factories: one draws its weights from numpy's global RNG and its batch from Python's
`random`, neither seeded by the factory (a data pipeline does); the other draws from
`os.urandom` (no seed can fix it). Before, each was "the model changed since the recorded
reference" on every job: a cold compile and one more stored version each time. The first also
imports a library installed beside it; upgraded under the model, the report names it with both
versions.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from ci_fxcache.verify import versions
from tests.conftest import RunFxcache
from tests.test_verify_workload_change import Job

pytestmark = pytest.mark.slow

SEEDED, WILD = "rngmodels.seeded:factory", "rngmodels.wild:factory"
MATRIX = ("--dtypes", "float32", "--dynamic", "false", "--mechanisms", "fxgraph")
MATRIX += ("--training", "false", "--device", "cpu", "--workloads", f"{SEEDED},{WILD}")

PACKAGE = {
    "work/rngmodels/__init__.py": "",
    "work/rngmodels/seeded.py": """import random

import fakelib
import numpy
import torch


def factory(dtype, device):
    model = torch.nn.Linear(16, 8)
    with torch.no_grad():
        model.weight.copy_(torch.from_numpy(numpy.random.standard_normal((8, 16))))
    batch = [[random.gauss(0.0, 1.0) for _ in range(16)] for _ in range(6)]
    x = fakelib.scale(torch.tensor(batch))
    return {"model": model.to(device, dtype), "inputs": (x.to(device, dtype),)}
""",
    "work/rngmodels/wild.py": """import os

import torch


def factory(dtype, device):
    generator = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little"))
    model = torch.nn.Linear(16, 8)
    with torch.no_grad():
        model.weight.copy_(torch.randn(8, 16, generator=generator))
    x = torch.randn(6, 16, generator=generator)
    return {"model": model.to(device, dtype), "inputs": (x.to(device, dtype),)}
""",
    # A library installed beside the model (its own distribution, found by its metadata).
    "vendor/fakelib/__init__.py": "def scale(x):\n    return x * 0.5\n",
}


def _install_fakelib(vendor: Path, version: str) -> None:
    """fakelib `version`'s metadata (the module's bytes stay the same: only the version moves)."""
    for old in vendor.glob("fakelib-*.dist-info"):
        shutil.rmtree(old)
    info = vendor / f"fakelib-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fakelib\nVersion: {version}\n")
    (info / "top_level.txt").write_text("fakelib\n")


def _combos(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["workload"]: c for c in doc["combos"]}


def _kinds(combo: dict[str, Any]) -> list[str]:
    return [n["kind"] for n in combo["notes"]]


def test_factories_drawing_from_unseeded_generators_run_hot_only_on_the_next_job(
    tmp_path: Path, run_fxcache: RunFxcache
) -> None:
    for rel, text in PACKAGE.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    vendor = tmp_path / "vendor"
    _install_fakelib(vendor, "0.7.0")
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(vendor), os.environ.get("PYTHONPATH")]))}
    job = Job(run_fxcache, tmp_path, MATRIX)

    first = job(env=env)
    assert first["settings"]["phase"] == "both"
    combos = _combos(first)
    assert all(c["verdict"] == "safe" for c in combos.values()), first["stdout"]
    # numpy's and Python's RNGs are seeded before the factory: it builds the same bits twice
    assert "factory-nondeterministic" not in _kinds(combos[SEEDED])
    (note,) = [n for n in combos[WILD]["notes"] if n["kind"] == "factory-nondeterministic"]
    assert note["text"] == versions.FACTORY_TEXT

    second = job(env=env)  # hot only, by the one reference each recorded, named once
    assert second["settings"]["phase"] == "hot", second["stdout"]
    for workload, combo in _combos(second).items():
        assert combo["verdict"] == "safe", (workload, combo["reason"])
        assert not {"workload-changed", "factory-nondeterministic"} & set(_kinds(combo))
        assert len(versions.recorded(Path(second["verify_dir"]) / combo["id"])) == 1

    _install_fakelib(vendor, "0.8.0")  # upgraded under the model
    third = job(env=env)
    seeded, wild = _combos(third)[SEEDED], _combos(third)[WILD]
    (note,) = [n for n in seeded["notes"] if n["kind"] == "workload-changed"]
    assert note["why"] == "a library it imports changed version (fakelib 0.7.0 -> 0.8.0)"
    assert seeded["verdict"] == "safe", seeded["reason"]
    assert "workload-changed" not in _kinds(wild)  # it does not import fakelib
    assert "fakelib 0.7.0 -> 0.8.0" in third["stdout"]
    assert json.dumps(third).count("factory-nondeterministic") == 0
