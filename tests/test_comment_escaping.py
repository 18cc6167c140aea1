"""Issue 26 §3: nothing from a results document reaches the comment unescaped.

A property test: every free string field of a real document (each string the schema lets hold
any text; enum and pattern fields are the reader's to refuse) gets a hostile string, the
document is rendered through the public entry points (`report.from_document`,
`render.markdown`, as `fxcache report --format md` and `fxcache comment` do) with whichever
template the package ships, and the markdown is turned into HTML by cmarkgfm with GitHub's
options (raw HTML allowed, GFM extensions, as tests/test_report_browser.py does). The same
document with benign strings of the same lengths is rendered beside it: the hostile rendering
may hold no element, attribute, link, image, HTML comment, mention or issue reference that
the benign one does not (the template's own).
"""

from __future__ import annotations

import copy
import json
import re
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ci_fxcache import report as report_pkg
from ci_fxcache.fleet import merge
from ci_fxcache.report import render
from ci_fxcache.results import schema_check
from tests.test_results_reader_types import _paths

DATA = Path(__file__).parent / "data"

FRAGMENTS = [
    "<img src=x onerror=alert(1)>", "</details>", "<details open>", "<h1>APPROVED</h1>",
    "</td></tr></table>", "<a href='https://evil.example'>x</a>", "[Approve](https://evil.example)",
    "![i](http://evil.example/i.png)", "[ref]: https://evil.example", "<https://evil.example>",
    "https://evil.example/x", "www.evil.example", "@acme/security-team", "@octocat", "#123",
    "acme/repo#1", "GH-7", "<!-- fxcache-report:fxcache -->", "<!--", "-->", "|", "\n", "\r\n",
    "\n\n# Heading\n", "\n- item\n", "1. ", "> quote", "```", "~~~", "`", "**", "_", "*", "\\",
    "&lt;img&gt;", "&#60;b&#62;", "<script>alert(1)</script>", "<b>", "javascript:alert(1)",
    "::error::x", "\x1b[31m", "\u202e", "\u200b", ":+1:", "$$x$$", "- [ ] task", "<sub>",
    "<br>", "<table>", "<p>", "<summary>", "&nbsp;", "<picture><source srcset=x>",
]  # fmt: skip
HOSTILE = st.lists(
    st.sampled_from(FRAGMENTS) | st.text(alphabet="<>/!-[]()@#&;:|`*_\\ \nab", min_size=1),
    min_size=1,
    max_size=5,
).map("".join)


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> None:
    for part in path[:-1]:
        doc = doc[part]
    doc[path[-1]] = value


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def _shards(doc: dict[str, Any]) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    if "groups" not in doc:
        return [((), doc)]
    return [
        (("groups", gi, "shards", si), shard)
        for gi, group in enumerate(doc["groups"])
        for si, shard in enumerate(group["shards"])
    ]


def _free_paths(doc: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Every string path whose value the schema lets be any text (tried with a probe)."""
    free = []
    for path in (p for p in _paths(doc) if isinstance(_get(doc, p), str)):
        if path[-1:] == ("schema",):
            continue  # the document's own type
        trial = copy.deepcopy(doc)
        _set(trial, path, "<probe> @x")
        if all(schema_check.problem(shard) is None for _, shard in _shards(trial)):
            free.append(path)
    return free


def _fleet() -> dict[str, Any]:
    names = ["shard_h200.json", "shard_h200_b.json", "shard_a100.json", "shard_t4.json"]
    doc = merge.merge([str(DATA / n) for n in names])
    # Key differences of each shape the report reads (merge writes them only for misses).
    doc["key_diffs"] = [
        *doc.get("key_diffs", []),
        {"a": "sm90", "b": "sm80", "differs": ["gpu_name", {"component": "arch"}]},
        {"pair": ["runner-1", "runner-2"], "keyed": [{"field": "triton"}]},
    ]
    return doc


def _single() -> dict[str, Any]:
    doc = json.loads((DATA / "results_h200.json").read_text())
    for i, combo in enumerate(doc["combos"]):  # notes of each kind the report prints
        combo["notes"] = [
            {"kind": "nondeterministic", "text": f"note {i}"},
            {"kind": "model-recompiles", "text": "recompiles", "guard": f"guard {i}"},
        ]
    return doc


DOCS = {
    "single": _single(),
    "cpu": json.loads((DATA / "verify_real_cpu.json").read_text()),
    "fleet": _fleet(),
}
FREE = {name: _free_paths(doc) for name, doc in DOCS.items()}


class _Elements(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: Counter[str] = Counter()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "wbr" and not attrs:
            # The template's `wbr` filter adds a bare break opportunity after `.`, `:`, `_`
            # and `/` of text it has already escaped: as many as the text has of those, so
            # hostile and benign strings differ here; a bare <wbr> has no content or link.
            return
        self.found[f"<{tag} {sorted(attrs)}>"] += 1

    def handle_comment(self, data: str) -> None:
        self.found["<!-- -->"] += 1


_OUTSIDE_CODE = re.compile(r"<pre[ >].*?</pre>|<code>.*?</code>", re.S)
# What GitHub's own filters link after cmark: mentions, team mentions, issue references.
_LINKERS = re.compile(r"(?<![\w\u200b])@[A-Za-z0-9]|(?<![&\w\u200b])#\d|\bGH-\d", re.I)


def _signature(markdown: str) -> tuple[Counter[str], int]:
    import cmarkgfm
    from cmarkgfm.cmark import Options

    html = cmarkgfm.github_flavored_markdown_to_html(
        markdown, options=Options.CMARK_OPT_UNSAFE | Options.CMARK_OPT_GITHUB_PRE_LANG
    )
    parser = _Elements()
    parser.feed(html)
    return parser.found, len(_LINKERS.findall(_OUTSIDE_CODE.sub("", html)))


def _variants(
    doc: dict[str, Any], paths: list[tuple[Any, ...]], hostile: list[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(hostile, benign) copies of `doc`: each string gets a prefix, hostile or as many plain
    letters; equal strings stay equal and different ones different, so both copies group,
    label, match known issues and order their rows alike."""
    bad, good = copy.deepcopy(doc), copy.deepcopy(doc)
    originals = sorted({_get(doc, p) for p in paths})
    index = {value: i for i, value in enumerate(originals)}
    for path in paths:
        value = _get(doc, path)
        prefix = hostile[index[value] % len(hostile)]
        _set(bad, path, prefix + value)
        _set(good, path, "b" * len(prefix) + value)
    return bad, good


def _render(doc: dict[str, Any], max_chars: int) -> str:
    return render.markdown(report_pkg.from_document(doc, "test"), max_chars=max_chars)


def _check(name: str, hostile: list[str], max_chars: int) -> None:
    bad, good = _variants(DOCS[name], FREE[name], hostile)
    bad_elements, bad_links = _signature(_render(bad, max_chars))
    good_elements, good_links = _signature(_render(good, max_chars))
    extra = bad_elements - good_elements
    assert not extra, (extra, hostile)
    assert bad_links <= good_links, hostile


def test_the_documents_have_free_text_everywhere_the_report_shows_it() -> None:
    """The property below is only as good as the fields it reaches."""
    single = {p[-1] for p in FREE["single"]} | {p[-2] for p in FREE["single"] if len(p) > 1}
    for field in ("workload", "reason", "log_tail", "report_id", "name", "text"):
        assert field in single, field
    assert any(p[:1] == ("groups",) for p in FREE["fleet"])


@pytest.mark.parametrize("name", sorted(DOCS))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile=st.lists(HOSTILE, min_size=1, max_size=8))
def test_hostile_strings_render_no_markup_the_template_did_not_write(
    name: str, hostile: list[str]
) -> None:
    _check(name, hostile, max_chars=10**7)


