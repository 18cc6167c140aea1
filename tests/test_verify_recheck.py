"""A hot-only run re-checks what users rely on and carries the recorded no-gain verdicts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ci_fxcache.commands.verify import line as build_line
from ci_fxcache.report import render
from ci_fxcache.verify import recheck
from tests.conftest import RunFxcache
from tests.test_report import build
from tests.test_verify import load, verify

SETTINGS = {"min_speedup": 2.0, "compare": "bitwise", "fail_on": "unsafe"}
TORCH = "2.13.0+cpu"
HERE = recheck.context("fxcache-v1-linux-x86_64-cp311-torch2.13.0+cpu-cpu-037d3d0595c6")


COMBO = {
    "workload": "sin_matmul",
    "device": "cpu",
    "dtype": "float32",
    "dynamic": "false",
    "mechanism": "mega",
    "training": True,
}


def _judged(verdict: str, cause: str) -> dict[str, Any]:
    return {"verdict": verdict, "cause": cause, "reason": f"{cause} here", "notes": []}


def _recorded(tmp_path: Path, verdict: str = "no-gain", cause: str = "rebuilt") -> Path:
    recheck.record(tmp_path, _judged(verdict, cause), SETTINGS, TORCH, HERE)
    return tmp_path


def test_a_recorded_no_gain_artifact_mechanism_is_carried_with_a_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GITHUB_RUN_ID", "4242")
    found = recheck.carried(_recorded(tmp_path), "mega", SETTINGS, TORCH, HERE)
    assert found is not None
    assert (found["verdict"], found["cause"]) == ("no-gain", "rebuilt")
    (note,) = found["notes"]
    assert note["kind"] == "carried" and note["run_id"] == "4242"
    assert note["judged_at"] in note["text"] and "not re-checked this run" in note["text"]
    # carrying twice keeps one note
    (tmp_path / recheck.VERDICT_FILE).write_text(
        json.dumps({**json.loads((tmp_path / recheck.VERDICT_FILE).read_text()), "judged": found})
    )
    again = recheck.carried(tmp_path, "precompile", SETTINGS, TORCH, HERE)
    assert again is not None and [n["kind"] for n in again["notes"]] == ["carried"]


@pytest.mark.parametrize(
    ("verdict", "cause", "mechanism", "settings", "torch"),
    [
        ("safe", "hit", "mega", SETTINGS, TORCH),  # users rely on it: a regression must show
        ("unsafe", "hot-mismatch", "mega", SETTINGS, TORCH),
        ("error", "compiler-mismatch", "precompile", SETTINGS, TORCH),
        ("no-gain", "miss", "fxgraph", SETTINGS, TORCH),  # its hot phase wrote into the cache
        ("no-gain", "miss", "remote", SETTINGS, TORCH),  # Redis changes between jobs
        ("no-gain", "slow", "mega", {**SETTINGS, "min_speedup": 1.2}, TORCH),
        # recorded under the 2.0 floor every run had before it became opt-in: judged again
        ("no-gain", "slow", "mega", {**SETTINGS, "min_speedup": None}, TORCH),
        ("no-gain", "rebuilt", "mega", {**SETTINGS, "min_speedup": None}, TORCH),
        ("no-gain", "rebuilt", "mega", {**SETTINGS, "compare": "close"}, TORCH),
        ("no-gain", "rebuilt", "mega", SETTINGS, "2.14.1+cu130"),
    ],
)
def test_everything_else_is_rechecked(
    tmp_path: Path,
    verdict: str,
    cause: str,
    mechanism: str,
    settings: dict[str, Any],
    torch: str,
) -> None:
    _recorded(tmp_path, verdict, cause)
    assert recheck.carried(tmp_path, mechanism, settings, torch, HERE) is None


@pytest.mark.parametrize(
    "elsewhere",
    [
        recheck.context("fxcache-v1-linux-x86_64-cp311-torch2.13.0+cpu-cpu-0123456789ab"),
        {**HERE, "fxcache": "0.0.1"},  # judged by another fxcache
        None,  # recorded by an fxcache that recorded no context
    ],
)
def test_a_verdict_judged_in_another_scope_or_by_another_fxcache_is_rechecked(
    tmp_path: Path, elsewhere: dict[str, Any] | None
) -> None:
    _recorded(tmp_path)
    path = tmp_path / recheck.VERDICT_FILE
    recorded = json.loads(path.read_text())
    if elsewhere is None:
        del recorded["context"]
    else:
        recorded["context"] = elsewhere
    path.write_text(json.dumps(recorded))
    assert recheck.carried(tmp_path, "mega", SETTINGS, TORCH, HERE) is None


def test_a_carried_verdict_says_its_age_and_drops_the_notes_of_the_run_that_judged_it(
    tmp_path: Path,
) -> None:
    judged = _judged("no-gain", "rebuilt")
    judged["notes"] = [
        {"kind": "workload-changed", "text": "the model changed", "why": "its source changed"},
        {"kind": "nondeterministic", "text": "kept"},
    ]
    recheck.record(tmp_path, judged, SETTINGS, TORCH, HERE)
    path = tmp_path / recheck.VERDICT_FILE
    recorded = json.loads(path.read_text())
    path.write_text(json.dumps({**recorded, "judged_at": "2026-01-01T00:00:00Z"}))
    found = recheck.carried(tmp_path, "mega", SETTINGS, TORCH, HERE)
    assert found is not None
    assert [n["kind"] for n in found["notes"]] == ["nondeterministic", "carried"]
    assert found["notes"][-1]["age_s"] > 86400  # judged months before this test ran
    shown = build_line({**found, **COMBO})
    assert "judged 2026-01-01T00:00:00Z, " in shown and " days earlier]" in shown, shown


def test_a_verdict_recorded_without_a_floor_is_carried_without_one(tmp_path: Path) -> None:
    unfloored = {**SETTINGS, "min_speedup": None}
    recheck.record(tmp_path, _judged("no-gain", "rebuilt"), unfloored, TORCH, HERE)
    assert recheck.carried(tmp_path, "mega", unfloored, TORCH, HERE) is not None
    assert recheck.carried(tmp_path, "mega", SETTINGS, TORCH, HERE) is None  # a floor set since


@pytest.mark.parametrize(
    "damage",
    [
        lambda p: p.unlink(),
        lambda p: p.write_text("{not json"),
        lambda p: p.write_text(p.read_text()[:40]),
        lambda p: p.write_text(json.dumps({"judged": "no-gain"})),
        lambda p: p.write_text("[]"),
    ],
)
def test_a_missing_or_damaged_record_is_rechecked(tmp_path: Path, damage: Any) -> None:
    damage(_recorded(tmp_path) / recheck.VERDICT_FILE)
    assert recheck.carried(tmp_path, "mega", SETTINGS, TORCH, HERE) is None


@pytest.mark.parametrize(
    ("mechanism", "artifact"),
    [("mega", "mega.bin"), ("aot", "aot.bin"), ("precompile-api", "precompile-api.cache")],
)
def test_a_changed_artifact_or_reference_is_rechecked_not_carried(
    tmp_path: Path, mechanism: str, artifact: str
) -> None:
    """Carrying assumes the hot phase reads the bytes the recorded one read: an artifact
    replaced by hand (outside the store's checks) is judged again."""
    (tmp_path / artifact).write_bytes(b"compiled" * 100)
    (tmp_path / "reference.pt").write_bytes(b"tensors")
    _recorded(tmp_path)
    (tmp_path / "inductor").mkdir()  # the cold phase's own caches: not read by this hot phase
    (tmp_path / "inductor" / "entry").write_bytes(b"x")
    assert recheck.carried(tmp_path, mechanism, SETTINGS, TORCH, HERE) is not None
    for name in (artifact, "reference.pt"):
        original = (tmp_path / name).read_bytes()
        (tmp_path / name).write_bytes(original[:3] + b"X" + original[4:])  # same size
        assert recheck.carried(tmp_path, mechanism, SETTINGS, TORCH, HERE) is None, name
        (tmp_path / name).write_bytes(original)
    assert recheck.carried(tmp_path, mechanism, SETTINGS, TORCH, HERE) is not None


def _pid(doc: dict[str, Any], cid: str) -> int:
    """The process the combination's hot phase ran in (0: it did not run this time)."""
    combo = next(c for c in doc["combos"] if c["id"] == cid)
    return int(combo["hot"].get("pid", 0))


@pytest.mark.slow
def test_hot_only_run_carries_no_gain_rechecks_safe_and_recheck_all_rechecks_everything(
    run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    args = ("--dtypes", "float32", "--dynamic", "false", "--mechanisms", "fxgraph,mega")
    args += ("--training", "true", "--cache-dir", str(cache))

    def run(name: str, env: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
        proc = verify(run_fxcache, *args, "--json", str(tmp_path / f"{name}.json"), env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        doc = load(tmp_path / f"{name}.json")
        return {c["mechanism"]: c for c in doc["combos"]} | {"doc": doc, "stdout": proc.stdout}

    built = run("built", {"GITHUB_RUN_ID": "77"})
    assert built["doc"]["settings"]["phase"] == "both"
    assert built["fxgraph"]["verdict"] == "safe", built["fxgraph"]["reason"]
    # on the CPU a mega-cache load rebuilds the C++ kernels (DESIGN.md)
    assert (built["mega"]["verdict"], built["mega"]["cause"]) == ("no-gain", "rebuilt")
    ids = {m: built[m]["id"] for m in ("fxgraph", "mega")}
    pids = {m: _pid(built["doc"], cid) for m, cid in ids.items()}

    job = run("job")
    assert job["doc"]["settings"]["phase"] == "hot"
    assert 0 < _pid(job["doc"], ids["fxgraph"]) != pids["fxgraph"]  # re-checked
    assert _pid(job["doc"], ids["mega"]) in (0, pids["mega"])  # not run again
    assert "carried" not in [n["kind"] for n in job["fxgraph"]["notes"]]
    mega = job["mega"]
    assert (mega["verdict"], mega["cause"]) == ("no-gain", "rebuilt")
    (note,) = [n for n in mega["notes"] if n["kind"] == "carried"]
    assert note["run_id"] == "77"
    assert "not re-checked this run" in job["stdout"]
    report = render.markdown(build(job["doc"]))
    assert "not re-checked this run" in report

    full = run("full", {"FXCACHE_RECHECK_ALL": "1"})
    assert full["doc"]["settings"]["phase"] == "hot"
    assert 0 < _pid(full["doc"], ids["mega"]) != pids["mega"]
    assert (full["mega"]["verdict"], full["mega"]["cause"]) == ("no-gain", "rebuilt")
    assert all(n["kind"] != "carried" for n in full["mega"]["notes"])
    # a hot-only run does not replace the record of the run that built the cache
    assert (
        recheck.carried(
            cache / ids["mega"], "mega", full["doc"]["settings"], "", recheck.context(None)
        )
        is None
    )
    assert json.loads((cache / ids["mega"] / recheck.VERDICT_FILE).read_text())["run_id"] == "77"


def test_the_report_and_text_say_a_carried_combination_was_not_rechecked() -> None:
    doc = json.loads((Path(__file__).parent / "data" / "verify_real_cpu.json").read_text())
    combo = next(c for c in doc["combos"] if c["verdict"] == "no-gain")
    before = render.markdown(build(doc))
    assert "not re-checked this run" not in before
    combo["notes"] = [
        *combo.get("notes", []),
        {"kind": "carried", "text": "t", "judged_at": "2026-11-30T10:00:00Z", "run_id": None},
    ]
    load_doc = build(doc)
    for shown in (render.markdown(load_doc), render.text(load_doc)):
        assert "not re-checked this run, judged 2026-11-30: " in shown, shown
