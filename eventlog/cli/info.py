"""`eventlog info`: what a log is — id, creation time, revision, head and its chain value."""

from __future__ import annotations

import click

from eventlog.cli.numbers import whole_number
from eventlog.cli.output import json_line
from eventlog.cli.targets import open_log, shown_target
from eventlog.cli.times import format_ns


@click.command()
@click.argument("target")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def info(target: str, as_json: bool) -> None:
    """Print TARGET's log id, creation time, schema revision, head seq, chain value, backend."""
    with open_log(target) as log:
        meta = log.info()
        backend = log.backend
    created_ns = meta.get("created_at_ns", "")
    fields = {
        "target": shown_target(target),
        "backend": backend,
        "log_id": meta.get("log_id", ""),
        "created": _created(created_ns),
        "revision": meta.get("revision", ""),
        "hash_algorithm": meta.get("hash_algorithm", ""),
        "head": int(meta["head"]),
        "chain": meta["chain"],
    }
    if as_json:
        click.echo(json_line(fields))
        return
    width = max(len(key) for key in fields)
    for key, value in fields.items():
        click.echo(f"{key + ':':<{width + 1}} {value}")


def _created(text: str) -> str:
    """The log's creation time as stored, shown as a time where it reads as one (the meta
    table is plain text: an edited value is shown as it is, not a crash)."""
    ns = whole_number(text)
    if ns is not None and 0 <= ns < 2**63:
        return format_ns(ns)
    return repr(text)
