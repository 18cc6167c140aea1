"""The verdict registry (ci_fxcache/verdict_kinds.py): one record per verdict, read by the
results reader, the causes, the re-check, the report model and the renderers. Fast, no compile."""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence

from ci_fxcache.report import labels, model
from ci_fxcache.results import reader
from ci_fxcache.verify import causes, recheck, verdict_kinds
from tests.conftest import ROOT

PACKAGE = ROOT / "ci_fxcache"
REGISTRY = PACKAGE / "verify" / "verdict_kinds.py"
SPELLED = {v.emoji for v in verdict_kinds.ALL} | {
    v.word for v in verdict_kinds.ALL if v.word != v.name
}


def _docstrings(tree: ast.AST) -> set[int]:
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }


def _spelled(tree: ast.AST, known: set[str]) -> Iterator[int]:
    """Lines that list two or more verdict names (a tuple, list, set or a dict's keys), or
    spell a verdict's emoji or its matrix word in code."""

    def named(nodes: Sequence[ast.expr | None]) -> int:
        return sum(1 for n in nodes if isinstance(n, ast.Constant) and n.value in known)

    docs = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            found = named(node.elts) >= 2
        elif isinstance(node, ast.Dict):
            found = named(node.keys) >= 2
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found = id(node) not in docs and any(s in node.value for s in SPELLED)
        else:
            continue
        if found:
            yield node.lineno


def test_nobody_else_spells_the_verdicts() -> None:
    """Issue 46: the emoji, colours, words, order and tables of verdicts live in the registry;
    a module compares one name with a document's `verdict`, nothing more."""
    known = set(verdict_kinds.names())
    wrong = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != REGISTRY
        for line in _spelled(ast.parse(path.read_text(encoding="utf-8")), known)
    ]
    assert wrong == []
    templates = [
        p.name
        for p in (PACKAGE / "report" / "templates").glob("*.j2")
        if any(v.emoji in p.read_text(encoding="utf-8") for v in verdict_kinds.ALL)
    ]
    assert templates == []
    planted = (
        'A = ("unsafe", "error")\nB = {"safe": "32", "skipped": "2"}\nC = "❌"\n'
        'if verdict == "safe": pass\nD = f"{n} UNSAFE"\n'
    )
    assert sorted(set(_spelled(ast.parse(planted), known))) == [1, 2, 3, 5]


def test_everyone_reads_the_registry() -> None:
    """The vocabulary as the code before the registry spelled it in six modules."""
    assert causes.VERDICTS == ("safe", "no-gain", "unsafe", "error", "skipped")
    order = [("unsafe", 0), ("error", 1), ("no-gain", 2), ("safe", 3), ("skipped", 4)]
    assert list(reader.VERDICT_ORDER.items()) == order  # counts are listed in this order
    assert model.PROBLEMS == ("unsafe", "error", "no-gain")
    assert causes.FAIL_ON == {
        "never": (),
        "unsafe": ("unsafe",),
        "error": ("unsafe", "error"),
        "no-gain": ("unsafe", "error", "no-gain"),
    }
    assert recheck.CARRIED_VERDICTS == ("no-gain",)
    assert verdict_kinds.loaded() == ("safe", "no-gain")
    assert labels.EMOJI["no-gain"] == "🟡" and labels.EMOJI["skipped"] == "⏭️"
    assert [(e, h, vs) for e, h, vs in model.TOP_LINES] == [
        ("✅", "Cache", ("safe",)),
        ("❌", "Do not cache", ("unsafe",)),
        ("🟡", "Check", ("no-gain", "error")),
    ]
    assert verdict_kinds.legend() == "✅ safe · ❌ unsafe · 🟡 no gain · 💥 error · ⏭️ skipped"
    assert set(causes.VERDICT_OF_CAUSE.values()) == set(verdict_kinds.names())
    # every cause belongs to one verdict only
    all_causes = [c for v in verdict_kinds.ALL for c in v.causes]
    assert len(all_causes) == len(set(all_causes))
    assert sorted(v.order for v in verdict_kinds.ALL) == list(range(len(verdict_kinds.ALL)))


def test_the_results_schema_names_the_registry() -> None:
    text = (PACKAGE / "results" / "results.schema.json").read_text(encoding="utf-8")
    assert all(f'"{name}"' in text for name in verdict_kinds.names())
