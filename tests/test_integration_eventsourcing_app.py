"""An `eventsourcing` application end to end on eventlog: save, reload, snapshots, a process
application that follows it exactly once, a SIGKILLed writer, and `eventlog verify` after."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from uuid import NAMESPACE_URL, UUID, uuid5

import pytest
from click.testing import CliRunner
from eventsourcing.application import AggregateNotFoundError, Application, ProcessingEvent
from eventsourcing.domain import Aggregate, DomainEventProtocol, event
from eventsourcing.persistence import IntegrityError, Tracking
from eventsourcing.system import ProcessApplication

from eventlog import EventLog
from eventlog.cli.main import main as cli

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOT_EVERY = 5


class Account(Aggregate):
    class Deposited(Aggregate.Event):
        amount: int

    @event("Opened")
    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.balance = 0

    @event(Deposited)
    def deposit(self, amount: int) -> None:
        self.balance += amount


class Bank(Application[UUID]):
    snapshotting_intervals = {Account: SNAPSHOT_EVERY}  # noqa: RUF012 - eventsourcing's API

    def open_account(self, owner: str) -> UUID:
        account = Account(owner)
        self.save(account)
        return account.id

    def deposit(self, account_id: UUID, amount: int) -> int:
        account: Account = self.repository.get(account_id)
        account.deposit(amount)
        self.save(account)
        return account.balance


class Tally(Aggregate):
    """What the process application keeps per account: deposits seen and their sum."""

    @staticmethod
    def create_id(account_id: UUID) -> UUID:
        return uuid5(NAMESPACE_URL, f"tally/{account_id}")

    @event("Started")
    def __init__(self, account_id: UUID) -> None:
        self.account_id = account_id
        self.count = 0
        self.total = 0

    @event("Counted")
    def count_deposit(self, amount: int) -> None:
        self.count += 1
        self.total += amount


class Tallies(ProcessApplication[UUID]):
    def policy(
        self, domain_event: DomainEventProtocol[UUID], processing_event: ProcessingEvent[UUID]
    ) -> None:
        if not isinstance(domain_event, Account.Deposited):
            return
        account_id = domain_event.originator_id
        try:
            tally: Tally = self.repository.get(Tally.create_id(account_id))
        except AggregateNotFoundError:
            tally = Tally(account_id=account_id)
        tally.count_deposit(domain_event.amount)
        processing_event.collect_events(tally)


class SlowTallies(Tallies):
    """Tallies that take a while per notification and stop before the last, so a kill lands
    mid-way however long the test takes to see the first ones tracked."""

    name = "Tallies"
    STOP_AFTER = 15
    processed = 0

    def policy(
        self, domain_event: DomainEventProtocol[UUID], processing_event: ProcessingEvent[UUID]
    ) -> None:
        SlowTallies.processed += 1
        time.sleep(0.02 if SlowTallies.processed <= self.STOP_AFTER else 3600)
        super().policy(domain_event, processing_event)


def _env(target: str) -> dict[str, str]:
    return {"PERSISTENCE_MODULE": "eventlog.integrations.eventsourcing", "EVENTLOG_URL": target}


def bank_child() -> None:
    """The writer the test kills: opens accounts, then deposits 1 forever, one save each."""
    bank = Bank(env=_env(os.environ["EVENTLOG_URL"]))
    accounts = [bank.open_account(f"owner-{i}") for i in range(3)]
    for account_id in accounts:
        print("opened", account_id, flush=True)
    step = 0
    while True:
        account_id = accounts[step % len(accounts)]
        balance = bank.deposit(account_id, 1)
        print("saved", account_id, balance, flush=True)
        step += 1


def tallies_child() -> None:
    """The follower the test kills: processes the bank's notifications one save at a time."""
    env = _env(os.environ["EVENTLOG_URL"])
    bank = Bank(env=env)
    tallies = SlowTallies(env=env)
    tallies.follow(bank.name, bank.notification_log)
    tallies.pull_and_process(bank.name)


