"""The results document's JSON Schema: valid documents pass, broken ones fail."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema
import pytest

from ci_fxcache.results import writer

SCHEMA = json.loads(writer.SCHEMA_FILE.read_text())


def validate(doc: dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError unless `doc` is a valid results document (v2, or v1)."""
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    jsonschema.validate(doc, SCHEMA, cls=jsonschema.Draft202012Validator)


def _phase(**extra: Any) -> dict[str, Any]:
    return {
        "status": "ok",
        "compile_s": 8.1,
        "wall_s": 11.2,
        "counters": {"fxgraph_cache_miss": 2},
        "returncode": 0,
        "signal": None,
        "log_tail": "",
        **extra,
    }


def example() -> dict[str, Any]:
    combo = {
        "id": "sin_matmul-cpu-float32-static-fxgraph-train",
        "workload": "sin_matmul",
        "device": "cpu",
        "dtype": "float32",
        "dynamic": "false",
        "mechanism": "fxgraph",
        "training": True,
        "verdict": "safe",
        "cause": "hit",
        "reason": "hot load hit",
        "notes": [],
        "speedup": 9.0,
        "cold": _phase(),
        "hot": _phase(recompiles=0),
        "max_abs_err": {"hot_vs_cold": 0.0, "cold_vs_eager": 1.2e-06},
        "tolerance": {"atol": 1e-05, "rtol": 1.3e-06},
        "hits": 3,
        "misses": 0,
    }
    skipped = {
        **combo,
        "id": "sin_matmul-cuda-float32-static-fxgraph-train",
        "device": "cuda",
        "verdict": "skipped",
        "cause": "no-device",
        "reason": "no CUDA device",
        "speedup": None,
        "cold": None,
        "hot": None,
        "tolerance": None,
        "hits": 0,
        "misses": 0,
        "max_abs_err": {"hot_vs_cold": None, "cold_vs_eager": None},
    }
    return writer.document(
        fingerprint={"torch_version": "2.13.0+cpu"},
        scope_key="fxcache-v1-x",
        cache=None,
        settings={
            "phase": "both",
            "min_speedup": 2.0,
            "compare": "bitwise",
            "fail_on": "unsafe",
            "timeout_s": 600.0,
        },
        matrix={
            "devices": ["cpu", "cuda"],
            "dtypes": ["float32"],
            "dynamic": ["false"],
            "mechanisms": ["fxgraph"],
            "training": [True],
            "workloads": ["sin_matmul"],
        },
        combos=[combo, skipped],
    )


def test_document_builder_output_is_valid() -> None:
    doc = example()
    validate(doc)
    assert doc["summary"] == {"safe": 1, "no-gain": 0, "unsafe": 0, "error": 0, "skipped": 1}


@pytest.mark.parametrize(
    "breakage",
    [
        lambda d: d.update(schema="fxcache-results/3"),
        lambda d: d["combos"][0].pop("cause"),
        lambda d: d["combos"][0].update(cause="miss"),  # a no-gain cause on a safe verdict
        lambda d: d["combos"][0].update(notes=[{"kind": "gossip", "text": "x"}]),
        lambda d: d["combos"][0].update(verdict="fine"),
        lambda d: d["combos"][0].update(dynamic=True),
        lambda d: d["combos"][0].pop("reason"),
        lambda d: d["combos"][0]["hot"].update(status="weird"),
        lambda d: d["combos"][1].update(hot={**d["combos"][0]["hot"]}),
        lambda d: d["summary"].pop("unsafe"),
        lambda d: d["settings"].update(compare="fuzzy"),
    ],
)
def test_schema_rejects_broken_documents(breakage: Any) -> None:
    doc = copy.deepcopy(example())
    breakage(doc)
    with pytest.raises(jsonschema.ValidationError):
        validate(doc)


def test_version_1_documents_still_pass_without_cause() -> None:
    doc = copy.deepcopy(example())
    doc["schema"] = "fxcache-results/1"
    for combo in doc["combos"]:
        del combo["cause"], combo["notes"]
    validate(doc)
