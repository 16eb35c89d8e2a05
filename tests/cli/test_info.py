"""`eventlog info`: id, revision, head and chain."""

from __future__ import annotations

import json

from tests.cli.helpers import HEAD_REVISION, ISO_NS, append_notes, cli, query, sql


def test_info_reports_id_revision_head_and_chain(log_file: str) -> None:
    append_notes(log_file, 3)
    shown = json.loads(cli("info", log_file, "--json").stdout)
    seq, chain = query(log_file, "SELECT seq, chain FROM events ORDER BY seq DESC LIMIT 1")[0]
    (log_id,) = query(log_file, "SELECT value FROM log_meta WHERE key = 'log_id'")[0]
    assert shown["log_id"] == log_id
    assert shown["revision"] == HEAD_REVISION
    assert shown["backend"] == "sqlite"
    assert shown["hash_algorithm"] == "sha256"
    assert (shown["head"], shown["chain"]) == (seq, chain.hex()) == (3, chain.hex())
    assert ISO_NS.match(shown["created"])
    human = cli("info", log_file).stdout
    assert f"chain:          {chain.hex()}" in human.splitlines()


def test_an_edited_creation_time_is_shown_as_it_is_stored(log_file: str) -> None:
    """The meta table is text: '²' or a number past any time was exit 70, and '٣' was
    read as 3 ns past 1970."""
    for stored in ("\u00b2", "99999999999999999999999", "\u0663"):
        sql(log_file, f"UPDATE log_meta SET value = '{stored}' WHERE key = 'created_at_ns'")
        result = cli("info", log_file, "--json")
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout)["created"] == repr(stored)
