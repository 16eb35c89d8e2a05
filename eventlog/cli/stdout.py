"""Stdout as every command writes it: a closed one is refused before the command starts, and
a write that fails (a full disk, an I/O error) is one typed error, StdoutError (exit 2), not
the OSError of whichever print met it (exit 70, after an append had committed its events).

A broken pipe stays a BrokenPipeError: the reader went away, which `eventlog` ends quietly.
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Iterator
from typing import Any

import click

from eventlog.cli.exits import CliUsageError


class StdoutError(CliUsageError):
    """Stdout is closed, or writing it failed: what the command prints is lost."""


class _GuardedRaw(io.FileIO):
    """Stdout's file descriptor, whose failed write is a StdoutError (a broken pipe stays a
    BrokenPipeError). Once `dropping`, it takes writes without writing them: what a failed
    command left buffered must not fail again when the stream is flushed for the last time
    (an "Exception ignored" traceback on stderr)."""

    dropping = False

    def write(self, data: Any, /) -> int:  # any buffer (typeshed's name is not importable)
        if self.dropping:
            return memoryview(data).nbytes
        try:
            return super().write(data)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise StdoutError(f"stdout: cannot write: {exc.strerror or exc}") from exc


def _plain_stdout(out: object) -> io.TextIOWrapper | None:
    """`out` where it is the interpreter's own stdout over a file descriptor; None where it
    is anything else (a test's capture, a console's own stream), which is left as it is."""
    if out is not sys.__stdout__ or not isinstance(out, io.TextIOWrapper):
        return None
    buffer = out.buffer  # a FileIO itself where Python runs unbuffered (-u, PYTHONUNBUFFERED)
    raw = buffer.raw if isinstance(buffer, io.BufferedWriter) else buffer
    return out if type(raw) is io.FileIO else None


@contextlib.contextmanager
def guarded_stdout() -> Iterator[None]:
    """Run a command with stdout checked: closed (`eventlog replay LOG >&-`), it is refused
    before anything is done; a write that fails, while the command runs or in the flush at
    its end, raises StdoutError. A command ended by `ctx.exit` (verify's exit 1) has its
    output flushed too, so that a failure there is not the interpreter's."""
    if sys.stdout is None:  # Python's stdout where fd 1 was closed when it started
        raise StdoutError(
            "stdout is closed: give the command a stdout (`> FILE`, or `> /dev/null` to "
            "discard what it prints)"
        )
    out = _plain_stdout(sys.stdout)
    if out is None:
        yield
        return
    out.flush()
    raw = _GuardedRaw(out.fileno(), "wb", closefd=False)
    guarded = io.TextIOWrapper(
        io.BufferedWriter(raw) if isinstance(out.buffer, io.BufferedWriter) else raw,
        encoding=out.encoding,
        # A character stdout's encoding lacks (PYTHONIOENCODING=ascii, a stream named in
        # another script) is escaped, as Python's stderr does: strict was exit 70.
        errors="backslashreplace" if out.errors == "strict" else out.errors,
        newline="\n",  # as Python's own stdout: no translation
        line_buffering=out.line_buffering,
        write_through=out.write_through,
    )
    sys.stdout = guarded
    try:
        try:
            yield
        except click.exceptions.Exit:
            guarded.flush()
            raise
        guarded.flush()
    finally:  # after an error, what is still buffered is lost
        raw.dropping = True
        guarded.flush()
        if sys.stdout is guarded:
            sys.stdout = out