def _kill_follower_mid_way(target: str, after: int) -> int:
    """Start the follower, SIGKILL it once it tracked `after` notifications; how many it had."""
    code = "from tests.test_integration_eventsourcing_app import tallies_child; tallies_child()"
    env = {**os.environ, "EVENTLOG_URL": target, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env)
    stream = "es/Tallies/tracking/Bank"
    try:
        with EventLog.open(target) as log:
            deadline = time.monotonic() + 60
            while (log.stream_version(stream) or 0) + 1 < after:
                assert proc.poll() is None, "the follower exited before it was killed"
                assert time.monotonic() < deadline, "the follower tracked nothing in 60 s"
                time.sleep(0.01)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            version = log.stream_version(stream)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    return 0 if version is None else version + 1


def _run_and_kill(target: str, saves: int) -> dict[UUID, int]:
    """Start the writer, SIGKILL it after `saves` saves; the balances it reported."""
    code = "from tests.test_integration_eventsourcing_app import bank_child; bank_child()"
    env = {**os.environ, "EVENTLOG_URL": target, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
    )
    reported: dict[UUID, int] = {}
    seen = 0
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            kind, account, *rest = line.split()
            reported[UUID(account)] = int(rest[0]) if kind == "saved" else 0
            seen += kind == "saved"
            if seen >= saves:
                break
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert seen >= saves, "the writer stopped before it was killed"
    return reported


def test_application_survives_a_killed_writer_and_a_process_application_counts_once(
    log_target: str,
) -> None:
    reported = _run_and_kill(log_target, saves=3 * SNAPSHOT_EVERY + 4)

    # Every save the killed writer reported is there; at most its next one landed too.
    bank = Bank(env=_env(log_target))
    try:
        for account_id, balance in reported.items():
            account: Account = bank.repository.get(account_id)
            assert account.balance in (balance, balance + 1)
            assert bank.snapshots is not None
            snapshots = list(bank.snapshots.get(account_id, desc=True, limit=1))
            assert snapshots, "snapshotting_intervals took no snapshot"
            assert snapshots[0].originator_version % SNAPSHOT_EVERY == 0
            # The snapshot and the events after it give the same state as every event.
            assert bank.repository.get(account_id, version=account.version).balance == (
                account.balance
            )
        first = next(iter(reported))
        before: int = bank.repository.get(first).balance
        assert bank.deposit(first, 10) == before + 10
        deposits: dict[UUID, int] = {aid: bank.repository.get(aid).balance for aid in reported}
        deposit_events = sum(
            1
            for n in bank.recorder.select_notifications(start=None, limit=10_000)
            if n.topic.endswith("Account.Deposited")
        )

        # A follower killed mid-way leaves whole steps: events and tracking record together.
        tracked = _kill_follower_mid_way(log_target, after=5)
        assert 5 <= tracked < deposit_events + len(reported)

        # The process application follows the bank: each deposit counted once.
        tallies = Tallies(env=_env(log_target))
        tallies.follow(bank.name, bank.notification_log)
        tallies.pull_and_process(bank.name)
        _assert_tallies(tallies, deposits, deposit_events)
        last = tallies.recorder.max_tracking_id(bank.name)
        assert last == bank.recorder.max_notification_id()
        tallies.close()

        # A restarted follower resumes from its tracking record and counts nothing twice.
        again = Tallies(env=_env(log_target))
        again.follow(bank.name, bank.notification_log)
        again.pull_and_process(bank.name)
        _assert_tallies(again, deposits, deposit_events)
        # Processing a notification again is refused, with nothing appended.
        recorder = again.recorder
        assert last is not None
        with EventLog.open(log_target) as log:
            head = log.head()
        with pytest.raises(IntegrityError):
            recorder.insert_events([], tracking=Tracking(bank.name, last))
        with EventLog.open(log_target) as log:
            assert log.head() == head
        again.close()
    finally:
        bank.close()

    result = CliRunner().invoke(cli, ["verify", log_target])
    assert result.exit_code == 0, result.output


def _assert_tallies(tallies: Tallies, deposits: dict[UUID, int], deposit_events: int) -> None:
    counted = 0
    for account_id, balance in deposits.items():
        tally: Any = tallies.repository.get(Tally.create_id(account_id))
        assert tally.total == balance
        counted += tally.count
    assert counted == deposit_events
