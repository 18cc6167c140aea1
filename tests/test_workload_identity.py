"""A workload's identity (worker/identity.py), a reference's versions (verify/versions.py)."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from ci_fxcache.verify import versions
from ci_fxcache.worker import identify, identity, phase
from ci_fxcache.worker.tolerances import tolerance

F32 = tolerance("float32")
COMBO = {
    "workload": "idmodels.net:factory",
    "device": "cpu",
    "dtype": "float32",
    "dynamic": "false",
    "mechanism": "fxgraph",
    "training": True,
}


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user package `idmodels` importable from `tmp_path` (forgotten again afterwards)."""
    (tmp_path / "idmodels").mkdir()
    (tmp_path / "idmodels" / "__init__.py").write_text("")
    (tmp_path / "idmodels" / "ops.py").write_text("import torch\nact = torch.tanh\n")
    (tmp_path / "idmodels" / "net.py").write_text(
        "import torch\nfrom idmodels.ops import act\n\n\n"
        "class Net(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.lin = torch.nn.Linear(8, 4)\n\n"
        "    def forward(self, x):\n"
        "        return act(self.lin(x))\n\n\n"
        "def factory(dtype, device):\n"
        "    return {'model': Net().to(dtype), 'inputs': (torch.randn(3, 8, dtype=dtype),),\n"
        "            'dynamic_inputs': (torch.randn(5, 8, dtype=dtype),)}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    _forget()
    yield tmp_path
    _forget()


def _forget() -> None:
    """Unimport the package, as a fresh process would not have it."""
    for name in [n for n in sys.modules if n == "idmodels" or n.startswith("idmodels.")]:
        del sys.modules[name]


def _identity(modules: identity.Modules | None = None, **combo: Any) -> tuple[Any, Any, Any]:
    modules = modules or identity.Modules()
    run, _ = phase.build({"combo": {**COMBO, **combo}, "phase": "identity"}, modules)
    eager = phase.eager_step(run)
    return phase.workload_identity(run, modules, eager), eager, run


def test_the_identity_is_stable_and_each_part_names_its_own_change(
    package: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, eager, _ = _identity()
    _forget()
    again, eager_again, _ = _identity()
    assert again == first and identity.eager_change(eager, [eager_again], F32) is None
    assert identity.exact_change(first, again) is None
    # the source of a module the workload imports
    (package / "idmodels" / "ops.py").write_text("import torch\nact = torch.tanh  # edited\n")
    _forget()
    edited, _, _ = _identity()
    assert identity.exact_change(first, edited) == "its source changed"
    # a library's version (an upgrade in the environment)
    real = importlib.metadata.version
    with monkeypatch.context() as patched:
        patched.setattr(
            importlib.metadata, "version", lambda d: "99.0" if d == "torch" else real(d)
        )
        upgraded = identity.library_versions("m:f", [("m", sys.modules["idmodels.net"], "")])
    now = identity.library_versions("m:f", [("m", sys.modules["idmodels.net"], "")])
    assert identity.libraries_digest(upgraded) != identity.libraries_digest(now)
    assert f"torch {real('torch')} -> 99.0" in identity.exact_change(
        first, {**first, "libraries": identity.libraries_digest(upgraded),
                "library_versions": "\n".join(upgraded)}
    )  # fmt: skip
    # a workload whose package is installed: its own version counts
    with monkeypatch.context() as patched:
        patched.setattr(
            importlib.metadata, "version", lambda d: "99.0" if d == "torch" else real(d)
        )
        installed = identity.library_versions("torch.nn:Linear", [])
    assert installed != identity.library_versions("torch.nn:Linear", [])
    # the inputs of a dynamic combination include the second input shape
    _forget()
    dynamic, _, _ = _identity(dynamic="true")
    assert identity.exact_change(edited, dynamic) == "its inputs changed"
    # an identity recorded by an older fxcache (none) never matches
    assert "older fxcache" in str(identity.exact_change(None, first))
    assert "older fxcache" in str(identity.exact_change({"source": "x"}, first))


def test_weights_and_inputs_are_told_apart(package: Path) -> None:
    first, _, run = _identity()
    state = {k: v.clone() for k, v in run.reference["state"].items()}
    state["lin.weight"][0, 0] += 1
    inputs = (run.work.inputs[0] + 1,)
    assert identity.tensors_digest(sorted(state.items())) != first["state"]
    modules = identity.Modules()
    moved = identity.of(COMBO["workload"], modules, state, run.work.inputs, None, [])
    assert identity.exact_change(first, {**first, "state": moved["state"]}) == (
        "its initial weights changed"
    )
    moved = identity.of(COMBO["workload"], modules, run.reference["state"], inputs, None, [])
    assert identity.exact_change(first, {**first, "inputs": moved["inputs"]}) == (
        "its inputs changed"
    )


def test_eager_outputs_match_within_the_tolerance_and_not_beyond(package: Path) -> None:
    _, eager, _ = _identity()
    noisy = [t + 1e-7 * t.abs().max() for t in eager]  # the last bits of a reduction
    assert identity.eager_change(eager, [noisy], F32) is None
    moved = [t + 0.1 for t in eager]
    assert "eager outputs changed (max abs err 0.1" in str(
        identity.eager_change(eager, [moved], F32)
    )
    # a second eager step of this process is tried as well (a first call can be off)
    assert identity.eager_change(eager, [moved, eager], F32) is None
    assert "holds none" in str(identity.eager_change(None, [eager], F32))


def test_the_identity_request_picks_the_newest_matching_version(
    package: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two recorded versions (an edited model, then the original): the request names the one
    the workload matches, and why it matches none when it matches none."""
    monkeypatch.chdir(tmp_path)
    current, eager, _ = _identity()
    matching = tmp_path / "v-match"
    matching.mkdir()
    torch.save({"outputs": [], "identity_eager": eager}, matching / "reference.pt")
    stale = {**current, "source": "0" * 64}
    _forget()
    spec = {
        **{k: COMBO[k] for k in ("workload", "device", "dtype", "training")},
        "variants": [
            {
                "key": "a",
                "dynamic": "false",
                "mechanism": "fxgraph",
                "candidates": [
                    {"dir": str(tmp_path / "v-stale"), "identity": stale},
                    {"dir": str(matching), "identity": {**current, "eager": "1" * 64}},
                ],
            },
            {
                "key": "b",
                "dynamic": "false",
                "mechanism": "fxgraph",
                "candidates": [{"dir": str(tmp_path / "v-stale"), "identity": stale}],
            },
        ],
    }
    answer = identify.run(spec)
    assert answer["variants"]["a"]["match"] == 1  # the eager digest differs: compared closely
    assert answer["variants"]["b"] == {
        "match": None,
        "why": "its source changed",
        "identity": current,
    }
    # a workload that no longer builds: the answer says why (the cold phase will fail too)
    (tmp_path / "idmodels" / "net.py").write_text("raise RuntimeError('broken edit')\n")
    _forget()
    broken = identify.run(spec)["variants"]["b"]
    assert broken["match"] is None and "broken edit" in broken["why"]


def _reference(directory: Path, created: str, gm: list[str] | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / versions.REFERENCE_TENSORS).write_bytes(b"t")
    lookups = [
        {"cache": "fxgraph", "state": "miss", "components": {"gm": [g, None]}} for g in gm or []
    ]
    (directory / versions.REFERENCE).write_text(
        json.dumps(
            {
                "created_at": created,
                "cold_result": {"identity": {"source": created}, "keyinfo": {"lookups": lookups}},
            }
        )
    )
    return directory


def test_recorded_versions_newest_first_and_bounded(tmp_path: Path) -> None:
    base = _reference(tmp_path / "combo", "2026-01-01T00:00:00Z")
    for day in range(2, 12):
        _reference(base / versions.VERSIONS / f"v{day}", f"2026-01-{day:02d}T00:00:00Z")
    (base / versions.VERSIONS / "half").mkdir()  # a version whose cold phase never finished
    found = versions.recorded(base)
    assert len(found) == versions.MAX_COMPARED
    assert [p.name for p in found[:2]] == ["v11", "v10"]
    assert versions.identity(found[0]) == {"source": "2026-01-11T00:00:00Z"}
    assert versions.identity(base / versions.VERSIONS / "half") is None
    assert versions.recorded(tmp_path / "none") == []


def test_a_new_version_goes_beside_committed_files_only(tmp_path: Path) -> None:
    base = _reference(tmp_path / "combo", "2026-01-01T00:00:00Z")
    assert versions.fresh(base) == base  # nothing committed: replaced in place
    (base / "reference.json").chmod(0o444)  # as `fxcache save` commits it
    fresh = versions.fresh(base)
    assert fresh.parent == base / versions.VERSIONS and not fresh.exists()
    assert versions.fresh(base) != fresh  # each a directory of its own


def test_graph_changed_only_for_a_miss_on_a_graph_the_cold_phase_never_traced() -> None:
    def result(*lookups: tuple[str, str, str | None]) -> dict[str, Any]:
        return {
            "keyinfo": {
                "lookups": [
                    {"cache": c, "state": s, "components": {"gm": [g, None]} if g else {}}
                    for c, s, g in lookups
                ]
            }
        }

    cold = result(("fxgraph", "miss", "aaa"), ("aotautograd", "miss", "bbb"))
    assert not versions.graph_changed(cold, result(("fxgraph", "hit", "zzz")))
    assert not versions.graph_changed(cold, result(("fxgraph", "miss", "aaa")))  # a key change
    assert versions.graph_changed(cold, result(("fxgraph", "miss", "ccc")))
    assert versions.graph_changed(cold, result(("aotautograd", "miss", "ccc")))
    assert not versions.graph_changed(cold, result(("fxgraph", "miss", None)))
    assert not versions.graph_changed(result(), result(("fxgraph", "miss", "ccc")))  # no record
    assert not versions.graph_changed(cold, {})  # a loaded artifact traces nothing


def test_the_report_comment_and_text_name_the_changed_workloads(tmp_path: Path) -> None:
    """The job summary, the pull-request comment (also when only its summary fits) and the
    text format say which workloads changed, once each, with what changed, escaped."""
    from ci_fxcache.report import labels, pr_comment, render
    from tests.test_report import build

    doc = json.loads((Path(__file__).parent / "data" / "verify_real_cpu.json").read_text())
    assert build(doc).changed == []
    why = "its source changed <b>|</b>"
    for combo in doc["combos"][:3]:
        note = {"kind": "workload-changed", "text": versions.changed_note_text(why), "why": why}
        combo["notes"] = [*combo.get("notes", []), note]
    report = build(doc)
    workload = doc["combos"][0]["workload"]
    assert report.changed == [f"{workload} ({why})"]  # one entry for the three combinations
    path = tmp_path / "results.json"
    path.write_text(json.dumps(doc))
    comment, _ = pr_comment._render(str(path), None, 65536, ("https://github.com", "o/r"))
    short = render.markdown(report, max_chars=600)
    for shown in (render.markdown(report), comment, short):
        assert labels.CHANGED_HEADING in shown and "<b>" not in shown, shown
    text = " ".join(render.text(report).split())  # wrapped at 100 columns
    assert f"{labels.CHANGED_HEADING}: {workload} ({why})" in text


def test_a_builtin_workload_changes_identity_with_fxcache_s_own_workloads_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A newer fxcache that changes a built-in workload (worker/workloads.py) re-verifies it:
    that file is the built-in workload's source."""
    from ci_fxcache.worker import workloads

    own = identity.own_modules("sin_matmul", [])
    assert [name for name, _, _ in own] == [workloads.__name__]
    copy = tmp_path / "workloads.py"
    copy.write_bytes(Path(workloads.__file__).read_bytes())
    monkeypatch.setattr(workloads, "__file__", str(copy))
    before = identity.source_digest(identity.own_modules("sin_matmul", []))
    copy.write_text(copy.read_text().replace("x.sin() @ y", "x.cos() @ y"))
    assert identity.source_digest(identity.own_modules("sin_matmul", [])) != before
    assert identity.own_modules("idmodels.net:factory", []) == []  # a user's: its own modules


def test_a_recompile_for_the_second_shape_is_not_a_changed_graph() -> None:
    """Only the first call's lookups tell whether the traced graph changed: a graph compiled
    later (a recompile only the hot phase needs) stays the cache's failure to judge."""
    first = {"cache": "fxgraph", "state": "hit", "components": {"gm": ["aaa", None]}}
    cold = {"keyinfo": {"lookups": [{**first, "state": "miss"}]}}
    later = {"cache": "fxgraph", "state": "miss", "components": {"gm": ["bbb", None]}}
    hot = {"keyinfo": {"lookups": [first, later]}, "first_call_lookups": 1}
    assert not versions.graph_changed(cold, hot)
    assert versions.graph_changed(cold, {**hot, "first_call_lookups": 2})
    assert versions.graph_changed(cold, {"keyinfo": hot["keyinfo"]})  # an older worker: all


class _CrashingIdentity:
    """A fork server whose identity request dies (SIGABRT): nothing else is asked of it."""

    def __init__(self) -> None:
        self.info: dict[str, Any] = {"torch": "2.13.0", "cuda_capabilities": []}

    def run(self, kind: str, *args: Any, **kwargs: Any) -> Any:
        from ci_fxcache.verify.forkserver import Outcome

        assert kind == "identity"
        return Outcome(None, None, "SIGABRT", False, "Fatal Python error: Aborted")


def test_an_identity_check_that_dies_is_unknown_not_a_changed_model(tmp_path: Path) -> None:
    from ci_fxcache.verify import matrix, runner

    plan = matrix.build({**dict.fromkeys(matrix.FLAGS), "mechanisms": "fxgraph"}, None)
    plan.devices = ["cpu"]
    combo = plan.combos()[0]
    _reference(tmp_path / "cache" / combo.id, "2026-01-01T00:00:00Z")
    settings = runner.Settings(cache_dir=tmp_path / "cache", run_dir=tmp_path / "run")
    checker = runner.Runner(_CrashingIdentity(), settings, lambda _: None)  # type: ignore[arg-type]
    assert checker.match_versions([combo], 1) == set()
    assert combo.id in checker.unchecked
    why = checker.changed[combo.id]
    assert why == "the identity check ended with SIGABRT: Fatal Python error: Aborted"
    text = versions.changed_note_text(why, unchecked=True)
    assert text.startswith("the model could not be compared with the recorded reference (")


def test_changed_libraries_are_named_with_both_versions() -> None:
    before = "einops==0.7.0\nnumpy==2.1.0\ntorch==2.13.0"
    after = "einops==0.8.0\nnumpy==2.1.0\ntorch==2.13.0\ntimm==1.0.0"
    assert identity.version_changes(before, after) == "einops 0.7.0 -> 0.8.0, timm (none) -> 1.0.0"
    assert identity.version_changes(None, after) == ""  # recorded before versions were kept
    many = "\n".join(f"lib{i}==1" for i in range(7))
    assert identity.version_changes(many, "").endswith("lib3 1 -> (none), and 3 more")


def test_a_factory_that_is_not_deterministic_is_compared_by_what_can_be() -> None:
    recorded = {"source": "s", "libraries": "l", "state": "a", "inputs": "b", "shapes": "x",
                "eager": "e", "factory": identity.NOT_DETERMINISTIC}  # fmt: skip
    now = {**recorded, "state": "c", "inputs": "d", "eager": "f"}
    del now["factory"]
    assert identity.exact_change(recorded, now) is None  # other bits, the same shapes
    assert identity.exact_change({**recorded, "factory": None}, now) == (
        "its initial weights changed, its inputs changed"
    )
    assert "shapes of its weights or inputs changed" in str(
        identity.exact_change(recorded, {**now, "shapes": "y"})
    )
    assert identity.exact_change(recorded, {**now, "source": "t"}) == "its source changed"
