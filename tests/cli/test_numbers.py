"""Numbers on the command line are ASCII digits: `int()` reads '٣' (Arabic-Indic three) as
3, so `diff RUN ٣ head` compared seq 3, and `tail -n ٣` printed three records."""

from __future__ import annotations

import pytest

from eventlog.cli.numbers import whole_number
from tests.cli.audited_run import AuditedRun
from tests.cli.helpers import cli

THREE = "\u0663"  # ٣


@pytest.mark.parametrize(
    ("text", "number"),
    [("3", 3), ("-2", -2), ("0", 0), ("9" * 40, int("9" * 40))],
)
def test_ascii_digits_are_a_number(text: str, number: int) -> None:
    assert whole_number(text) == number


@pytest.mark.parametrize(
    "text", [THREE, "\u00b2", "1_000", " 7", "7 ", "+3", "", "-", "3.0", "9" * 41]
)
def test_anything_else_is_not(text: str) -> None:
    assert whole_number(text) is None


@pytest.mark.parametrize(
    "args",
    [
        ["tail", "{log}", "-n", THREE],
        ["replay", "{log}", "--from-seq", THREE],
        ["replay", "{log}", "--until-seq", THREE],
        ["replay", "{log}", "--json", "--jobs", THREE],
        ["replay", "{log}", "--step", THREE],
        ["state", "{log}", "--at", THREE],
        ["state", "{log}", "--step", THREE],
        ["inspect", "step", "{log}", THREE],
        ["diff", "{log}", THREE, "head"],
        ["diff", "{log}", f"step:{THREE}", "head"],
        ["verify", "{log}", "--anchor", f"{THREE}:{'0' * 64}"],
        ["report", "{log}", "-o", "{out}", "--jobs", THREE],
    ],
    ids=lambda args: "-".join(a for a in args if a not in {"{log}", "{out}"}),
)
def test_a_number_in_other_digits_is_refused_naming_it(
    run: AuditedRun, args: list[str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    out = str(tmp_path_factory.mktemp("out") / "r.html")
    result = cli(*(a.format(log=run.path, out=out) for a in args))
    assert result.exit_code == 2, result.output
    assert THREE in result.output or repr(THREE)[1:-1] in result.output
