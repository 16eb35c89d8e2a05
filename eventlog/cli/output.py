"""Where results go: consoles for stdout and stderr, JSON lines, a progress bar."""

from __future__ import annotations

import difflib
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Literal

import msgspec
from rich.cells import cell_len
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

_json = msgspec.json.Encoder()


def json_line(obj: object) -> str:
    return _json.encode(obj).decode()


def nearest(wanted: str, valid: Iterable[str], n: int = 3) -> str:
    """ "nearest: a, b, c" for an error message (close spellings first, else the first few)."""
    choices = sorted(set(valid))
    if not choices:
        return "the log has none"
    close = sorted(difflib.get_close_matches(wanted, choices, n=n, cutoff=0.5)) or choices[:n]
    return "nearest: " + ", ".join(close)


def nearest_numbers(wanted: int, valid: Iterable[int], n: int = 3) -> str:
    choices = sorted(set(valid))
    if not choices:
        return "the log has none"
    close = sorted(sorted(choices, key=lambda v: (abs(v - wanted), v))[:n])
    return "nearest: " + ", ".join(str(v) for v in close)


def printable(text: str) -> str:
    """`text` as it is, or JSON-quoted when it holds a control character: a stored value must
    not reach a terminal as an escape sequence, nor split a line of a table in a pipe."""
    return text if text.isprintable() else json_line(text)


def shown_ids(ids: Iterable[str]) -> str:
    """Ids on one line, space-separated, each `printable`."""
    return " ".join(map(printable, ids))


class _OutputConsole(Console):
    """rich exits with status 1 when the reader of a pipe goes away (`... | head`); hand the
    BrokenPipeError to `eventlog`'s handler instead, which ends quietly with exit code 0."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


def stdout_console() -> Console:
    """Console for results; follows sys.stdout so a live progress bar can redirect it.

    Into a pipe or file nothing is cut to a terminal's width (lines are as long as they are).
    Neither console reads rich markup or emoji codes: what they print holds ids, paths and
    values from the log and the command line (a group id `g[/]7` was a MarkupError, `[red]g8`
    printed as `g8`, `:fire:` as an emoji); styling goes through `style=` or rich Text.
    """
    console = _OutputConsole(highlight=False, soft_wrap=False, markup=False, emoji=False)
    if not console.is_terminal:
        console = _OutputConsole(
            highlight=False, soft_wrap=False, markup=False, emoji=False, width=PIPE_WIDTH
        )
    return console


PIPE_WIDTH = 4096

Justify = Literal["left", "right"]


def print_table(
    console: Console, columns: Sequence[tuple[str, Justify]], rows: Iterable[Sequence[str]]
) -> None:
    """A table of text cells without a box, the CLI's table. Into a pipe or a file, on the
    console `stdout_console` made, it is laid out here as rich lays it out there (cells
    justified to their column, two spaces between): rich's layout costs ~1 ms a row, seconds
    for the per-step table of a run with thousands of steps. Anything rich lays out otherwise
    goes to rich: a terminal, another console (it may read markup or emoji codes), a cell
    that is not plain text (unprintable, or with spaces at its ends), a ragged row, a table
    wider than the console."""
    cells = [list(row) for row in rows]
    names = [name for name, _ in columns]
    widths = _plain_widths(console, [names, *cells])
    if widths is not None:
        right = [justify == "right" for _, justify in columns]

        def line(row: Sequence[str]) -> str:
            return "  ".join(
                " " * (width - cell_len(text)) + text
                if at_right
                else text + " " * (width - cell_len(text))
                for text, width, at_right in zip(row, widths, right, strict=True)
            )

        console.out("".join(line(row) + "\n" for row in [names, *cells]), end="", highlight=False)
        return
    table = Table(title=None, box=None, pad_edge=False)
    for name, justify in columns:
        table.add_column(name, justify=justify)
    for row in cells:
        table.add_row(*row)
    console.print(table)


def _plain_widths(console: Console, rows: list[list[str]]) -> list[int] | None:
    """Each column's width in cells where `print_table` lays the rows (the header first) out
    itself; None where rich must."""
    if not isinstance(console, _OutputConsole) or console.is_terminal:
        return None
    widths = [0] * len(rows[0])
    for row in rows:
        if len(row) != len(widths):
            return None
        for i, text in enumerate(row):
            if not text.isprintable() or text.strip() != text:
                return None
            widths[i] = max(widths[i], cell_len(text))
    return widths if sum(widths) + 2 * (len(widths) - 1) <= console.width else None


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False, markup=False)


PROGRESS_MIN_RECORDS = 10_000


@contextmanager
def seq_progress(
    description: str, first_seq: int, last_seq: int
) -> Iterator[Callable[[int], None]]:
    """A progress bar over a seq range on stderr, only when a person is watching a long read.

    Yields a function to call with each seq seen (a no-op when no bar is shown).
    """
    total = last_seq - first_seq + 1
    if total < PROGRESS_MIN_RECORDS or not (sys.stdout.isatty() and sys.stderr.isatty()):
        yield lambda _seq: None
        return
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=stderr_console(),
        transient=True,
    )
    step = max(total // 500, 1)
    with progress:
        task = progress.add_task(description, total=total)
        shown = first_seq

        def advance(seq: int) -> None:
            nonlocal shown
            if seq - shown >= step:  # a redraw per record would cost more than the read
                shown = seq
                progress.update(task, completed=seq - first_seq + 1)

        yield advance
