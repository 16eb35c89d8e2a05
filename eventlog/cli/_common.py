"""The old home of what every subcommand shares, kept for callers not yet moved.

New code imports from the module that owns the thing: `exits`, `targets`, `times`,
`views` (records as shown) and `output`.
"""

from __future__ import annotations

from eventlog.cli.exits import CliUsageError, ExitCode, exit_code_for
from eventlog.cli.output import json_line, stderr_console, stdout_console
from eventlog.cli.targets import open_log, shown_target
from eventlog.cli.times import format_ns, parse_time

__all__ = [
    "CliUsageError",
    "ExitCode",
    "exit_code_for",
    "format_ns",
    "json_line",
    "open_log",
    "parse_time",
    "shown_target",
    "stderr_console",
    "stdout_console",
]
