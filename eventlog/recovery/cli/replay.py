"""`eventlog replay` for rollout recovery: `--group G`, `--step N`, `--checkpoint N`, and
rolled-back records marked (`--effective` hides them)."""

from __future__ import annotations

from collections.abc import Callable

import click

from eventlog.cli.numbers import whole_number
from eventlog.cli.replay import Selection, make_replay
from eventlog.cli.views import Mark
from eventlog.log import EventLog
from eventlog.recovery.cli.runlog import RunLog, group_selection


class GroupSelector:
    """`--group G`: every record about G wherever it lives (see `group_selection`)."""

    def option(self) -> click.Option:
        return click.Option(
            ["--group", "groups"],
            multiple=True,
            metavar="G",
            help="Only records about prompt group G: its stream, its attempts' streams, the "
            "replay records that name it (trained in step N), the clean-ups of its rows and "
            "the restores that rolled it back (repeatable).",
        )

    def select(self, log: EventLog, value: str, head: int) -> Selection:
        return group_selection(log, value, RunLog(log, until_seq=head))


def _one(_ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
    """One step's records, or one checkpoint's: ranges narrow, so two selected nothing."""
    if len(values) > 1:
        raise click.BadParameter(
            f"give one (got {', '.join(values)}); several steps' records are a seq range: "
            "--from-seq and --until-seq",
            param=param,
        )
    return values


def _step(value: str, what: str) -> int:
    number = whole_number(value)
    if number is None:
        raise click.BadParameter(f"{value!r} is not a step number", param_hint=what)
    return number


class StepSelector:
    """`--step N`: the records of step N's work, after step N-1's end up to N's."""

    def option(self) -> click.Option:
        return click.Option(
            ["--step", "steps"],
            multiple=True,
            callback=_one,
            metavar="N",
            help="Only the records of step N: after step N-1 ended, up to and including where "
            "step N ended (its training or its checkpoint, whichever is later; the step in "
            "progress: up to the head).",
        )

    def select(self, log: EventLog, value: str, head: int) -> Selection:
        run = RunLog(log, until_seq=head)
        return Selection(seq_range=run.step_range(_step(value, "--step")))


class CheckpointSelector:
    """`--checkpoint N`: the log as it stood at step N's effective checkpoint."""

    def option(self) -> click.Option:
        return click.Option(
            ["--checkpoint", "checkpoints"],
            multiple=True,
            callback=_one,
            metavar="N",
            help="Only records up to and including the effective checkpoint of step N.",
        )

    def select(self, log: EventLog, value: str, head: int) -> Selection:
        run = RunLog(log, until_seq=head)
        return Selection(seq_range=(1, run.checkpoint_seq(_step(value, "--checkpoint"))))


class RolledBackMarker:
    """Records a restore rolled back: kept in the log, counted by no rebuild."""

    title = "rolled back by"
    hide_flag = "--effective"
    hide_help = "Hide records a restore rolled back (the history every rebuild sees)."
    column = "rolled_back_by"

    def marks(
        self, log: EventLog, until_seq: int | None = None
    ) -> Callable[[int], Mark | None] | None:
        run = RunLog(log, until_seq=until_seq)
        return run.mark if run.skipped else None


replay = make_replay(
    [GroupSelector(), StepSelector(), CheckpointSelector()], marker=RolledBackMarker()
)
