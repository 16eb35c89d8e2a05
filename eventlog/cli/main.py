"""The `eventlog` command: a click group whose subcommands live one per module.

Adding a subcommand is one line in SUBCOMMANDS ("name": "module:attribute"); modules load on
first use, so `eventlog verify` never imports what `eventlog demo` needs.

Every deliberate error (EventLogError) becomes one `error:` line on stderr, plus a `hint:` line
when the error carries one, and the exit code below. Tracebacks only with `--debug`. Stdout
closed, or failing to take a write (a full disk), is such an error too (eventlog.cli.stdout).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
import traceback
from collections.abc import Iterator
from typing import Any, NoReturn

import click

from eventlog.cli.exits import CliUsageError, ExitCode, exit_code_for
from eventlog.cli.interrupts import Interrupted
from eventlog.cli.stdout import guarded_stdout
from eventlog.errors import EventLogError

SUBCOMMANDS: dict[str, str] = {
    "db": "eventlog.cli.db:db",
    "backup": "eventlog.cli.backup:backup",
    "init": "eventlog.cli.init:init",
    "append": "eventlog.cli.append:append",
    "replay": "eventlog.recovery.cli.replay:replay",
    "verify": "eventlog.cli.verify:verify",
    "info": "eventlog.cli.info:info",
    "tail": "eventlog.cli.tail:tail",
    "stats": "eventlog.recovery.cli.stats:stats",
    "demo": "eventlog.demo.command:demo",
    "inspect": "eventlog.recovery.cli.inspect:inspect",
    "state": "eventlog.recovery.cli.state:state",
    "diff": "eventlog.recovery.cli.diff:diff",
    "export": "eventlog.recovery.cli.export:export",
    "report": "eventlog.recovery.cli.report:report_command",
    "resolve-finalization": "eventlog.recovery.cli.resolve:resolve_finalization",
    "runs": "eventlog.recovery.cli.runs:runs",
}


# Vocabularies every command can decode without --events-module (imported by name, on start).
DEFAULT_EVENTS_MODULES: tuple[str, ...] = (
    "eventlog.recovery.vocabulary",
    "eventlog.integrations.eventsourcing_events",  # no eventsourcing import: msgspec only
)


class LazyGroup(click.Group):
    """A group that imports a subcommand's module only when that subcommand is used."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*SUBCOMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands:
            return self.commands[cmd_name]
        spec = SUBCOMMANDS.get(cmd_name)
        if spec is None:
            return None
        module_name, _, attribute = spec.partition(":")
        command = getattr(importlib.import_module(module_name), attribute)
        if not isinstance(command, click.Command):  # pragma: no cover - a registration typo
            raise TypeError(f"{spec} is not a click command")
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows: list[tuple[str, str]] = []
        for name in self.list_commands(ctx):
            try:
                command = self.get_command(ctx, name)
            except ImportError as exc:  # an optional extra is not installed
                rows.append((name, f"(unavailable: {exc})"))
                continue
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(formatter.width - 6 - len(name))))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        for arg in args:
            _require_text(arg)
        rest: list[str] = []
        with _one_line_errors(ctx):  # the group's own --help and --version print here
            rest = super().parse_args(ctx, args)
        return rest

    def invoke(self, ctx: click.Context) -> Any:
        with _one_line_errors(ctx):
            return super().invoke(ctx)


@contextlib.contextmanager
def _one_line_errors(ctx: click.Context) -> Iterator[None]:
    """Stdout guarded (closed or failing: a StdoutError, exit 2), and whatever ends the block
    early said in one line with its exit code: an error, a stop, a reader gone away."""
    try:
        with guarded_stdout():
            yield
    except (click.exceptions.ClickException, click.exceptions.Exit, click.Abort):
        raise
    except BrokenPipeError:
        # The reader went away (`eventlog replay ... | head`): not a failure of ours.
        _silence_stdout()
        ctx.exit(ExitCode.OK)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (eventlog.cli.interrupts)
        stopped = exc if isinstance(exc, Interrupted) else Interrupted.of(exc)
        _say(stopped.line())
        if stopped.hint:
            _say(f"hint: {stopped.hint}")
        ctx.exit(stopped.exit_code)
    except Exception as exc:
        _fail(ctx, exc)


