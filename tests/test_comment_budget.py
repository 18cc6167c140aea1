"""A fleet's comment stays under 20,000 characters whatever the model names: the renderer
collapses detail first and never drops an `unsafe` combination (issue 46, item 6)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from ci_fxcache import report as report_pkg
from ci_fxcache.report import labels, pr_comment, render
from ci_fxcache.verify import causes
from tests.conftest import RunFxcache

DATA = Path(__file__).parent / "data"
ARCHS = (("sm75", "7.5", "Tesla T4"), ("sm80", "8.0", "NVIDIA A100-SXM4-80GB"),
         ("sm90", "9.0", "NVIDIA H200"), ("sm100", "10.0", "NVIDIA B200"))  # fmt: skip
LONG = "acme_research.foundation_models.multimodal_vision_language_transformer_variant_{}:build"


def _shard(arch: tuple[str, str, str], workloads: list[str]) -> dict[str, Any]:
    doc = json.loads((DATA / "results_h200.json").read_text())
    name, cap, gpu = arch
    doc["fingerprint"]["gpus"] = [{"index": 0, "name": gpu, "capability": cap, "arch": name}]
    doc["scope_key"] = doc["scope_key"].replace("-sm90-", f"-{name}-")
    doc["runner"] = {**(doc.get("runner") or {}), "name": f"gpu-{name}-01"}
    combos = []
    for w in workloads:
        for c in doc["combos"]:
            c = copy.deepcopy(c)
            c["id"] = c["id"].replace(c["workload"], w.replace(":", "_"), 1)
            c["workload"] = w
            combos.append(c)
    doc["combos"] = combos
    doc["matrix"]["workloads"] = workloads
    doc["summary"] = causes.summary(combos)
    return doc


def test_a_fleet_comment_with_long_model_names_fits_and_keeps_every_unsafe(
    run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    workloads = [LONG.format(i) for i in range(6)]
    paths = []
    for arch in ARCHS:
        path = tmp_path / f"{arch[0]}.json"
        path.write_text(json.dumps(_shard(arch, workloads)))
        paths.append(str(path))
    merged = tmp_path / "merged.json"
    proc = run_fxcache("merge", *paths, "-o", str(merged))
    assert proc.returncode == 0, proc.stderr
    results, report = report_pkg.build(str(merged))
    assert report.fleet
    full = render.markdown(report, None, render.COMMENT_LIMIT - 200)
    assert len(full) > render.FLEET_COMMENT_CHARS  # what the comment was before the budget
    body, _ = pr_comment._render(str(merged), None, render.COMMENT_LIMIT - 200, ("", ""))
    assert len(body) <= render.FLEET_COMMENT_CHARS
    combos = [c for g in results.groups for s in g.shards for c in s.combos]
    unsafe = {c["workload"] for c in combos if c["verdict"] == "unsafe"}
    shown = body.replace("<wbr>", "").replace("\\", "")
    assert unsafe and all(w in shown for w in unsafe)
    assert labels.EMOJI["unsafe"] in body
