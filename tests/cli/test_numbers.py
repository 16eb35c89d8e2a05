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
    [
        ("3", 3),
        ("-2", -2),
        ("0", 0),
        ("007", 7),
        ("9" * 41, int("9" * 41)),
        ("-" + "9" * 4000, -int("9" * 4000)),
    ],
)
def test_ascii_digits_are_a_number(text: str, number: int) -> None:
    assert whole_number(text) == number


@pytest.mark.parametrize(
    "text", [THREE, "\u00b2", "1_000", " 7", "7 ", "+3", "", "-", "3.0", "9" * 4001]
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
        ["state", "{log}", "--checkpoint", THREE],
        ["inspect", "step", "{log}", THREE],
        ["diff", "{log}", THREE, "head"],
        ["diff", "{log}", f"step:{THREE}", "head"],
        ["diff", "{log}", "head", f"checkpoint:{THREE}"],
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


def test_a_long_number_is_taken_and_one_too_long_for_int_is_named_so(audit_log: str) -> None:
    """A 41-digit count was refused as "not a whole number" (a 40-digit cap)."""
    assert cli("tail", audit_log, "-n", "0" * 40 + "1").stdout.split()[0] == "7"
    assert len(cli("tail", audit_log, "-n", "9" * 41).stdout.splitlines()) == 7
    refused = cli("tail", audit_log, "-n", "9" * 4001)
    assert refused.exit_code == 2 and "99999999999999999999... has more than 4000 digits" in (
        refused.output
    )


def test_an_unbounded_number_option_shows_no_range_in_its_help() -> None:
    """An IntRange without bounds printed `[x<=None]`."""
    shown = cli("state", "--help").output
    assert "--at SEQ" in shown and "None" not in shown


def test_a_bounded_number_option_is_an_integer_in_its_help() -> None:
    """The bounds are shown beside the default; click's own name said `INTEGER RANGE`."""
    shown = cli("tail", "--help").output
    assert "-n, --lines INTEGER " in shown and "RANGE" not in shown and "x>=0" in shown


def test_the_demo_s_counts_are_ascii_digits_too() -> None:
    refused = cli("demo", "--groups", THREE)
    assert refused.exit_code == 2 and "is not a whole number written in ASCII digits" in (
        refused.output
    )
