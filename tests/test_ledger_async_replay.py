"""The asyncio forms of the replay buffer's commands and what the async ledger runs off the loop.

What is pinned: `select_async` / `consume_async` await the log's group commit and share it with
commands on groups; two replay commands take turns (one stream), and the later one decides
again on what the earlier adopted; a command waiting for a group in flight runs its body again
only once the group is free, not on every commit that lands meanwhile; an async command's
data-plane deletion runs outside the event loop's thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable
from typing import Any

import pytest

from eventlog.recovery.ledger import RecoveryLedger
from eventlog.recovery.vocabulary import REPLAY_STREAM, ReplayConsumed, RowsCleared
from tests.fixtures.ledger import Harness
from tests.test_ledger_async import in_flight_together, ready, same_as_rebuilt, seal_async


def _finalized(h: Harness, *group_ids: str) -> None:
    for gid in group_ids:
        h.reserve(gid, n=1)
        h.dispatch(gid)
        h.seal(gid, 0)
        h.finalize(gid)


def _rows(h: Harness, gid: str) -> list[str]:
    return next(list(e.canonical_row_ids) for e in h.ledger.replay.entries() if e.group_id == gid)


def test_replay_select_and_consume_async_share_commits_with_commands_on_groups(
    harness: Harness,
) -> None:
    h = harness
    _finalized(h, "g1")
    ready(h, "g2", "g3")
    rows = _rows(h, "g1")

    selected, commits = in_flight_together(
        h,
        lambda cut: h.ledger.replay.select_async(cut, ["g1"], step=1),
        seal_async(h, "g2", 0),
    )
    assert selected == [None, True]
    assert commits == 1
    assert [e.status for e in h.ledger.replay.entries()] == ["selected"]

    consumed, commits = in_flight_together(
        h,
        lambda cut: h.ledger.replay.consume_async(cut, ["g1"], step=1),
        seal_async(h, "g3", 1),
    )
    assert consumed == [["g1"], True]
    assert commits == 1
    assert h.ledger.replay.entries() == []
    cleared = [r.event for r in h.records(REPLAY_STREAM) if isinstance(r.event, RowsCleared)]
    assert [c.keys for c in cleared] == [rows]  # recorded in the consume's append ...
    assert not set(rows) & set(h.data_plane.list_keys(h.ledger.training_partition))  # deleted
    assert same_as_rebuilt(h)


def test_replay_commands_in_flight_take_turns_and_the_later_decides_again(
    harness: Harness,
) -> None:
    h = harness
    _finalized(h, "g1", "g2")
    h.run(lambda cut: h.ledger.replay.select(cut, ["g1", "g2"], step=1))

    removed, commits = in_flight_together(
        h,
        lambda cut: h.ledger.replay.consume_async(cut, ["g1", "g2"], step=1),
        lambda cut: h.ledger.replay.consume_async(cut, ["g2"], step=1),
    )

    # The second waited for the first (one replay stream) and then found g2 gone: nothing to
    # do, nothing appended (deciding on what it saw before the wait would consume g2 twice).
    assert removed == [["g1", "g2"], []]
    assert commits == 1
    consumed = [r.event for r in h.records(REPLAY_STREAM) if isinstance(r.event, ReplayConsumed)]
    assert [c.group_ids for c in consumed] == [["g1", "g2"]]
    assert same_as_rebuilt(h)


def test_a_waiting_command_runs_again_only_once_its_group_is_free(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = harness
    n = 6
    h.reserve("g1", n=n)
    h.dispatch("g1")
    for index in range(n):
        h.start_generation("g1", index)
    seals = [seal_async(h, "g1", index) for index in range(n)]
    reads = 0
    read_stream = h.log.read_stream

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal reads
        reads += 1  # a seal's body reads its attempt's stream once per run
        return read_stream(*args, **kwargs)

    monkeypatch.setattr(h.log, "read_stream", counted)

    results, commits = in_flight_together(h, *seals)

    assert results == [True] * n
    assert commits == n  # one group: one after the other
    # Each seal runs once when submitted and once more when its turn comes: n + (n - 1).
    # Running every waiting body again on each commit that lands would be n + n(n-1)/2.
    assert reads == 2 * n - 1
    assert same_as_rebuilt(h)


class _ThreadNoting:
    """A data plane that notes which thread deletes rows (everything else passes through)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.deleted_in: list[threading.Thread] = []

    def delete_rows(self, partition: str, keys: Iterable[str]) -> None:
        self.deleted_in.append(threading.current_thread())
        self.inner.delete_rows(partition, keys)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_async_finalize_discard_and_consume_delete_rows_outside_the_loop_thread(
    harness: Harness,
) -> None:
    h = harness
    _finalized(h, "g0")
    h.run(lambda cut: h.ledger.replay.select(cut, ["g0"], step=1))
    for gid in ("g1", "g2"):
        h.reserve(gid, n=1)
        h.dispatch(gid)
        h.seal(gid, 0)
    h.run(lambda cut: h.ledger.start_finalization(cut, "g1", owner="f"))
    h.put_canonical_rows("g1")
    noting = _ThreadNoting(h.data_plane)
    ledger = RecoveryLedger.open(h.log, noting)  # the same log, deleting through `noting`

    async def main() -> threading.Thread:
        async with h.barrier.mutation("test") as cut:
            await ledger.finalize_async(cut, "g1", owner="f", min_weight_version=0)
            await ledger.discard_async(cut, "g2", reason="test")
            await ledger.replay.consume_async(cut, ["g0"], step=1)
        return threading.current_thread()

    loop_thread = asyncio.run(main())

    assert len(noting.deleted_in) == 3  # staging rows of g1 and g2, canonical rows of g0
    assert all(t is not loop_thread for t in noting.deleted_in)
