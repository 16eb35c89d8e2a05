"""`eventlog verify`: recompute the hash chain; exit 1 and name the first bad seq if broken."""

from __future__ import annotations

import re

import click

from eventlog.cli.exits import ExitCode
from eventlog.cli.numbers import whole_number
from eventlog.cli.output import json_line
from eventlog.cli.targets import open_log
from eventlog.log import EventLog
from eventlog.store.base import MAX_SEQ
from eventlog.verify import Problem

_SEQ_PREFIX = re.compile(r"^seq \d+: ")


def _parse_anchor(
    _ctx: click.Context, param: click.Parameter, value: str | None
) -> tuple[int, str] | None:
    if value is None:
        return None
    seq_text, _, chain = value.partition(":")
    chain = chain.strip().lower()
    seq = whole_number(seq_text)
    if seq is None or not 1 <= seq <= MAX_SEQ or not re.fullmatch(r"[0-9a-f]{64}", chain):
        raise click.BadParameter(
            f"expected SEQ:CHAIN (a seq in 1..{MAX_SEQ}, 64 hex digits), found {value!r}",
            param=param,
        )
    return seq, chain


def check_anchor(log: EventLog, seq: int, chain: str) -> Problem | None:
    """Compare the record at `seq` with a chain value kept elsewhere (detects truncation)."""
    record = next(iter(log.read_records(seq, seq)), None)
    if record is None:
        return Problem(seq, "anchor", f"seq {seq} is gone (the log was truncated to {log.head()})")
    if record.chain.hex() != chain:
        return Problem(
            seq, "anchor", f"chain at seq {seq} is {record.chain.hex()}, anchor says {chain}"
        )
    return None


@click.command()
@click.argument("target")
@click.option(
    "--anchor",
    callback=_parse_anchor,
    metavar="SEQ:CHAIN",
    help="A chain value kept elsewhere (from an earlier `verify` or a checkpoint): also fail "
    "when the record at SEQ is missing or differs, which catches truncation.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@click.pass_context
def verify(ctx: click.Context, target: str, anchor: tuple[int, str] | None, as_json: bool) -> None:
    """Recompute TARGET's hash chain; report gaps, edits, reorders and duplicates.

    Exit 0 and print the head's chain value (keep it: it is the anchor against truncation),
    or exit 1 and print the first bad seq and each problem.
    """
    with open_log(target) as log:
        report = log.verify()
        problems = list(report.problems)
        if anchor is not None:
            found = check_anchor(log, *anchor)
            if found is not None:
                problems.append(found)
                problems.sort(key=lambda p: p.seq)
    first_bad = min((p.seq for p in problems), default=None)
    if as_json:
        click.echo(
            json_line(
                {
                    "ok": not problems,
                    "records": report.records,
                    "head": report.head,
                    "chain": report.last_chain,
                    "first_bad_seq": first_bad,
                    "problems": [
                        {"seq": p.seq, "kind": p.kind, "message": p.message} for p in problems
                    ],
                }
            )
        )
    elif not problems:
        click.echo(
            f"ok: {report.records} records, head seq {report.head}, chain {report.last_chain}"
        )
    else:
        click.echo(
            f"FAILED: first bad seq {first_bad} ({len(problems)} problem"
            f"{'s' if len(problems) != 1 else ''}; {report.records} records, head seq "
            f"{report.head})"
        )
        for problem in problems:
            click.echo(f"seq {problem.seq}: {problem.kind}: {_SEQ_PREFIX.sub('', problem.message)}")
    if problems:
        ctx.exit(ExitCode.INTEGRITY)
