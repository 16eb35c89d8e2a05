"""`eventlog init`: create a log at the newest schema revision and print its id."""

from __future__ import annotations

import click

from eventlog.cli.targets import open_log, shown_target


@click.command()
@click.argument("target")
def init(target: str) -> None:
    """Create a log at TARGET (at the head revision) and print its log id.

    An existing log at head is left as it is (its id is printed); one at another revision is
    refused with the command that migrates it.
    """
    with open_log(target, create=True) as log:
        info = log.info()
        existed = int(info["head"]) > 0
    click.echo(info["log_id"])
    note = f"{info['head']} records" if existed else "new"
    click.echo(f"{shown_target(target)}: log {info['log_id']} ({note})", err=True)
