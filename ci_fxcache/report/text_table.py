"""Plain-text tables for the terminal: the one home of column layout for every command."""

from __future__ import annotations

from collections.abc import Container, Sequence


def clip(text: str, width: int) -> str:
    """`text` cut to `width` characters, an ellipsis marking the cut."""
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def shorten_middle(text: str, width: int) -> str:
    """`text` within `width` characters, cut in the middle (`myorg.models…:build_model`), so
    that both ends, where names differ, stay."""
    if len(text) <= width:
        return text
    if width < 3:
        return text[:width]
    tail = (width - 1) // 2
    return text[: width - 1 - tail] + "…" + text[len(text) - tail :]


def widths(rows: Sequence[Sequence[str]]) -> list[int]:
    """Each column's width: its longest cell."""
    return [max(len(row[i]) for row in rows) for i in range(len(rows[0]))] if rows else []


def lines(
    rows: Sequence[Sequence[str]],
    *,
    right: Container[int] = (),
    column_widths: Sequence[int] | None = None,
    rule: bool = False,
) -> list[str]:
    """`rows` (the first is the header) as lines of columns two spaces apart.

    Columns whose index is in `right` are right-aligned; the others are left-aligned and
    clipped to their width (`column_widths`, default: the longest cell). With `rule`, a line of
    dashes follows the header. Trailing blanks are dropped."""
    sizes = list(column_widths) if column_widths is not None else widths(rows)

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else clip(c, w).ljust(w)
            for i, (c, w) in enumerate(zip(cells, sizes, strict=True))
        ).rstrip()

    out = [line(row) for row in rows]
    if rule and out:
        out.insert(1, line(["-" * w for w in sizes]))
    return out
