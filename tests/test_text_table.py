"""The one text-table layout every command prints through."""

from __future__ import annotations

from ci_fxcache.report import text_table


def test_columns_align_clip_and_right_justify() -> None:
    rows = [["name", "size", "why"], ["a-long-name", "3 KiB", "because"], ["b", "12 MiB", ""]]
    out = text_table.lines(rows, right={1}, column_widths=[6, 6, 7], rule=True)
    assert out == [
        "name      size  why",
        "------  ------  -------",
        "a-lon…   3 KiB  because",
        "b       12 MiB",
    ]


def test_default_widths_fit_the_longest_cell() -> None:
    out = text_table.lines([("torch", "2.13.0"), ("interpreter", "/usr/bin/python3")])
    assert out == ["torch        2.13.0", "interpreter  /usr/bin/python3"]
