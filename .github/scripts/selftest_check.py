"""The self-test workflow's check of the action's outputs (.github/workflows/self-test.yml).

Reads the outputs from the environment (CACHE_KEY, CACHE_HIT, SAFE_COMBOS, UNSAFE_COUNT,
REPORT_JSON, REPORT_MARKDOWN) and the expectations from argv; prints one line per failed
check as a GitHub `::error::` annotation and exits 1 when any failed.

    selftest_check.py --combo ID --expect-hit true|false [--expect-key KEY] [--expect-phase P]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def problems(env: dict[str, str], args: argparse.Namespace) -> list[str]:
    """What is wrong with the outputs in `env`, one sentence each (empty: all is well)."""
    found = []
    key = env.get("CACHE_KEY", "")
    if not key.startswith("fxcache-v1-"):
        found.append(f"cache-key {key!r} is not a scope key")
    if args.expect_key and key != args.expect_key:
        found.append(f"cache-key {key!r} is not the first job's {args.expect_key!r}")
    if env.get("CACHE_HIT") != args.expect_hit:
        found.append(f"cache-hit is {env.get('CACHE_HIT')!r}, expected {args.expect_hit!r}")
    try:
        safe = json.loads(env.get("SAFE_COMBOS") or "null")
    except ValueError:
        safe = None
    if safe != [args.combo]:
        found.append(f"safe-combos is {env.get('SAFE_COMBOS')!r}, expected [{args.combo!r}]")
    if env.get("UNSAFE_COUNT") != "0":
        found.append(f"unsafe-count is {env.get('UNSAFE_COUNT')!r}, expected '0'")
    try:
        doc = json.loads(Path(env.get("REPORT_JSON", "")).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        found.append(f"report-json {env.get('REPORT_JSON')!r} is not readable JSON: {exc}")
    else:
        if doc.get("schema") != "fxcache-results/2":
            found.append(f"report-json has schema {doc.get('schema')!r}")
        phase = (doc.get("settings") or {}).get("phase")
        if args.expect_phase and phase != args.expect_phase:
            found.append(f"verify ran phase {phase!r}, expected {args.expect_phase!r}")
    markdown = Path(env.get("REPORT_MARKDOWN", ""))
    if not markdown.is_file() or "safe" not in markdown.read_text(encoding="utf-8"):
        found.append(f"report-markdown {str(markdown)!r} is missing or names no safe combination")
    return found


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--combo", required=True)
    parser.add_argument("--expect-hit", choices=["true", "false"], required=True)
    parser.add_argument("--expect-key", default="")
    parser.add_argument("--expect-phase", default="")
    found = problems(dict(os.environ), parser.parse_args(argv))
    for line in found:
        print(f"::error::self-test: {line}")
    if not found:
        print("self-test: the action's outputs are as expected")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
