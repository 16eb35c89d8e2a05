"""The CLI's tables: into a pipe or a file they are laid out without rich, exactly as rich
lays them out there; anything rich would lay out otherwise goes to rich."""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import pytest
from rich.console import Console
from rich.table import Table

import eventlog.cli.output
from eventlog.cli.output import PIPE_WIDTH, Justify, print_table

TABLES: list[tuple[list[tuple[str, Justify]], list[list[str]]]] = [
    ([("step", "right"), ("groups trained", "right"), ("staleness", "left")], []),
    (
        [("step", "right"), ("groups trained", "right"), ("staleness", "left")],
        [["1", "1,234", "0:3 1:4"], ["10", "5", "-"], ["10000", "123,456,789", "0:1"]],
    ),
    (  # wide and accented characters take their cells, not their code points
        [("s", "right"), ("name", "left"), ("x", "right")],
        [["1", "ééé漢字", "0"], ["10000", "b", "123456"], ["2", "", ""]],
    ),
    ([("long name", "left"), ("n", "right")], [["a", "1"]]),
]


def _console(file: io.StringIO, *, terminal: bool = False, width: int = PIPE_WIDTH) -> Console:
    return Console(
        file=file,
        width=width,
        force_terminal=terminal,
        highlight=False,
        soft_wrap=False,
        markup=False,
        color_system="standard" if terminal else None,  # a terminal shows the header bold
    )


def _by_rich(columns: Sequence[tuple[str, Justify]], rows: list[list[str]], **kw: Any) -> str:
    out = io.StringIO()
    table = Table(title=None, box=None, pad_edge=False)
    for name, justify in columns:
        table.add_column(name, justify=justify)
    for row in rows:
        table.add_row(*row)
    _console(out, **kw).print(table)
    return out.getvalue()


def _printed(columns: Sequence[tuple[str, Justify]], rows: list[list[str]], **kw: Any) -> str:
    out = io.StringIO()
    print_table(_console(out, **kw), columns, rows)
    return out.getvalue()


@pytest.mark.parametrize(("columns", "rows"), TABLES)
def test_a_table_into_a_pipe_is_laid_out_here_as_rich_lays_it_out(
    columns: list[tuple[str, Justify]], rows: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = _by_rich(columns, rows)

    def no_rich(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a pipe's table went through rich's layout")

    monkeypatch.setattr(eventlog.cli.output, "Table", no_rich)
    assert _printed(columns, rows) == expected


@pytest.mark.parametrize(
    ("rows", "kw"),
    [
        ([["1", "two\nlines"]], {}),  # a cell rich would split over lines
        ([["1", "tab\there"]], {}),
        ([["1", "x" * 50]], {"width": 30}),  # wider than the console: rich shrinks columns
        ([["1", "abc"]], {"terminal": True, "width": 30}),  # a person's terminal
    ],
)
def test_what_rich_lays_out_otherwise_goes_to_rich(rows: list[list[str]], kw: Any) -> None:
    columns: list[tuple[str, Justify]] = [("n", "right"), ("text", "left")]
    assert _printed(columns, rows, **kw) == _by_rich(columns, rows, **kw)
