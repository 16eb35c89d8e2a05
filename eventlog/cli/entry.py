"""The `eventlog` console script's entry: Ctrl-C or SIGTERM while the program is still
loading ends it as later (one line, exit 130 or 143), not with a traceback of the import it
stopped."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from eventlog.cli.interrupts import Interrupted, stop_on_signals

        stop_on_signals()
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)  # Interrupted's code for Ctrl-C; importing it is what was interrupted
    try:
        from eventlog.cli.main import main as command
    except KeyboardInterrupt as exc:
        stopped = Interrupted.of(exc)
        sys.stderr.write(stopped.line() + "\n")
        sys.exit(stopped.exit_code)
    command()
