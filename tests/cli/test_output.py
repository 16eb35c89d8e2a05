"""The CLI's tables: into a pipe or a file they are laid out without rich, exactly as rich
lays them out there; anything rich would lay out otherwise goes to rich."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Sequence
from typing import Any

import pytest
from rich.console import Console
from rich.table import Table

import eventlog.cli.output
from eventlog.cli.output import Justify, print_table, stdout_console

Columns = list[tuple[str, Justify]]

TABLES: list[tuple[Columns, list[list[str]]]] = [
    ([("step", "right"), ("groups trained", "right"), ("staleness", "left")], []),
    (
        [("step", "right"), ("groups trained", "right"), ("staleness", "left")],
        [["1", "1,234", "0:3 1:4"], ["10", "5", "-"], ["10000", "123,456,789", "0:1"]],
    ),
    (  # wide, accented and combining characters take their cells, not their code points
        [("s", "right"), ("name", "left"), ("x", "right")],
        [["1", "ééé漢字", "0"], ["10000", "b", "123456"], ["2", "", ""], ["3", "e\u0301", "🔥"]],
    ),
    ([("long name", "left"), ("n", "right")], [["a", "1"], [":fire:", "[red]x"]]),
]


def _table(columns: Sequence[tuple[str, Justify]], rows: list[list[str]]) -> Table:
    table = Table(title=None, box=None, pad_edge=False)
    for name, justify in columns:
        table.add_column(name, justify=justify)
    for row in rows:
        table.add_row(*row)
    return table


def _into_a_pipe(show: Any) -> str:
    """What `show(console)` prints on the CLI's console into a pipe."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        show(stdout_console())
    return out.getvalue()


@pytest.mark.parametrize(("columns", "rows"), TABLES)
def test_a_table_into_a_pipe_is_laid_out_here_as_rich_lays_it_out(
    columns: Columns, rows: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = _into_a_pipe(lambda console: console.print(_table(columns, rows)))

    def no_rich(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a pipe's table went through rich's layout")

    monkeypatch.setattr(eventlog.cli.output, "Table", no_rich)
    assert _into_a_pipe(lambda console: print_table(console, columns, rows)) == expected


@pytest.mark.parametrize(
    ("columns", "rows"),
    [
        ([("n", "right"), ("text", "left")], [["1", "two\nlines"]]),  # rich splits it
        ([("n", "right"), ("text", "left")], [["1", "tab\there"]]),
        ([("n", "right"), ("text", "left")], [["ab ", "x"]]),  # rich strips the space
        ([("n\u2028m", "right"), ("text", "left")], [["1", "x"]]),  # a header, too
        ([("n", "right"), ("text", "left")], [["1"]]),  # a ragged row: rich pads it
        ([("n", "right"), ("text", "left")], [["1", "x" * 5000]]),  # wider than the console
    ],
)
def test_what_rich_lays_out_otherwise_goes_to_rich(columns: Columns, rows: list[list[str]]) -> None:
    expected = _into_a_pipe(lambda console: console.print(_table(columns, rows)))
    assert _into_a_pipe(lambda console: print_table(console, columns, rows)) == expected


def test_a_terminal_or_a_console_other_than_the_clis_goes_to_rich(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another console may read emoji codes or markup (rich's defaults); on a terminal rich
    fits the table to its width and styles the header."""
    columns: Columns = [("n", "right"), ("text", "left")]
    rows = [["1", ":fire:"]]
    drawn: list[Table] = []

    def recorded(*args: Any, **kwargs: Any) -> Table:
        drawn.append(Table(*args, **kwargs))
        return drawn[-1]

    monkeypatch.setattr(eventlog.cli.output, "Table", recorded)
    for console in (
        Console(file=io.StringIO(), width=200),
        Console(file=io.StringIO(), width=200, force_terminal=True, markup=False, emoji=False),
    ):
        print_table(console, columns, rows)
    assert len(drawn) == 2
    monkeypatch.setenv("FORCE_COLOR", "1")  # the CLI's own console, taken for a terminal
    _into_a_pipe(lambda console: print_table(console, columns, rows))
    assert len(drawn) == 3
