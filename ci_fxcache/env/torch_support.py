"""Which torch versions fxcache serves, and which torch each mechanism and option needs.

The one home of every torch-version rule (each mechanism names the options it needs in its
record: ci_fxcache/mechanisms.py). The orchestrator never imports torch: it gates a
combination on a version string (`skip()`; `fxcache verify` passes the one its worker reports,
the same `torch.__version__` the fingerprint reads from `torch/version.py`), so a combination
whose mechanism needs a newer torch is `skipped` (cause `torch-too-old`) instead of run. The worker
checks the same options by presence when it runs (a vendor build may differ from its release)
and records a note where it can do without one (`OPTIONAL`).

Every `since` below was checked in torch's released wheels (`unzip -p torch-X.Y.0-*.whl FILE`
for 2.4.0, 2.5.0, 2.6.0, 2.7.0, 2.8.0, 2.9.0, 2.10.0, and the installed 2.13.0, 2.14.1, 2.15.0):
the option is absent from the release before `since` and present from `since` on. Where the
oldest wheel checked (2.4.0) already has it, `since` says 2.4: older releases are below
`MINIMUM` anyway. docs/torch-versions.md lists the same table for users.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from ci_fxcache import gha, mechanisms

# The oldest torch fxcache supports: the oldest the verification matrix ran on
# (benchmarks/torch_version_check.py, docs/torch-versions.md), and the first release with
# every option the worker uses except the mega-cache and caching-precompile ones.
MINIMUM = (2, 6)
# The newest torch the test suite runs the verification matrix against (tests/conftest.py).
NEWEST_TESTED = "2.15.0"
# Cause of a combination skipped by these gates (results schema v2).
CAUSE = "torch-too-old"


@dataclass(frozen=True)
class Option:
    """A torch API or setting the worker uses, and the first release that has it."""

    api: str
    since: tuple[int, int]
    source: str
    # Where the option lives: module, attribute, and (optional) a name its source must mention.
    probe: tuple[str, str, str] = ("", "", "")


OPTIONS: dict[str, Option] = {
    "fx_graph_cache": Option(
        "torch._inductor.config.fx_graph_cache",
        (2, 4),
        "torch/_inductor/config.py: present in 2.4.0",
        ("torch._inductor.config", "fx_graph_cache", ""),
    ),
    "autograd_cache": Option(
        "torch._functorch.config.enable_autograd_cache (AOTAutograd cache)",
        (2, 5),
        "torch/_functorch/config.py: absent in 2.4.0, present in 2.5.0",
        ("torch._functorch.config", "enable_autograd_cache", ""),
    ),
    "fx_graph_remote_cache": Option(
        "torch._inductor.config.fx_graph_remote_cache / autotune_remote_cache (Redis)",
        (2, 4),
        "torch/_inductor/config.py, RedisRemoteCache in torch/_inductor/remote_cache.py: "
        "present in 2.4.0",
        ("torch._inductor.config", "fx_graph_remote_cache", ""),
    ),
    "remote_autograd_cache": Option(
        "torch._functorch.config.enable_remote_autograd_cache",
        (2, 6),
        "torch/_functorch/config.py: absent in 2.5.0, present in 2.6.0",
        ("torch._functorch.config", "enable_remote_autograd_cache", ""),
    ),
    "cache_key_tag": Option(
        "torch.compiler.config.cache_key_tag (TORCH_COMPILE_CACHE_KEY_TAG)",
        (2, 6),
        "torch/compiler/config.py (read by torch/_inductor/codecache.py): the module is absent "
        "in 2.5.0, present in 2.6.0",
        ("torch.compiler.config", "cache_key_tag", ""),
    ),
    "set_stance": Option(
        "torch.compiler.set_stance('fail_on_recompile')",
        (2, 6),
        "torch/compiler/__init__.py and torch/_dynamo/eval_frame.py: absent in 2.5.0, present "
        "in 2.6.0; the 2.6 release blog names it as new",
        ("torch.compiler", "set_stance", "fail_on_recompile"),
    ),
    "cache_artifacts": Option(
        "torch.compiler.save_cache_artifacts / load_cache_artifacts (mega-cache)",
        (2, 7),
        "torch/compiler/__init__.py: absent in 2.6.0, present in 2.7.0",
        ("torch.compiler", "save_cache_artifacts", ""),
    ),
    "caching_precompile": Option(
        "torch._dynamo.config.caching_precompile (TORCH_CACHING_PRECOMPILE)",
        (2, 9),
        "torch/_dynamo/config.py: absent in 2.8.0, present in 2.9.0 (pytorch#155913)",
        ("torch._dynamo.config", "caching_precompile", ""),
    ),
    "precompile_artifacts": Option(
        "torch.compiler.save_cache_artifacts() carrying caching-precompile entries",
        (2, 10),
        "torch/compiler/__init__.py: save_cache_artifacts() calls "
        "PrecompileContext.save_to_dynamo_cache() from 2.10.0 on, not in 2.9.0 "
        "(pytorch#162886); without it the blob holds no Dynamo entry to hot-load",
        ("torch.compiler", "save_cache_artifacts", "save_to_dynamo_cache"),
    ),
    "cpp_builder": Option(
        "torch._inductor.cpp_builder.CppBuilder.build (counts C++ kernel builds)",
        (2, 4),
        "torch/_inductor/cpp_builder.py: present in 2.4.0",
        ("torch._inductor.cpp_builder", "CppBuilder", "get_target_file_path"),
    ),
    "aot_compile": Option(
        "torch.compile(...).aot_compile() + save_compiled_function / "
        "torch.compiler.load_compiled_function",
        (2, 9),
        "torch/_dynamo/aot_compile.py and torch/compiler/__init__.py: absent in 2.8.0, present "
        "in 2.9.0 (behind torch._dynamo.config.enable_aot_compile, off in 2.9.0 and 2.10.0, on "
        "in 2.13.0; the worker turns it on)",
        ("torch.compiler", "load_compiled_function", ""),
    ),
    "precompile_api": Option(
        "torch.compiler.precompile.capture / load; torch 2.14's callable "
        "torch.compiler.precompile(fn, *inputs) is not supported",
        (2, 15),
        "torch/compiler/precompile.py: absent in 2.14.1, where torch.compiler.precompile is a "
        "function (torch/_precompile.py), present in 2.15.0",
        ("torch.compiler.precompile", "capture", ""),
    ),
    "mark_dynamic": Option(
        "torch._dynamo.mark_dynamic",
        (2, 4),
        "torch/_dynamo/__init__.py: present in 2.4.0",
        ("torch._dynamo", "mark_dynamic", ""),
    ),
}

# What a dynamic-shape mode cannot run without.
DYNAMIC_NEEDS: dict[str, tuple[str, ...]] = {"mark": ("mark_dynamic",)}
# What the worker does without, recording a note: the hot recompile check falls back to
# Dynamo's graph counter; without the builder hook, kernel builds go uncounted.
OPTIONAL = ("set_stance", "cpp_builder")


def release(version: str) -> tuple[int, ...]:
    """`2.13.0+cu128` -> (2, 13, 0); `2.10.0a0+git1234` -> (2, 10, 0); '' -> ()."""
    parts: list[int] = []
    for piece in version.split("+", 1)[0].split("."):
        digits = re.match(r"\d+", piece)
        if digits is None:
            break
        parts.append(int(digits.group()))
    return tuple(parts)


def _text(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


def supported_range() -> str:
    """The supported range as the README states it."""
    return f">= {_text(MINIMUM)} (newest tested: {NEWEST_TESTED})"


def newer_than_tested(torch_version: str) -> str | None:
    """The one notice for a torch newer than the newest tested (None otherwise): it runs, and
    nothing is refused; the worker checks each option it uses by presence."""
    have = release(torch_version)
    if not have or have[:3] <= release(NEWEST_TESTED)[:3]:
        return None
    return (
        f"torch {torch_version} is newer than the newest fxcache was tested with "
        f"({NEWEST_TESTED}); it runs, and each torch option it uses is checked where it is used"
    )


def announce_newer(torch_version: str) -> None:
    """`newer_than_tested` as one notice line (stderr; a notice annotation inside Actions)."""
    text = newer_than_tested(torch_version)
    if text is not None:
        gha.say("notice", text)


def _needs(mechanism: str) -> tuple[str, ...]:
    """What `mechanism` cannot run without (its record's gate; none for an unknown name)."""
    found = mechanisms.find(mechanism)
    return () if found is None else found.needs


def too_old(torch_version: str, mechanism: str, dynamic: str = "false") -> str | None:
    """Why `mechanism` (with `dynamic`) cannot run on `torch_version`, or None.

    An unreadable version is never gated: the worker's presence checks still hold.
    """
    have = release(torch_version)
    if not have:
        return None
    this = f"this is torch {torch_version}"
    if have[:2] < MINIMUM:
        return f"fxcache supports torch >= {_text(MINIMUM)}; {this}"
    for what, needs in (
        (mechanism, _needs(mechanism)),
        (f"dynamic={dynamic}", DYNAMIC_NEEDS.get(dynamic, ())),
    ):
        short = [OPTIONS[n] for n in needs if have[:2] < OPTIONS[n].since]
        if short:
            newest = max(short, key=lambda o: o.since)
            return f"{what} needs torch >= {_text(newest.since)} ({newest.api}); {this}"
    return None


def skip(torch_version: str, combo: dict[str, Any]) -> dict[str, str] | None:
    """The `cause` and `reason` of a combination the gates skip, or None when it can run."""
    reason = too_old(torch_version, combo["mechanism"], combo.get("dynamic", "false"))
    return None if reason is None else {"cause": CAUSE, "reason": reason}


def probe(python: str, timeout: float = 300.0) -> tuple[str, dict[str, bool]]:
    """The torch version of `python` and which OPTIONS it really has (imports torch there)."""
    from ci_fxcache.env import interpreter

    probes = {name: list(option.probe) for name, option in OPTIONS.items()}
    answer = interpreter.run_snippet(python, "probe_options", timeout, (json.dumps(probes),))
    present = answer.get("options") or {}
    return str(answer.get("torch_version")), {name: bool(present.get(name)) for name in OPTIONS}


def expected(torch_version: str) -> dict[str, bool]:
    """Which OPTIONS a release of `torch_version` has, by the table."""
    have = release(torch_version)[:2]
    return {name: have >= option.since for name, option in OPTIONS.items()}
