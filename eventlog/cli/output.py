"""Where results go: consoles for stdout and stderr, JSON lines, a progress bar."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import msgspec
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

_json = msgspec.json.Encoder()


def json_line(obj: object) -> str:
    return _json.encode(obj).decode()


class _OutputConsole(Console):
    """rich exits with status 1 when the reader of a pipe goes away (`... | head`); hand the
    BrokenPipeError to `eventlog`'s handler instead, which ends quietly with exit code 0."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


def stdout_console() -> Console:
    """Console for results; follows sys.stdout so a live progress bar can redirect it.

    Into a pipe or file nothing is cut to a terminal's width (lines are as long as they are).
    Neither console reads rich markup: what they print holds ids, paths and values from the
    log and the command line (a group id `g[/]7` was a MarkupError, `[red]g8` printed as
    `g8`); styling goes through `style=` or rich Text.
    """
    console = _OutputConsole(highlight=False, soft_wrap=False, markup=False)
    if not console.is_terminal:
        console = _OutputConsole(highlight=False, soft_wrap=False, markup=False, width=PIPE_WIDTH)
    return console


PIPE_WIDTH = 4096


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
