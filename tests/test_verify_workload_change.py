"""A model edit is not a cache failure (issue 38).

A user's workload, a package in the job's working directory, runs through the README's flow
(`fxcache restore`, `fxcache verify --workloads usermodels.net:factory`, `fxcache save`) with
real compiles in fresh processes; then it is edited (its source, its weights' initialisation,
its inputs, a module it imports) and the job runs again. Before, the hot-only run judged the
edited model against the old model's reference and failed the job (`unsafe`).
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ci_fxcache.report import labels, render
from ci_fxcache.verify import versions
from tests.conftest import TORCH_PYTHON, RunFxcache
from tests.faults import tamper_generated_code
from tests.test_report import build

pytestmark = pytest.mark.slow

WORKLOAD = "usermodels.net:factory"
MATRIX = ("--dtypes", "float32", "--dynamic", "false", "--mechanisms", "fxgraph,aot")
MATRIX += ("--training", "false", "--device", "cpu", "--workloads", WORKLOAD)

# The user's package. The factory reads a data file (its weights' scale and batch size), so
# that those edits change nothing but the weights or the inputs.
PACKAGE = {
    "usermodels/__init__.py": "",
    "usermodels/layers.py": "import torch\n\n\ndef act(x):\n    return torch.relu(x)\n",
    "usermodels/config.json": '{"init_scale": 1.0, "batch": 8}\n',
    "usermodels/net.py": '''import json
import os
from pathlib import Path

import torch
from torch import nn

from usermodels.layers import act

CONFIG = json.loads((Path(__file__).parent / "config.json").read_text())


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(32, 16)
        with torch.no_grad():
            self.lin.weight.mul_(CONFIG["init_scale"])

    def forward(self, x):
        y = act(self.lin(x))
        if os.environ.get("USERMODELS_ALT"):  # the same values but for the last bits
            y = (y * 3.0) / 3.0
        return y


def _tamper_hot_cache():
    """USERMODELS_TAMPER: a co-tenant rewrites this combination's cache between the phases:
    the hot phase's cache dir (under verify's dir) already holds the cold phase's entries."""
    cache, verify = os.environ.get("TORCHINDUCTOR_CACHE_DIR"), os.environ["FXCACHE_VERIFY_DIR"]
    if not cache or not cache.startswith(verify) or not os.path.isdir(cache):
        return
    for path in Path(cache).rglob("*.py"):
        text = path.read_text()
        if "def call(" in text and "runner.call" in text:
            path.chmod(0o644)
            path.write_text(text + TAMPER)


TAMPER = """

_fxcache_original_call = call


def call(args):
    return [o + 1 for o in _fxcache_original_call(args)]
"""


def factory(dtype, device):
    if os.environ.get("USERMODELS_TAMPER"):
        _tamper_hot_cache()
    model = Net().to(dtype=dtype, device=device)
    return {"model": model, "inputs": (torch.randn(CONFIG["batch"], 32, dtype=dtype),)}
