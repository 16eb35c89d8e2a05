"""The `eventlog` console script's entry: Ctrl-C while the program is still loading ends it
as Ctrl-C does later (one line, exit 130), not with a traceback of the import it stopped."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from eventlog.cli.main import main as command
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)  # ExitCode.INTERRUPTED; importing exits.py is what may be interrupted
    command()
