"""`eventlog resolve-finalization`: a finalization_unknown group settled by the canonical rows
of the run's real TransferQueue; a refused resolution is one line and appends nothing."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

from eventlog import EventLog
from eventlog.dataplane.memory import InMemoryDataPlane
from eventlog.dataplane.protocol import DataPlane
from eventlog.recovery.ledger import RecoveryLedger
from eventlog.recovery.vocabulary import FinalizationRetryable, GroupFinalized, group_stream
from tests.cli.helpers import EVENTLOG, cli
from tests.fixtures.ledger import Harness

if TYPE_CHECKING:
    from eventlog.dataplane.transferqueue import TransferQueueDataPlane


def _harness(path: Path, plane: DataPlane) -> Harness:
    log = EventLog.open(path)
    return Harness(
        path=path,
        log=log,
        data_plane=plane,  # type: ignore[arg-type]  # any data plane: the harness only puts rows
        ledger=RecoveryLedger.open(log, plane),
    )


def _unknown(h: Harness, *group_ids: str) -> None:
    for gid in group_ids:
        h.reserve(gid, n=2)
        h.dispatch(gid)
        h.seal(gid, 0)
        h.seal(gid, 1)
        h.run(partial(h.ledger.start_finalization, group_id=gid, owner="f"))
        h.run(partial(h.ledger.mark_finalization_unknown, group_id=gid, owner="f", error="timeout"))


@pytest.fixture
def unknown_run(tmp_path: Path) -> Iterator[Path]:
    h = _harness(tmp_path / "run.db", InMemoryDataPlane())
    _unknown(h, "g1")
    h.reserve("g2", n=1)
    h.log.close()
    yield h.path


def test_a_group_that_is_not_unknown_is_refused_in_one_line_and_nothing_is_appended(
    unknown_run: Path,
) -> None:
    before = unknown_run.read_bytes()
    for group, message in (
        ("g2", "error: group 'g2': is generating, not finalization_unknown"),
        ("nope", "error: group 'nope': not in the ledger"),
    ):
        result = cli("resolve-finalization", str(unknown_run), group)
        assert result.exit_code == 5, result.output
        assert result.output.splitlines()[0].startswith(message)
        assert "Traceback" not in result.output
    assert unknown_run.read_bytes() == before


def test_without_a_ray_cluster_to_join_it_says_so_and_appends_nothing(unknown_run: Path) -> None:
    before = unknown_run.read_bytes()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run(
        [str(EVENTLOG), "resolve-finalization", str(unknown_run), "g1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: no Ray cluster to join: pass --ray-address")
    assert "Traceback" not in done.stderr
    assert unknown_run.read_bytes() == before


@pytest.mark.parametrize("address", ["127.0.0.1:1", "127.0.0.1:99999", "nohost.invalid:6379"])
def test_a_ray_address_where_nothing_answers_is_one_line_not_a_wait_for_good(
    unknown_run: Path, address: str
) -> None:
    before = unknown_run.read_bytes()
    done = subprocess.run(
        [str(EVENTLOG), "resolve-finalization", str(unknown_run), "g1", "--ray-address", address],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 5, done.stderr
    assert done.stderr.startswith(
        f"error: cannot join the Ray cluster at {address!r}: nothing answers there ("
    )
    assert "Traceback" not in done.stderr
    assert unknown_run.read_bytes() == before


@pytest.mark.slow
@pytest.mark.tq
def test_resolving_by_the_canonical_rows_in_the_real_transferqueue(
    tmp_path: Path, tq_data_plane: TransferQueueDataPlane
) -> None:
    h = _harness(tmp_path / "run.db", tq_data_plane)
    _unknown(h, "done", "lost")
    h.put_canonical_rows("done")
    written = h.ledger.group("lost").canonical_row_ids()[:1]  # half written before the failure
    h.data_plane.put_rows("training", {written[0]: {"token_ids": torch.arange(2)}})
    h.log.close()
    path = str(h.path)

    outcomes = {}
    for gid in ("done", "lost"):
        result = cli("resolve-finalization", path, gid, "--json")
        assert result.exit_code == 0, result.output
        outcomes[gid] = json.loads(result.output)["outcome"]
    assert outcomes == {"done": "finalized", "lost": "retryable"}
    with EventLog.open(path) as log:
        done = [r.event for r in log.read_stream(group_stream("done"))]
        lost = [r.event for r in log.read_stream(group_stream("lost"))]
    assert isinstance(done[-1], GroupFinalized) and done[-1].owner == "f"
    assert done[-1].staging_cleared  # its sealed attempts' staging rows, in the same record
    assert isinstance(lost[-1], FinalizationRetryable)
    assert lost[-1].canonical_rows_cleared == written
    assert sorted(tq_data_plane.list_keys("training")) == ["done_g0", "done_g1"]
