"""`eventlog replay` with `--group G`: a prompt group's own stream and its attempts' streams."""

from __future__ import annotations

import click
import msgspec

from eventlog import codec
from eventlog.cli.replay import make_replay
from eventlog.log import EventLog
from eventlog.recovery.vocabulary import attempt_stream, group_stream


def group_streams(log: EventLog, group_id: str) -> list[str]:
    """A group's stream plus the attempt streams of every rollout id its events name.

    One read of the group's own (small) stream finds them; attempts are always named by a
    `rollout_id` field, so this does not depend on which events carry them.
    """
    stream = group_stream(group_id)
    rollout_ids: set[str] = set()
    for record in log.read_records(streams=[stream]):
        try:
            _collect_rollout_ids(codec.raw_fields(record.payload), rollout_ids)
        except msgspec.DecodeError:
            continue  # a corrupt payload: replay itself will report it
    return [stream, *(attempt_stream(rollout_id) for rollout_id in sorted(rollout_ids))]


def _collect_rollout_ids(value: object, found: set[str]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "rollout_id" and isinstance(item, str) and item:
                found.add(item)
            else:
                _collect_rollout_ids(item, found)
    elif isinstance(value, list):
        for item in value:
            _collect_rollout_ids(item, found)


class GroupSelector:
    """`--group G`: stream group/G and the attempt streams of its rollout ids."""

    def option(self) -> click.Option:
        return click.Option(
            ["--group", "groups"],
            multiple=True,
            metavar="G",
            help="Only prompt group G: stream group/G and the attempt streams of its rollout "
            "ids (repeatable).",
        )

    def streams(self, log: EventLog, value: str) -> list[str]:
        return group_streams(log, value)


replay = make_replay([GroupSelector()])