''',
}
# Each edit: the file, the text replaced, its replacement, what the report must say changed.
NET, CONFIG, LAYERS = "usermodels/net.py", "usermodels/config.json", "usermodels/layers.py"
EDITS = {
    "source": (NET, "y = act(self.lin(x))", "y = act(self.lin(x)) * 2.0", "its source changed"),
    "weights": (CONFIG, '"init_scale": 1.0', '"init_scale": 0.5', "its initial weights changed"),
    "inputs": (CONFIG, '"batch": 8', '"batch": 6', "its inputs changed"),
    "imported module": (LAYERS, "torch.relu(x)", "torch.sigmoid(x)", "its source changed"),
}


def _exports(stdout: str) -> dict[str, str]:
    env = {}
    for line in stdout.splitlines():
        if line.startswith("export "):
            name, _, value = line[len("export ") :].partition("=")
            env[name] = shlex.split(value)[0]
    return env


class Job:
    """The README's flow in a working directory `work` against the store at `root`."""

    def __init__(
        self, run_fxcache: RunFxcache, base: Path, matrix: tuple[str, ...] = MATRIX
    ) -> None:
        self.run_fxcache, self.base = run_fxcache, base
        self.work, self.root = base / "work", base / "root"
        self.count = 0
        self.matrix = matrix

    def __call__(
        self,
        *restore: str,
        env: dict[str, str] | None = None,
        rc: int = 0,
        after_restore: Callable[[Path], None] | None = None,
    ) -> dict[str, Any]:
        """One job: its results document (`stdout` and `verify_dir` added). `after_restore`
        gets the verify dir between the restore (and its integrity check) and verify, and
        the job then does not save (the save would find the change and quarantine)."""
        self.count += 1
        common = {
            "FXCACHE_ROOT": str(self.root),
            "TMPDIR": str(self.base),
            "TORCHINDUCTOR_COMPILE_THREADS": "1",
            **(env or {}),
        }
        run = self.run_fxcache
        restored = run("restore", "--python", TORCH_PYTHON, *restore, env=common, cwd=self.work)
        assert restored.returncode == 0, restored.stderr
        job_env = {**common, **_exports(restored.stdout)}
        if after_restore is not None:
            after_restore(Path(job_env["FXCACHE_VERIFY_DIR"]))
        out = self.base / f"results-{self.count}.json"
        verified = run(
            "verify", "--python", TORCH_PYTHON, *self.matrix, "--json", str(out),
            env=job_env, timeout=900, cwd=self.work,
        )  # fmt: skip
        assert verified.returncode == rc, verified.stdout + verified.stderr
        if after_restore is None:
            saved = run("save", env=job_env, cwd=self.work)
            assert saved.returncode == 0, saved.stderr
        doc = json.loads(out.read_text())
        from tests.test_results_schema import validate

        validate(doc)
        return {**doc, "stdout": verified.stdout, "verify_dir": job_env["FXCACHE_VERIFY_DIR"]}

    def edit(self, name: str) -> str:
        path, old, new, why = EDITS[name]
        text = (self.work / path).read_text()
        assert old in text
        (self.work / path).write_text(text.replace(old, new))
        return why


def _by_mechanism(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["mechanism"]: c for c in doc["combos"]}


def _kinds(combo: dict[str, Any]) -> list[str]:
    return [n["kind"] for n in combo["notes"]]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first job of the unedited package, with the store it saved: built once per session
    (whichever pytest-xdist worker asks first); each test works on a copy."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    base = base / "workload-change"
    with open(str(base) + ".lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if not (base / "done").exists():
            shutil.rmtree(base, ignore_errors=True)
            for rel, text in PACKAGE.items():
                (base / "work" / rel).parent.mkdir(parents=True, exist_ok=True)
                (base / "work" / rel).write_text(text)
            from tests.conftest import run_fxcache as fixture

            first = Job(fixture.__wrapped__(), base)()  # type: ignore[attr-defined]
            assert first["settings"]["phase"] == "both"
            assert [c["verdict"] for c in first["combos"]] == ["safe", "no-gain"], first["stdout"]
            (base / "done").write_text("")
    return base


@pytest.fixture
def job(baseline: Path, run_fxcache: RunFxcache, tmp_path: Path) -> Job:
    """A copy of the baseline's working directory and store (committed files stay read-only)."""
    for name in ("work", "root"):
        shutil.copytree(baseline / name, tmp_path / name, symlinks=True)
    return Job(run_fxcache, tmp_path)


def _references(verify_dir: str, combo_id: str) -> list[Path]:
    return versions.recorded(Path(verify_dir) / combo_id)


def test_an_unchanged_workload_is_judged_by_its_reference_and_carried(job: Job) -> None:
    doc = job()
    assert doc["settings"]["phase"] == "hot"
    combos = _by_mechanism(doc)
    assert combos["fxgraph"]["verdict"] == "safe", combos["fxgraph"]["reason"]
    assert "workload-changed" not in _kinds(combos["fxgraph"]) + _kinds(combos["aot"])
    assert (combos["aot"]["verdict"], _kinds(combos["aot"])[-1]) == ("no-gain", "carried")
    assert build(doc).changed == []


@pytest.mark.parametrize("edit", list(EDITS))
def test_an_edited_workload_is_verified_again_with_a_new_reference(job: Job, edit: str) -> None:
    why = job.edit(edit)
    doc = job()
    assert doc["settings"]["phase"] == "both"  # the changed combinations compiled cold again
    for combo in doc["combos"]:
        assert combo["verdict"] in ("safe", "no-gain"), (combo["id"], combo["reason"])
        assert "carried" not in _kinds(combo), combo["id"]
        (note,) = [n for n in combo["notes"] if n["kind"] == "workload-changed"]
        assert why in note["why"], note
        assert note["text"] == versions.changed_note_text(note["why"])
        assert combo["cold"]["status"] == "ok" and combo["hot"]["status"] == "ok"
        # a new reference, beside the committed old one, for the edited workload
        found = _references(doc["verify_dir"], combo["id"])
        assert len(found) == 2 and found[0].parent.name == versions.VERSIONS, found
        assert versions.identity(found[0]) != versions.identity(found[1])
    assert "the model changed since the recorded reference" in doc["stdout"]
    report = build(doc)
    assert report.changed == [f"{WORKLOAD} ({why})"]
    for shown in (render.markdown(report), " ".join(render.text(report).split())):
        assert labels.CHANGED_HEADING in shown and "usermodels" in shown

    again = job()  # the next job of the edited workload is hot only, against its new reference
    assert again["settings"]["phase"] == "hot"
    combos = _by_mechanism(again)
    assert combos["fxgraph"]["verdict"] == "safe", combos["fxgraph"]["reason"]
    assert "workload-changed" not in _kinds(combos["fxgraph"]) + _kinds(combos["aot"])
    assert (combos["aot"]["verdict"], _kinds(combos["aot"])) == ("no-gain", ["carried"])
    assert combos["aot"]["cold"]["pid"] == _by_mechanism(doc)["aot"]["cold"]["pid"]


def test_a_graph_that_changed_with_the_same_outputs_is_verified_again(job: Job) -> None:
    """Nothing but the traced graph changes (an environment variable the model reads, its
    eager outputs within the tolerance): the hot phase's miss on a new graph is verified again
    instead of comparing its compile with the old graph's, bit for bit."""
    doc = job(env={"USERMODELS_ALT": "1"})
    fxgraph = _by_mechanism(doc)["fxgraph"]
    assert fxgraph["verdict"] in ("safe", "no-gain"), fxgraph["reason"]
    (note,) = [n for n in fxgraph["notes"] if n["kind"] == "workload-changed"]
    assert note["why"] == versions.GRAPH_WHY


def test_a_cache_tampered_after_the_edit_is_still_unsafe(job: Job) -> None:
    """The edited model's new reference and cache, committed by the save; then a co-tenant
    rewrites its generated code after the next job's restore checked the store (a change
    before that check is the store's to catch: it quarantines the scope)."""
    job.edit("source")
    doc = job()
    fxgraph_id = _by_mechanism(doc)["fxgraph"]["id"]
    assert _by_mechanism(doc)["fxgraph"]["verdict"] == "safe"

    def tamper(verify_dir: Path) -> None:
        newest = _references(str(verify_dir), fxgraph_id)[0]
        assert newest.parent.name == versions.VERSIONS
        for path in newest.rglob("*.py"):
            path.chmod(path.stat().st_mode | stat.S_IWUSR)  # committed read-only: its owner can
        assert tamper_generated_code(newest / "inductor") >= 1

    fxgraph = _by_mechanism(job(after_restore=tamper, rc=1))["fxgraph"]
    assert (fxgraph["verdict"], fxgraph["cause"]) == ("unsafe", "hot-mismatch")
    assert "workload-changed" not in _kinds(fxgraph)  # judged by the edited model's reference


def test_a_cache_tampered_between_the_phases_of_a_changed_workload_is_unsafe(job: Job) -> None:
    """In the run that verifies the edited model again, the hot load differs from this run's
    own fresh cold compile: that is a cache failure, whatever else changed."""
    job.edit("source")
    fxgraph = _by_mechanism(job(env={"USERMODELS_TAMPER": "1"}, rc=1))["fxgraph"]
    assert (fxgraph["verdict"], fxgraph["cause"]) == ("unsafe", "hot-mismatch")
    assert "workload-changed" in _kinds(fxgraph)


def test_a_read_only_run_of_an_edited_workload_leaves_the_store_as_it_was(job: Job) -> None:
    """A pull request's run (read-only) against the references the default branch recorded:
    verified again in its private overlay, the report names the workload, the store's scope
    keeps only the default branch's references."""
    why = job.edit("imported module")

    def references() -> list[str]:
        found = (str(p.relative_to(job.root)) for p in job.root.rglob("reference.json"))
        return sorted(p for p in found if not p.startswith("."))  # the scope, not .overlays/

    before = references()
    doc = job("--read-only")
    assert all(c["verdict"] in ("safe", "no-gain") for c in doc["combos"]), doc["stdout"]
    assert build(doc).changed == [f"{WORKLOAD} ({why})"]
    assert "/.overlays/" in doc["verify_dir"]  # where it recorded the new references
    assert all(len(_references(doc["verify_dir"], c["id"])) == 2 for c in doc["combos"])
    assert references() == before