@pytest.mark.parametrize("max_chars", [render.DEFAULT_MAX_CHARS, 4000, 600])
def test_shortened_renderings_stay_escaped(max_chars: int) -> None:
    """The size limiter's levels and its last resort print the same fields."""
    for name in DOCS:
        _check(name, FRAGMENTS, max_chars)


def test_the_issues_reproduction_is_refused_or_inert() -> None:
    """hits/misses strings are the reader's to refuse; as text in a reason they are inert."""
    doc = copy.deepcopy(DOCS["single"])
    doc["combos"][0]["reason"] = (
        "<img src=x> @acme/security-team [Approve](https://x.example) | "
        "</details><h1>APPROVED BY MAINTAINERS</h1>"
    )
    elements, links = _signature(_render(doc, 10**7))
    base, base_links = _signature(_render(DOCS["single"], 10**7))
    assert not (elements - base) and links <= base_links


# Bidi embeddings, overrides, isolates and marks; zero-width, word joiner, BOM, soft hyphen,
# a tag character, a C1 control, the line and paragraph separators (issue 39).
INVISIBLE = [
    "\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2068", "\u2069",
    "\u200e", "\u200f", "\u061c", "\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u00ad",
    "\U000e0041", "\x85", "\u2028", "\u2029",
]  # fmt: skip


@pytest.mark.parametrize("name", sorted(DOCS))
def test_no_invisible_or_bidi_character_of_a_document_reaches_any_rendering(name: str) -> None:
    """A fork's results cannot reorder or hide what a reader sees: every free-text field
    (log tails included) carries each character, and no rendering (markdown at every size
    level, the text format, JUnit) holds one the renderer did not write itself."""
    hostile = [f"a{c}b" for c in INVISIBLE]
    bad, good = _variants(DOCS[name], FREE[name], hostile)
    for doc, expect_none in ((good, False), (bad, True)):
        report = report_pkg.from_document(doc, "test")
        outputs = [render.markdown(report, max_chars=n) for n in (10**7, 4000, 600)]
        outputs += [render.text(report), render.junit(report)]
        own = {c for c in INVISIBLE for out in outputs if c in out}
        if not expect_none:
            renderer_own = own  # what the templates write themselves (word joiners, ...)
            continue
        assert own <= renderer_own, sorted(f"U+{ord(c):04X}" for c in own - renderer_own)
        for out in outputs:
            assert "\u202e" not in out and "\u2066" not in out


@pytest.mark.parametrize("name", sorted(DOCS))
def test_an_issue_reference_after_an_underscore_is_neutralised(name: str) -> None:
    """`_GH-7` (hypothesis found it): `_` is a word character, so a word-boundary test let the
    reference through, and the `wbr` filter's break after `_` then started a text node with
    `GH-7`, which GitHub links."""
    _check(name, ["_GH-7", "x_gh-12"], max_chars=10**7)
    assert "\u200b" in render.md_text("_GH-7")
