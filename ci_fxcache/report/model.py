"""The report's view model: rows, plain-words top line, recommendations, fleet summary.

Built once from `Results`; the markdown, text, JUnit and comment renderers only format it.
Recommendations are chosen only among combinations that the same run verified as safe, on the
same environment (group), for the same workload, device and training mode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ci_fxcache.report.known_issues import KnownIssue
from ci_fxcache.resultsdoc import VERDICT_ORDER, Group, Results
from ci_fxcache.verify import explain as key_explain

NO_ALTERNATIVE = "was verified safe in this run, so no alternative can be recommended"
EMOJI = {"safe": "✅", "no-gain": "🟡", "unsafe": "❌", "error": "💥", "skipped": "⏭️"}
_DTYPE_SHORT = (("bfloat16", "bf16"), ("float16", "fp16"), ("float32", "fp32"), ("float64", "fp64"))
_DYNAMIC_WORD = {"false": "static", "true": "dynamic", "mark": "mark_dynamic"}


def short_dtype(dtype: str) -> str:
    """`bfloat16` -> `bf16` (also inside compound names such as `float32-autocast-bfloat16`)."""
    for long, short in _DTYPE_SHORT:
        dtype = dtype.replace(long, short)
    return dtype


def dynamic_word(value: Any) -> str:
    """`"false"` -> `static`, `"true"` -> `dynamic`, `"mark"` -> `mark_dynamic`."""
    text = str(value).lower()  # also turns a JSON boolean into "true"/"false"
    return _DYNAMIC_WORD.get(text, text)


def fmt_seconds(value: Any) -> str:
    return "–" if value is None else f"{float(value):.2f}"


def fmt_speedup(value: Any) -> str:
    return "–" if value is None else f"{float(value):.1f}x"


def fmt_err(value: Any) -> str:
    if value is None:
        return "–"
    v = float(value)
    return "0" if v == 0 else f"{v:.1e}"


@dataclass
class Row:
    """One combination as run on one runner."""

    combo: dict[str, Any]
    runner: str
    label: str
    problem: str = ""
    recommendation: str = ""
    issues: list[KnownIssue] = field(default_factory=list)
    disagreement: str = ""
    order: int = 0  # position in the results document (verify's plan order)

    @property
    def verdict(self) -> str:
        return str(self.combo["verdict"])

    @property
    def emoji(self) -> str:
        return EMOJI.get(self.verdict, "")

    def phase(self, name: str) -> dict[str, Any]:
        return dict(self.combo.get(name) or {})

    @property
    def cold_s(self) -> str:
        return fmt_seconds(self.phase("cold").get("compile_s"))

    @property
    def hot_s(self) -> str:
        return fmt_seconds(self.phase("hot").get("compile_s"))

    @property
    def speedup(self) -> str:
        return fmt_speedup(self.combo.get("speedup"))

    @property
    def hits_misses(self) -> str:
        hits, misses = self.combo.get("hits"), self.combo.get("misses")
        if self.verdict == "skipped" or (hits is None and misses is None):
            return "–"
        return f"{hits if hits is not None else '–'}/{misses if misses is not None else '–'}"

    @property
    def err_hot(self) -> str:
        return fmt_err((self.combo.get("max_abs_err") or {}).get("hot_vs_cold"))

    @property
    def err_eager(self) -> str:
        return fmt_err((self.combo.get("max_abs_err") or {}).get("cold_vs_eager"))

    @property
    def training(self) -> str:
        return "train" if self.combo.get("training") else "inference"

    @property
    def dynamic(self) -> str:
        return dynamic_word(self.combo.get("dynamic"))

    @property
    def reason(self) -> str:
        return str(self.combo.get("reason") or "")

    @property
    def log(self) -> str:
        """The log tails of both phases, cold first."""
        parts = []
        for name in ("cold", "hot"):
            tail = self.phase(name).get("log_tail")
            if tail:
                parts.append(f"--- {name} ---\n{str(tail).rstrip()}")
        return "\n".join(parts)


@dataclass
class Section:
    """One environment (fingerprint) with all its rows."""

    title: str
    arch: str
    env: list[tuple[str, str]]
    runners: list[str]
    rows: list[Row]
    skipped: list[Row]
    top_line: str
    counts: dict[str, int]

    @property
    def recommendations(self) -> list[Row]:
        return [r for r in self.rows if r.recommendation]

    @property
    def recommendation_lines(self) -> list[str]:
        """One line per recommendation; combinations without any verified alternative share one."""
        lines: list[str] = []
        stranded: dict[tuple[str, ...], list[Row]] = {}
        for row in self.recommendations:
            if NO_ALTERNATIVE in row.recommendation:
                stranded.setdefault(_base(row.combo), []).append(row)
            else:
                lines.append(row.recommendation)
        for (workload, device, _), rows in stranded.items():
            names = ", ".join(f"{r.label} ({r.verdict})" for r in rows)
            lines.append(
                f"{names}: nothing for {workload} on {device} {NO_ALTERNATIVE}: "
                "disable the cache for this model"
            )
        return lines

    @property
    def issues(self) -> list[KnownIssue]:
        seen: dict[str, KnownIssue] = {}
        for row in self.rows + self.skipped:
            for issue in row.issues:
                seen.setdefault(issue.id, issue)
        return list(seen.values())

    @property
    def chart_rows(self) -> list[Row]:
        return [
            r
            for r in self.rows
            if r.phase("cold").get("compile_s") is not None
            and r.phase("hot").get("compile_s") is not None
        ]


@dataclass
class Report:
    """Everything a renderer needs."""

    report_id: str
    fleet: bool
    sections: list[Section]
    fleet_lines: list[str]
    counts: dict[str, int]
    created_at: str

    @property
    def unsafe_count(self) -> int:
        return self.counts.get("unsafe", 0)

    @property
    def all_rows(self) -> list[Row]:
        return [r for s in self.sections for r in s.rows + s.skipped]


def _gpu_summary(fp: dict[str, Any]) -> tuple[str, str]:
    """(`H200`, `sm90`) for the visible GPUs; ('', '') when none is used."""
    gpus = fp.get("gpus") or []
    if fp.get("device_kind", "cpu") == "cpu" or not gpus:
        return "", ""
    names = sorted({str(g.get("name", "")).removeprefix("NVIDIA ").strip() for g in gpus})
    archs = fp.get("gpu_archs") or sorted({str(g.get("arch", "")) for g in gpus})
    return " + ".join(n for n in names if n), "_".join(archs)


def environment_title(fp: dict[str, Any]) -> tuple[str, str]:
    """('H200, sm90, torch 2.13.0+cu128', 'sm90') or ('CPU x86_64 avx512, torch ...', 'cpu')."""
    if not fp:
        return "unknown environment (no fingerprint)", "unknown"
    torch = f"torch {fp.get('torch_version', '?')}"
    name, arch = _gpu_summary(fp)
    if arch:
        return f"{name}, {arch}, {torch}", arch
    return f"CPU {fp.get('machine', '')} {fp.get('cpu_isa', '')}".strip() + f", {torch}", "cpu"


def _environment_rows(group: Group) -> list[tuple[str, str]]:
    fp = group.fingerprint
    gpus = fp.get("gpus") or []
    gpu_text = (
        ", ".join(
            f"{g.get('name')} (capability {g.get('capability')}, {g.get('arch')})" for g in gpus
        )
        or "none"
    )
    rows = [
        ("torch", str(fp.get("torch_version") or "–")),
        ("torch git version", str(fp.get("torch_git_version") or "–")),
        ("CUDA", str(fp.get("cuda_version") or "–")),
        ("HIP", str(fp.get("hip_version") or "–")),
        ("triton", str(fp.get("triton_version") or "–")),
        (
            "Python",
            f"{fp.get('python_implementation', '')} {fp.get('python_version', '')} "
            f"({fp.get('python_abi', '')})".strip(),
        ),
        ("GPUs", gpu_text),
        ("driver", str(fp.get("driver_version") or "–")),
        ("CPU ISA", str(fp.get("cpu_isa") or "–")),
        ("scope key", f"`{group.scope_key}`" if group.scope_key else "–"),
    ]
    for shard in group.shards:
        prefix = f"cache ({shard.runner_name})" if len(group.shards) > 1 else "cache"
        rows.append((prefix, describe_cache(shard.doc.get("cache"))))
    return rows


def describe_cache(state: Any) -> str:
    """One line about the restore before the run (`fxcache-cache-state/1`, or null)."""
    if not isinstance(state, dict):
        return "not restored by fxcache (no --cache-state)"
    hit = state.get("hit", state.get("cache_hit"))
    parts = []
    if state.get("mode") == "cold-fallback":
        parts.append("store unusable: cold fallback")
    elif hit is not None:
        parts.append("restored (hit)" if hit else "not found (miss): cold start")
    key = state.get("scope_key") or state.get("cache_key")
    if key:
        parts.append(f"key `{key}`")
    if state.get("read_only"):
        why = state.get("read_only_reason")
        parts.append(f"read-only ({why})" if why else "read-only")
    removed = state.get("invalidated")
    if isinstance(removed, list):
        if removed:
            whys = sorted(
                {
                    str(r.get("versions") or r.get("reason") or "")
                    for r in removed
                    if isinstance(r, dict)
                }
                - {""}
            )
            more = f" ({'; '.join(whys)})" if whys else ""
            parts.append(f"invalidation removed {len(removed)} stale scope(s){more}")
        else:
            parts.append("nothing stale")
    quarantined = state.get("quarantined")
    if isinstance(quarantined, list) and quarantined:
        parts.append(f"{len(quarantined)} broken scope(s) quarantined")
    return "; ".join(parts) or "restored"


def combo_labels(combos: list[dict[str, Any]]) -> dict[str, str]:
    """Short distinguishing labels: 'bf16 dynamic', with the mechanism / workload when needed."""
    if not combos:
        return {}

    def distinct(name: str) -> bool:
        return len({str(c.get(name)) for c in combos}) > 1

    labels = {}
    for c in combos:
        bits = []
        if distinct("workload"):
            bits.append(str(c["workload"]))
        if distinct("device"):
            bits.append(str(c["device"]))
        bits.append(f"{short_dtype(str(c['dtype']))} {dynamic_word(c['dynamic'])}")
        if distinct("training"):
            bits.append("train" if c.get("training") else "inference")
        label = " ".join(bits)
        if distinct("mechanism"):
            label += f" ({c['mechanism']})"
        labels[str(c["id"])] = label
    return labels


def _base(c: dict[str, Any]) -> tuple[str, ...]:
    return (str(c["workload"]), str(c["device"]), str(c.get("training")))


def problem_text(combo: dict[str, Any]) -> str:
    """What went wrong, in a few words, for the top line (by the combo's `cause`)."""
    reason = str(combo.get("reason") or "")
    cause = combo.get("cause")
    hot = combo.get("hot") or {}
    if combo["verdict"] == "skipped":
        return reason or "skipped"
    if cause == "rebuilt":
        built = (hot.get("kernels_built") or 0) + (hot.get("triton_kernels_built") or 0)
        return f"counted as a hit, but {built} kernel file(s) were rebuilt"
    if cause == "miss":
        differs = key_explain.summary(combo.get("explain") or {})
        return "the cache missed on hot load" + (f" ({differs})" if differs else "")
    if cause == "slow":
        speed = combo.get("speedup")
        return f"no real speedup ({fmt_speedup(speed)})" if speed is not None else reason
    if cause == "crash":
        sig = hot.get("signal")
        return f"crashed on hot load{f' ({sig})' if sig else ''}"
    texts = {
        "cold-error": "the cold compile itself failed (not a cache problem)",
        "not-run": "the hot phase did not run",
        "compiler-mismatch": "the cold compile already differs from eager (a compiler problem)",
        "miss": "the cache missed on hot load",
        "timeout": "hung on hot load (timeout)",
        "hot-mismatch": "wrong values on hot load",
        "recompile": "recompiled on hot load",
        "hot-error": "failed on hot load",
    }
    return texts.get(str(cause)) or reason or str(combo["verdict"])


def _prefer(bad: dict[str, Any], good: dict[str, Any]) -> int:
    """Rank a safe alternative for a non-safe combination (lower is the smaller change)."""
    same_dtype = good["dtype"] == bad["dtype"]
    same_dyn = str(good["dynamic"]) == str(bad["dynamic"])
    same_mech = good["mechanism"] == bad["mechanism"]
    if same_dtype and same_mech:
        return 0  # only the dynamic mode changes
    if same_dtype and same_dyn:
        return 1  # only the cache mechanism changes
    if "autocast" in str(good["dtype"]) and same_dyn:
        return 2  # keeps the shapes dynamic and bf16 speed, through autocast over an fp32 model
    if same_dtype:
        return 3
    if same_dyn and same_mech:
        return 4
    return 5


def _alternative_text(good: dict[str, Any], label: str) -> str:
    speed = fmt_speedup(good.get("speedup"))
    dtype = str(good["dtype"])
    if "autocast" in dtype:
        # verify's `bfloat16-autocast`: an fp32 model run under torch.autocast(bfloat16).
        return f"compile in fp32 and run under autocast ({label}: safe, {speed})"
    return f"{label} is safe here ({speed})"


def recommend(
    bad: dict[str, Any], safe: list[dict[str, Any]], labels: dict[str, str], limit: int = 3
) -> str:
    """A recommendation built only from `safe`: combinations this run verified as safe."""
    label = labels[str(bad["id"])]
    head = {
        "unsafe": f"{label} is unsafe",
        "no-gain": f"{label} gains nothing from the cache",
        "error": f"{label} did not compile at all (fix that first, the cache is not the cause)",
    }[bad["verdict"]]
    if bad.get("cause") == "compiler-mismatch":
        head = f"{label}: the compiler, not the cache, disagrees with eager (report it upstream)"
    candidates = sorted(
        (g for g in safe if _base(g) == _base(bad)),
        key=lambda g: (_prefer(bad, g), -float(g.get("speedup") or 0), str(g["id"])),
    )[:limit]
    if not candidates:
        scope = f"{bad['workload']} on {bad['device']}"
        return f"{head}; nothing for {scope} {NO_ALTERNATIVE}: disable the cache for this model"
    alts = [_alternative_text(g, labels[str(g["id"])]) for g in candidates]
    return "; or ".join([f"{head}; {alts[0]}", *alts[1:], "disable the cache for this model"])


def _merge_same_combo(group: Group) -> dict[str, tuple[dict[str, Any], str]]:
    """Per combination id the worst verdict across the group's runners, plus a disagreement."""
    by_id: dict[str, list[tuple[dict[str, Any], str]]] = {}
    for shard in group.shards:
        for c in shard.combos:
            by_id.setdefault(str(c["id"]), []).append((c, shard.runner_name))
    out = {}
    for cid, seen in by_id.items():
        worst = min(seen, key=lambda cr: VERDICT_ORDER[cr[0]["verdict"]])
        verdicts = {c["verdict"] for c, _ in seen}
        note = ""
        if len(verdicts) > 1:
            note = "runners disagree: " + ", ".join(f"{c['verdict']} on {r}" for c, r in seen)
        out[cid] = (worst[0], note)
    return out


def _join(items: list[str]) -> str:
    return ", ".join(items)


def _join_labels(labels: list[str]) -> str:
    """'a (m), b (m)' -> 'a and b, all with m'; anything else joined by commas."""
    mechs = {x.rsplit(" (", 1)[1][:-1] for x in labels if x.endswith(")") and " (" in x}
    if len(labels) > 1 and len(mechs) == 1 and all(x.endswith(")") for x in labels):
        bare = [x.rsplit(" (", 1)[0] for x in labels]
        every = "both" if len(bare) == 2 else "all"
        return f"{', '.join(bare[:-1])} and {bare[-1]}, {every} with {mechs.pop()}"
    return _join(labels)


def top_line(title: str, rows: list[Row], fleet: bool) -> str:
    """'Safe to cache on this runner (H200, sm90, torch ...): fp32 static, ... Not safe: ...'."""
    where = f"on {title}" if fleet else f"on this runner ({title})"
    by_verdict: dict[str, list[Row]] = {}
    for row in rows:
        by_verdict.setdefault(row.verdict, []).append(row)
    # Collapse mechanisms when every mechanism of a dtype/dynamic pair agrees.
    pair_verdicts: dict[tuple[str, ...], set[str]] = {}
    for row in rows:
        c = row.combo
        pair = (*_base(c), str(c["dtype"]), str(c["dynamic"]))
        pair_verdicts.setdefault(pair, set()).add(row.verdict)

    def names(verdict: str) -> list[str]:
        out: list[str] = []
        for row in sorted(by_verdict.get(verdict, []), key=lambda r: r.order):
            c = row.combo
            pair = (*_base(c), str(c["dtype"]), str(c["dynamic"]))
            label = row.label
            if len(pair_verdicts[pair]) == 1 and label.endswith(")"):
                label = label.rsplit(" (", 1)[0]
            if label not in out:
                out.append(label)
        return out

    def detailed(verdict: str) -> str:
        """'a, b (precompile) — problem; c — other problem': one entry per distinct problem."""
        by_problem: dict[str, list[str]] = {}
        for row in sorted(by_verdict.get(verdict, []), key=lambda r: r.order):
            labels_ = by_problem.setdefault(row.problem, [])
            if row.label not in labels_:
                labels_.append(row.label)
        parts = []
        for problem, labels_ in by_problem.items():
            parts.append(f"{_join_labels(labels_)} — {problem}")
        return "; ".join(parts)

    safe = names("safe")
    text = (
        f"Safe to cache {where}: {_join_labels(safe)}."
        if safe
        else f"Nothing is safe to cache {where}: no combination passed verification."
    )
    if by_verdict.get("unsafe"):
        text += f" Not safe: {detailed('unsafe')}."
    if by_verdict.get("no-gain"):
        text += f" No gain: {detailed('no-gain')}."
    if by_verdict.get("error"):
        text += f" Compile errors: {_join(names('error'))}."
    skipped = by_verdict.get("skipped", [])
    if skipped:
        reasons = sorted({r.reason or "no reason given" for r in skipped})
        text += f" Skipped: {len(skipped)} ({'; '.join(reasons)})."
    return text


def build_section(
    group: Group, issues: list[KnownIssue], fleet: bool, labels: dict[str, str] | None = None
) -> Section:
    """Rows, top line and recommendations for one environment."""
    title, arch = environment_title(group.fingerprint)
    torch_version = str(group.fingerprint.get("torch_version") or "")
    merged = _merge_same_combo(group)
    combos = [c for c, _ in merged.values()]
    if labels is None:
        # Skipped combinations (e.g. cuda on a CPU runner) need not lengthen every other label.
        labels = combo_labels(combos)
        labels.update(combo_labels([c for c in combos if c["verdict"] != "skipped"]))
    safe = [c for c in combos if c["verdict"] == "safe"]
    several = len(group.shards) > 1
    rows: list[Row] = []
    for shard in group.shards:
        for position, c in enumerate(shard.combos):
            worst, note = merged[str(c["id"])]
            row = Row(c, shard.runner_name, labels[str(c["id"])], disagreement=note, order=position)
            row.problem = problem_text(c)
            row.issues = [
                i
                for i in issues
                if i.applies(c, torch_version) and (c["verdict"] != "skipped" or i.verdicts)
            ]
            if c["verdict"] in ("unsafe", "no-gain", "error") and (not several or c is worst):
                row.recommendation = recommend(c, safe, labels)
            rows.append(row)
    rows.sort(key=lambda r: (VERDICT_ORDER[r.verdict], r.label, r.runner))
    # The top line speaks for the environment: one entry per combination, worst verdict.
    summary_rows = [r for r in rows if r.combo is merged[str(r.combo["id"])][0]]
    counts = {v: 0 for v in VERDICT_ORDER}
    for r in summary_rows:
        counts[r.verdict] += 1
    return Section(
        title=title,
        arch=arch,
        env=_environment_rows(group),
        runners=[s.runner_name for s in group.shards],
        rows=[r for r in rows if r.verdict != "skipped"],
        skipped=[r for r in rows if r.verdict == "skipped"],
        top_line=top_line(title, summary_rows, fleet),
        counts=counts,
    )


def fleet_lines(sections: list[Section]) -> list[str]:
    """Per combination across environments: 'bf16 dynamic: safe on sm90, unsafe on sm80, ...'."""
    names = [s.arch for s in sections]
    if len(set(names)) < len(names):
        names = [s.title for s in sections]
    per_label: dict[str, list[str]] = {}
    skip_reasons: dict[str, set[str]] = {}
    for name, section in zip(names, sections, strict=True):
        seen: set[str] = set()
        for row in section.rows + section.skipped:
            if row.label in seen:  # rows come worst first
                continue
            seen.add(row.label)
            per_label.setdefault(row.label, []).append(f"{row.verdict} on {name}")
            if row.verdict == "skipped" and row.reason:
                skip_reasons.setdefault(row.label, set()).add(row.reason)
    lines = []
    for label, parts in per_label.items():
        line = f"{label}: {', '.join(parts)}"
        if label in skip_reasons:
            line += f" — {'; '.join(sorted(skip_reasons[label]))}"
        lines.append(line)
    return lines


def build(results: Results, issues: list[KnownIssue]) -> Report:
    """The report for a document of either schema."""
    labels = None
    if results.is_fleet:  # one vocabulary across environments, so lines can be compared
        labels = combo_labels([c for g in results.groups for s in g.shards for c in s.combos])
    sections = [build_section(g, issues, results.is_fleet, labels) for g in results.groups]
    counts = {v: sum(s.counts[v] for s in sections) for v in VERDICT_ORDER}
    return Report(
        report_id=results.report_id,
        fleet=results.is_fleet,
        sections=sections,
        fleet_lines=fleet_lines(sections) if results.is_fleet else [],
        counts=counts,
        created_at=str(results.doc.get("created_at") or ""),
    )
