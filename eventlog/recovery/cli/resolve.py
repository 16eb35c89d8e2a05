"""`eventlog resolve-finalization TARGET GROUP`: settle a group stuck in finalization_unknown.

A finalization that failed ambiguously may or may not have written the canonical rows, and no
checkpoint is taken until someone decides. This command looks at the canonical partition of
the run's data plane (the running TransferQueue, joined through Ray): every row there means
the finalization happened (GroupFinalized); otherwise the group is ready to finalize again
(FinalizationRetryable, partial rows cleared). It writes, so it opens the log writable, and it
takes a fencing epoch: run it while the controller is stopped. The group is checked on a
read-only ledger first, so a refused resolution appends nothing.
"""

from __future__ import annotations

import asyncio
import os
import socket

import click

from eventlog.cli.exits import CliUsageError
from eventlog.cli.output import json_line
from eventlog.cli.targets import open_log, shown_target
from eventlog.dataplane.memory import InMemoryDataPlane
from eventlog.dataplane.protocol import DataPlane
from eventlog.recovery.barrier import MutationBarrier
from eventlog.recovery.errors import DataPlaneError, LedgerRuleError
from eventlog.recovery.ledger import RecoveryLedger


def join_data_plane(ray_address: str | None) -> DataPlane:
    """The running TransferQueue of the run, joined through Ray (`ray_address` or RAY_ADDRESS)."""
    try:
        import ray

        from eventlog.dataplane.transferqueue import join_transferqueue
    except ImportError as exc:
        raise DataPlaneError(
            f"the TransferQueue data plane needs the rollout extra ({exc.name} is missing)"
        ) from None
    if not ray.is_initialized():
        address = ray_address or os.environ.get("RAY_ADDRESS")
        if not address:
            raise CliUsageError(
                "no Ray cluster to join: pass --ray-address or set RAY_ADDRESS",
                hint="the canonical rows live in the run's TransferQueue",
            )
        why = _unreachable(address)
        if why is not None:
            raise DataPlaneError(
                f"cannot join the Ray cluster at {address!r}: nothing answers there ({why})",
                hint="pass the address of the run's Ray head (`ray status` there prints it)",
            )
        try:
            ray.init(address=address, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise DataPlaneError(f"cannot join the Ray cluster at {address!r}: {exc}") from None
    return join_transferqueue()


def _unreachable(address: str) -> str | None:
    """Why nothing answers at a Ray address HOST:PORT (or ray://HOST:PORT); None where
    something does, or for another form ("auto"). ray.init waited for good on an address
    where nothing listened."""
    host, colon, port = address.removeprefix("ray://").rpartition(":")
    if not colon or not port.isdigit():
        return None
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=_PROBE_S):
            return None
    except (OSError, OverflowError) as exc:  # refused, no such host, a port beyond 65535
        return str(getattr(exc, "strerror", None) or exc)


_PROBE_S = 5.0


def resolve_group(log_target: str, group_id: str, owner: str | None, data_plane: DataPlane) -> str:
    with open_log(log_target, write=True) as log:
        ledger = RecoveryLedger.open(log, data_plane)

        async def section() -> str:
            async with MutationBarrier("resolve-finalization").mutation("resolve") as cut:
                return ledger.resolve_finalization_unknown(cut, group_id, owner=owner)

        return asyncio.run(section())


def check_group(log_target: str, group_id: str) -> str | None:
    """The group's recorded finalization owner; refuses a group that is not unknown."""
    with open_log(log_target) as log:
        ledger = RecoveryLedger.open(log, InMemoryDataPlane(), read_only=True)
        group = ledger.group(group_id)
        if group.status != "finalization_unknown":
            raise LedgerRuleError(
                f"group {group_id!r}: is {group.status}, not finalization_unknown",
                hint="only a group marked finalization_unknown needs resolving",
            )
        return group.finalization_owner


@click.command("resolve-finalization")
@click.argument("target")
@click.argument("group_id", metavar="GROUP")
@click.option("--owner", help="The finalization owner to record (default: the recorded one).")
@click.option(
    "--ray-address", metavar="ADDR", help="Ray cluster of the run's TransferQueue (RAY_ADDRESS)."
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def resolve_finalization(
    target: str, group_id: str, owner: str | None, ray_address: str | None, as_json: bool
) -> None:
    """Settle GROUP's unknown finalization by the canonical rows in the data plane."""
    recorded = check_group(target, group_id)
    data_plane = join_data_plane(ray_address)
    outcome = resolve_group(target, group_id, owner, data_plane)
    if as_json:
        click.echo(
            json_line(
                {
                    "target": shown_target(target),
                    "group_id": group_id,
                    "outcome": outcome,
                    "owner": owner or recorded,
                }
            )
        )
        return
    what = (
        "every canonical row is there: recorded as finalized"
        if outcome == "finalized"
        else "canonical rows are missing: recorded as ready to finalize again"
    )
    click.echo(f"group {group_id}: {what}")
