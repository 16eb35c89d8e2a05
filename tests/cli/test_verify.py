"""`eventlog verify`: the hash chain, tampering and anchors."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.cli.helpers import append_notes, cli, query, sql


@pytest.fixture
def six_records(log_file: str) -> str:
    append_notes(log_file, 3, stream="a")
    append_notes(log_file, 3, stream="b")
    return log_file


def test_verify_of_an_intact_log_prints_the_head_chain_and_exits_0(six_records: str) -> None:
    result = cli("verify", six_records)
    (chain,) = query(six_records, "SELECT chain FROM events WHERE seq = 6")[0]
    assert result.exit_code == 0
    assert result.stdout == f"ok: 6 records, head seq 6, chain {chain.hex()}\n"


def _swap_seqs(path: str) -> None:
    sql(
        path,
        "UPDATE events SET seq = -1 WHERE seq = 2",
        "UPDATE events SET seq = 2 WHERE seq = 5",
        "UPDATE events SET seq = 5 WHERE seq = -1",
    )


@pytest.mark.parametrize(
    ("tamper", "first_bad", "problem"),
    [
        (
            lambda p: sql(p, "UPDATE events SET payload = X'80' WHERE seq = 3"),
            3,
            "seq 3: chain: chain mismatch (record edited, removed or reordered)",
        ),
        (lambda p: sql(p, "DELETE FROM events WHERE seq = 3"), 3, "seq 3: gap: seq 3 missing"),
        (_swap_seqs, 2, "seq 2: chain: chain mismatch (record edited, removed or reordered)"),
    ],
    ids=["edited-payload", "deleted-row", "swapped-seqs"],
)
def test_verify_of_a_tampered_log_names_the_first_bad_seq_and_exits_1(
    six_records: str, tamper: Any, first_bad: int, problem: str
) -> None:
    tamper(six_records)
    result = cli("verify", six_records)
    assert result.exit_code == 1
    out = result.stdout.splitlines()
    assert out[0].startswith(f"FAILED: first bad seq {first_bad} (")
    assert problem in out[1:]
    report = json.loads(cli("verify", six_records, "--json").stdout)
    assert report["ok"] is False
    assert report["first_bad_seq"] == first_bad


def test_verify_with_an_anchor_catches_truncation_that_the_chain_alone_cannot(
    six_records: str,
) -> None:
    (chain,) = query(six_records, "SELECT chain FROM events WHERE seq = 6")[0]
    anchor = f"6:{chain.hex()}"
    assert cli("verify", six_records, "--anchor", anchor).exit_code == 0

    sql(six_records, "DELETE FROM events WHERE seq = 6")
    assert cli("verify", six_records).exit_code == 0  # a clean cut leaves a valid chain
    result = cli("verify", six_records, "--anchor", anchor)
    assert result.exit_code == 1
    assert "seq 6: anchor: seq 6 is gone (the log was truncated to 5)" in result.stdout.splitlines()


def test_verify_rejects_a_malformed_anchor(six_records: str) -> None:
    result = cli("verify", six_records, "--anchor", "6:xyz")
    assert result.exit_code == 2
    assert "expected SEQ:CHAIN" in result.stderr


@pytest.mark.parametrize("seq", ["\u00b2", "\u0661", "99999999999999999999", "0"])
def test_an_anchor_seq_is_ascii_digits_within_a_logs_seqs(log_file: str, seq: str) -> None:
    """'²' was exit 70 (int() refuses what isdigit() takes), '١' was read as seq 1, and a
    seq beyond any log was named as another option's value."""
    append_notes(log_file, 1)
    result = cli("verify", log_file, "--anchor", f"{seq}:{'0' * 64}")
    assert result.exit_code == 2
    assert "--anchor" in result.output and "expected SEQ:CHAIN" in result.output
