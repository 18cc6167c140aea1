"""`fxcache key`: the scope key for this environment, or the parts of a given key."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ci_fxcache.commands import options
from ci_fxcache.env import fingerprint, scopekey
from ci_fxcache.errors import UsageError
from ci_fxcache.fleet import keydiff


def register(sub: Any, parent: argparse.ArgumentParser) -> None:
    """Add the `key` subcommand."""
    parser = sub.add_parser(
        "key",
        parents=[parent],
        help="print the cache scope key for this environment",
        description="Print the scope key: a readable prefix plus a hash of the canonical "
        "fingerprint. The same environment always gives the same key.",
    )
    options.python_option(parser)
    options.salt_option(parser)
    parser.add_argument(
        "--suffix", default="", help="free-form suffix appended to the key (default: none)"
    )
    parser.add_argument(
        "--json", dest="as_json", action="store_true", help="print the key, its parts and fields"
    )
    parser.add_argument(
        "--parse",
        metavar="KEY",
        help="parse KEY instead of computing one (exit 2 if foreign; default: compute this "
        "environment's key)",
    )
    parser.add_argument(
        "--diff",
        nargs=2,
        metavar=("A", "B"),
        help="compare two environments, each a scope key, a fingerprint JSON or a results "
        "JSON: which keyed fields differ (exit 1: separate caches) and which reported ones "
        "(default: none)",
    )
    parser.set_defaults(func=run)


def run(
    *,
    python: str,
    salt: str | None,
    suffix: str,
    as_json: bool,
    parse: str | None,
    diff: list[str] | None,
) -> int:
    """Print the key (or, with --parse, its parts; with --diff, how two environments differ)."""
    if diff is not None:
        result = keydiff.diff(keydiff.load(diff[0]), keydiff.load(diff[1]))
        print(json.dumps(result, indent=2) if as_json else keydiff.render(result))
        return 0 if not result["keyed"] else 1
    if parse is not None:
        parsed = scopekey.parse(parse)
        if parsed is None:
            raise UsageError(f"not an fxcache scope key: {parse!r}")
        print(json.dumps(parsed.to_dict(), indent=2) if as_json else parsed.scope)
        return 0
    fp = fingerprint.collect(python, salt)
    key = scopekey.scope_key(fp, suffix)
    if as_json:
        parsed = scopekey.parse(key)
        assert parsed is not None
        print(
            json.dumps(
                {
                    "key": key,
                    "parts": parsed.to_dict(),
                    "keyed_fields": fp.keyed_fields(),
                    "canonical": scopekey.canonical_json(fp.keyed_fields()),
                },
                indent=2,
            )
        )
    else:
        print(key)
    return 0
