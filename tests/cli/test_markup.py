"""Ids, paths and values print as they are: no console reads rich markup or emoji codes. A
group id like `g[/]7` was a MarkupError (exit 70) in state, diff and inspect; `[red]g8`
printed as `g8`, and `:fire:` as an emoji: the wrong id in an audit."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.helpers import cli
from tests.fixtures.ledger import open_harness

ODD = ["g[/]7", "[red]g8", ":fire:"]


@pytest.fixture
def odd_ids(tmp_path: Path) -> str:
    h = open_harness(tmp_path / "run.db")
    try:
        for group_id in ODD:
            h.reserve(group_id, n=1)
            h.dispatch(group_id)
            h.seal(group_id, 0)
        h.checkpoint(1)
    finally:
        h.log.close()
    return str(h.path)


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
