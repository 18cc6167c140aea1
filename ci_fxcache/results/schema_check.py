"""Check a document against `results.schema.json` itself: the schema is the one home of the
results' types, and a document that breaks them (a fork's artifact with markup where a count
belongs, a number with 5,000 digits) is refused before anything renders it.

It interprets exactly the JSON Schema keywords that file uses (type, enum, const, required,
properties, additionalProperties, items, $ref, oneOf, anyOf, allOf, if/then, minimum,
exclusiveMinimum, minLength, pattern); tests/test_results_reader_types.py holds it to the
`jsonschema` package's verdicts. It is not a general validator (the toolkit's locked
dependencies stay small). Two rules beyond the schema: numbers are finite, and integers fit
in 64 bits.
"""

from __future__ import annotations

import functools
import json
import math
import re
from pathlib import Path
from typing import Any

SCHEMA_FILE = Path(__file__).with_name("results.schema.json")
INT_LIMIT = 2**63
_ANNOTATIONS = {"$schema", "$id", "$defs", "title", "description"}


@functools.cache
def schema() -> dict[str, Any]:
    """The results document's schema, as shipped in the package."""
    loaded: dict[str, Any] = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    return loaded


def _type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else type(value).__name__


def _has_type(value: Any, name: str) -> bool:
    kind = _type_of(value)
    if name == "number":
        return kind in ("integer", "number")
    if name == "integer" and kind == "number":
        return math.isfinite(value) and float(value).is_integer()
    return kind == name


_PLAIN = re.compile(r"[A-Za-z0-9_.+-]{1,40}")


def _show(value: Any) -> str:
    """The value for a message: short plain words and numbers as they are, anything else by
    its kind (a hostile document's text is never repeated)."""
    if isinstance(value, str):
        return repr(value) if _PLAIN.fullmatch(value) else "a string"
    if isinstance(value, bool | int | float) or value is None:
        text = json.dumps(value)
        return text if len(text) <= 40 else f"a {_type_of(value)}"
    return "an object" if isinstance(value, dict) else f"a {_type_of(value)}"


def _at(path: str) -> str:
    return path or "the document"


class _Checker:
    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root

    def _resolve(self, ref: str) -> dict[str, Any]:
        node: Any = self.root
        for part in ref.removeprefix("#/").split("/"):
            node = node[part]
        result: dict[str, Any] = node
        return result

    def problem(self, value: Any, node: dict[str, Any], path: str) -> str | None:
        """The first way `value` (at `path`) breaks schema `node`, or None."""
        if isinstance(value, float) and not math.isfinite(value):
            return f"{_at(path)} is {value!r}, not a finite number"
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= INT_LIMIT:
            return f"{_at(path)} is an integer of {len(str(abs(value)))} digits (too large)"
        for key, arg in node.items():
            found = self._keyword(key, arg, value, node, path)
            if found:
                return found
        return None

    def _keyword(
        self, key: str, arg: Any, value: Any, node: dict[str, Any], path: str
    ) -> str | None:
        if key in _ANNOTATIONS or key in ("then", "else"):
            return None
        if key == "$ref":
            return self.problem(value, self._resolve(arg), path)
        if key == "type":
            names = arg if isinstance(arg, list) else [arg]
            if not any(_has_type(value, n) for n in names):
                return f"{_at(path)} is {_show(value)}; expected {' or '.join(names)}"
            return None
        if key == "enum":
            if not any(_type_of(value) == _type_of(a) and value == a for a in arg):
                return f"{_at(path)} is {_show(value)}; expected one of {', '.join(map(str, arg))}"
            return None
        if key == "const":
            return None if value == arg else f"{_at(path)} is {_show(value)}; expected {arg!r}"
        if key in ("oneOf", "anyOf"):
            problems = [self.problem(value, branch, path) for branch in arg]
            passed = sum(p is None for p in problems)
            if passed == 0:
                # A branch that got past the type check says best what is wrong.
                kind = f"{_at(path)} is {_show(value)}; expected "
                deeper = [p for p in problems if p and not p.startswith(kind)]
                return deeper[0] if deeper else str(problems[0])
            if key == "oneOf" and passed > 1:
                return f"{_at(path)} fits more than one of its allowed shapes"
            return None
        if key == "allOf":
            return next((p for b in arg if (p := self.problem(value, b, path))), None)
        if key == "if":
            if self.problem(value, arg, path) is None and "then" in node:
                return self.problem(value, node["then"], path)
            return None
        if key in ("minimum", "exclusiveMinimum"):
            if _has_type(value, "number") and not (
                value >= arg if key == "minimum" else value > arg
            ):
                return f"{_at(path)} is {_show(value)}; expected at least {arg}"
            return None
        if key == "minLength":
            if isinstance(value, str) and len(value) < arg:
                return f"{_at(path)} is shorter than {arg} character(s)"
            return None
        if key == "pattern":
            if isinstance(value, str) and not re.search(arg, value):
                return f"{_at(path)} is {_show(value)}; expected the form {arg}"
            return None
        return self._container(key, arg, value, node, path)

    def _container(
        self, key: str, arg: Any, value: Any, node: dict[str, Any], path: str
    ) -> str | None:
        if key == "required":
            if isinstance(value, dict):
                missing = [k for k in arg if k not in value]
                if missing:
                    return f"{_at(path)} lacks {', '.join(missing)}"
            return None
        if key == "properties":
            if isinstance(value, dict):
                for name, sub in arg.items():
                    if name in value:
                        found = self.problem(value[name], sub, _join(path, name))
                        if found:
                            return found
            return None
        if key == "additionalProperties":
            if isinstance(value, dict):
                known = node.get("properties", {})
                for name, item in value.items():
                    if name in known:
                        continue
                    if arg is False:
                        return f"{_at(path)} has an unexpected field {_show(name)}"
                    if isinstance(arg, dict):
                        found = self.problem(item, arg, _join(path, name))
                        if found:
                            return found
            return None
        if key == "items":
            if isinstance(value, list):
                for i, item in enumerate(value):
                    found = self.problem(item, arg, f"{path}[{i}]")
                    if found:
                        return found
            return None
        raise KeyError(f"results.schema.json uses {key!r}, which schema_check does not know")


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def problem(doc: Any) -> str | None:
    """The first way `doc` breaks the results document's schema, in one phrase, or None."""
    return _Checker(schema()).problem(doc, schema(), "")
