"""Ids, paths and values print as they are: no console reads rich markup or emoji codes. A
group id like `g[/]7` was a MarkupError (exit 70) in state, diff and inspect; `[red]g8`
printed as `g8`, and `:fire:` as an emoji: the wrong id in an audit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.helpers import cli
from tests.fixtures.ledger import open_harness

ODD = ["g[/]7", "[red]g8", ":fire:"]


def _run_of(
    path: Path, group_ids: list[str], agent: str | None = None, task: str | None = "math"
) -> str:
    """A log where each group is reserved (by `agent`, for `task`), dispatched and sealed,
    then checkpointed."""
    h = open_harness(path)
    try:
        for group_id in group_ids:
            h.reserve(group_id, n=1, agent=agent, task=task)
            h.dispatch(group_id)
            h.seal(group_id, 0)
        h.checkpoint(1)
    finally:
        h.log.close()
    return str(h.path)


@pytest.fixture
def odd_ids(tmp_path: Path) -> str:
    return _run_of(tmp_path / "run.db", ODD)


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        (["state", "{log}"], ODD),
        (["diff", "{log}", "0", "head"], ODD),
        (["inspect", "group", "{log}", ":fire:"], [":fire:"]),
        (["inspect", "group", "{log}", "g[/]7"], ["g[/]7"]),
        (["inspect", "group", "{log}", "[red]g8"], ["[red]g8"]),
        (["inspect", "rollout", "{log}", "[red]g8_g0"], ["[red]g8"]),
        (["replay", "{log}", "--group", "[red]g8"], ["[red]g8"]),
    ],
)
def test_ids_that_look_like_markup_or_emoji_codes_print_as_they_are(
    odd_ids: str, argv: list[str], shown: list[str]
) -> None:
    result = cli(*[a.format(log=odd_ids) for a in argv])
    assert result.exit_code == 0, result.stderr
    assert [group_id for group_id in ODD if group_id in result.stdout] == shown


def test_an_output_path_that_looks_like_markup_is_named_as_it_is(
    odd_ids: str, tmp_path: Path
) -> None:
    out = tmp_path / "r[bold]q.html"
    result = cli("report", odd_ids, "-o", str(out))
    assert result.exit_code == 0, result.stderr
    assert out.exists()
    assert str(out) in result.stdout + result.stderr


CONTROL = ["g\x1b[31mred", "g\nnl"]
"""Group ids (and agent, task, worker names) holding an escape sequence or a line break: a
stream name may hold any character but NUL, and what a log holds must not recolour the
terminal of whoever audits it, nor split a line of a table."""


@pytest.fixture
def control_ids(tmp_path: Path) -> str:
    return _run_of(tmp_path / "run.db", CONTROL, agent="a\x1b[1mb", task="t\x1b]0;title\x07")


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        (["state", "{log}"], CONTROL),
        (["diff", "{log}", "0", "head"], CONTROL),
        (["inspect", "group", "{log}", CONTROL[0]], CONTROL[:1]),
        (["inspect", "rollout", "{log}", CONTROL[1] + "_g0"], CONTROL[1:]),
        (["inspect", "step", "{log}", "1"], CONTROL),
        (["replay", "{log}", "--group", CONTROL[0]], CONTROL[:1]),
        (["stats", "{log}"], []),
    ],
)
def test_ids_holding_control_characters_print_quoted_as_json_text(
    control_ids: str, argv: list[str], shown: list[str]
) -> None:
    result = cli(*[a.format(log=control_ids) for a in argv])
    assert result.exit_code == 0, result.stderr
    assert "\x1b" not in result.stdout and "\x07" not in result.stdout
    assert [g for g in CONTROL if json.dumps(g) in result.stdout] == shown
    assert not any(g in result.stdout for g in CONTROL)
    if argv[:2] == ["inspect", "group"] or argv[0] == "stats":  # the reservation's agent
        assert json.dumps("a\x1b[1mb") in result.stdout, result.stdout