def _fail(ctx: click.Context, exc: Exception) -> NoReturn:
    """Report an error as one line (plus a hint) and exit with its documented code."""
    debug = bool(ctx.find_root().params.get("debug"))
    if debug:
        traceback.print_exception(exc, file=sys.stderr)
    code = exit_code_for(exc)
    if code == ExitCode.DATABASE and not isinstance(exc, EventLogError):  # untranslated
        original = getattr(exc, "orig", None) or exc
        message = f"database error: {original}"
        hint = None
    elif code == ExitCode.INTERNAL:
        message = f"unexpected {type(exc).__name__}: {exc}"
        hint = None if debug else "rerun with --debug for the traceback, and report it"
    else:
        message = str(exc)
        hint = getattr(exc, "hint", None)
    _say(f"error: {_one_line(message)}")
    if hint:
        _say(f"hint: {_one_line(hint)}")
    ctx.exit(code)


def _say(line: str) -> None:
    """A line on stderr; where stderr takes none (a full disk), the exit code still tells
    (a failed write there escaped as exit 1, the code of an integrity problem)."""
    with contextlib.suppress(OSError):
        click.echo(line, err=True)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # not a real file (tests)
        pass


def _require_text(arg: str) -> None:
    """An argument must be text: bytes that are not UTF-8 reach Python as surrogates, which
    no database driver, URL or file name encoder takes (they ended in exit 70)."""
    try:
        arg.encode("utf-8")
    except UnicodeEncodeError:
        shown = arg.encode("utf-8", "surrogateescape")
        raise click.UsageError(f"argument {shown!r} is not UTF-8 text") from None


def _one_line(text: str) -> str:
    return " ".join(text.split()) or "(no message)"


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logging.")
@click.option(
    "--events-module",
    "events_modules",
    multiple=True,
    metavar="MODULE",
    envvar="EVENTLOG_EVENTS_MODULES",
    help="Import MODULE to register its event types (repeatable; env EVENTLOG_EVENTS_MODULES, "
    "space-separated).",
)
@click.option(
    "--run",
    metavar="NAME",
    envvar="EVENTLOG_RUN",
    help="The run to use when TARGET's PostgreSQL database holds several (env EVENTLOG_RUN; "
    "the same as ?run=NAME in the URL). SQLite: one file per run.",
)
@click.version_option(package_name="eventlog")
def main(debug: bool, events_modules: tuple[str, ...], run: str | None) -> None:
    """The durable, auditable memory of an asynchronous RL post-training run.

    TARGET is an SQLite file path or a SQLAlchemy URL (postgresql+psycopg://user@host/db).

    Exit codes: 0 ok, 1 integrity problem found, 2 usage or bad input, 3 log revision or
    schema problem, 4 concurrency or duplicate event, 5 other eventlog error (domain rule,
    reconciliation, data plane), 6 database unreachable or failing, 70 internal error,
    130 interrupted (Ctrl-C), 143 terminated (SIGTERM).
    """
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for name in (*DEFAULT_EVENTS_MODULES, *events_modules):
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise CliUsageError(
                f"--events-module {name}: cannot import it ({exc})",
                hint="check the module name and that it is on PYTHONPATH",
            ) from exc
        except Exception as exc:  # its own code failed (a relative name, a syntax error)
            raise CliUsageError(
                f"--events-module {name}: importing it failed: {type(exc).__name__}: {exc}",
                hint="rerun with --debug for the module's traceback",
            ) from exc
        except SystemExit as exc:  # its exit code would pass for one of ours (3: a schema)
            raise CliUsageError(
                f"--events-module {name}: importing it called sys.exit({exc.code!r})",
                hint="a module of event types should only define them",
            ) from exc
