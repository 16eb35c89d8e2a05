"""An `eventsourcing` application on eventlog vs on eventsourcing's own recorders, in one run.

The same workload runs on each persistence module, on a fresh store per repeat, the modules
interleaved so background load falls on all alike:

- `open`: open N accounts (one new aggregate per save);
- `deposit`: M deposits spread over the accounts, each a repository get (snapshot plus the
  events after it; a snapshot every 10 versions) and a save;
- `follow`: a process application catches up with every notification, one atomic save of
  its new events plus its tracking record per notification;
- `reload`: a new application instance loads every account cold.

Printed and written: operations per second per phase and implementation, and the ratio
eventlog / eventsourcing on each backend (above 1: eventlog is faster).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import NAMESPACE_URL, UUID, uuid5

from eventsourcing.application import AggregateNotFoundError, Application, ProcessingEvent
from eventsourcing.domain import Aggregate, DomainEventProtocol, event
from eventsourcing.system import ProcessApplication
from rich.console import Console
from rich.table import Table

from bench.common import Results, machine, scratch
from bench.pg import PgServer, PgUnavailable, pg_server

PHASES = ("open", "deposit", "follow", "reload")
SNAPSHOT_EVERY = 10


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


class Tally(Aggregate):
    @staticmethod
    def create_id(account_id: UUID) -> UUID:
        return uuid5(NAMESPACE_URL, f"tally/{account_id}")

    @event("Started")
    def __init__(self, account_id: UUID) -> None:
        self.account_id = account_id
        self.total = 0

    @event("Counted")
    def count(self, amount: int) -> None:
        self.total += amount


class Tallies(ProcessApplication[UUID]):
    def policy(
        self, domain_event: DomainEventProtocol[UUID], processing_event: ProcessingEvent[UUID]
    ) -> None:
        if not isinstance(domain_event, Account.Deposited):
            return
        try:
            tally: Tally = self.repository.get(Tally.create_id(domain_event.originator_id))
        except AggregateNotFoundError:
            tally = Tally(account_id=domain_event.originator_id)
        tally.count(domain_event.amount)
        processing_event.collect_events(tally)


@dataclass(frozen=True)
class Impl:
    """One persistence module on one backend: how to make a fresh store's environment."""

    name: str
    backend: str
    fresh_env: Callable[[str], dict[str, str]]
    """A fresh store, named by the repeat; the environment that points an application at it."""


def sqlite_impls(work: Path) -> list[Impl]:
    def eventlog_env(tag: str) -> dict[str, str]:
        return {
            "PERSISTENCE_MODULE": "eventlog.integrations.eventsourcing",
            "EVENTLOG_URL": str(work / f"eventlog-{tag}.db"),
        }

    def peer_env(tag: str) -> dict[str, str]:
        return {
            "PERSISTENCE_MODULE": "eventsourcing.sqlite",
            "SQLITE_DBNAME": str(work / f"{tag}.db"),
        }

    return [Impl("eventlog", "sqlite", eventlog_env), Impl("eventsourcing", "sqlite", peer_env)]


def postgres_impls(server: PgServer) -> list[Impl]:
    import psycopg

    def fresh_db(tag: str) -> str:
        name = f"esapp_{tag}"
        with psycopg.connect(server.conninfo("postgres"), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name}")
            conn.execute(f"CREATE DATABASE {name}")
        return name

    def eventlog_env(tag: str) -> dict[str, str]:
        return {
            "PERSISTENCE_MODULE": "eventlog.integrations.eventsourcing",
            "EVENTLOG_URL": server.url(fresh_db(f"eventlog_{tag}")),
        }

    def peer_env(tag: str) -> dict[str, str]:
        return {
            "PERSISTENCE_MODULE": "eventsourcing.postgres",
            "POSTGRES_DBNAME": fresh_db(f"peer_{tag}"),
            "POSTGRES_HOST": server.host,
            "POSTGRES_PORT": str(server.port),
            "POSTGRES_USER": server.user,
            "POSTGRES_PASSWORD": "",
        }

    return [
        Impl("eventlog", "postgresql", eventlog_env),
        Impl("eventsourcing", "postgresql", peer_env),
    ]


@contextmanager
def _timed(seconds: dict[str, float], phase: str) -> Iterator[None]:
    started = time.perf_counter()
    yield
    seconds[phase] = time.perf_counter() - started


def run_once(env: dict[str, str], accounts: int, deposits: int) -> dict[str, float]:
    """One repeat of the workload; operations per second per phase."""
    seconds: dict[str, float] = {}
    bank = Bank(env=env)
    try:
        with _timed(seconds, "open"):
            ids = []
            for i in range(accounts):
                account = Account(f"owner-{i}")
                bank.save(account)
                ids.append(account.id)
        with _timed(seconds, "deposit"):
            for step in range(deposits):
                account = bank.repository.get(ids[step % accounts])
                account.deposit(1 + step % 7)
                bank.save(account)
        tallies = Tallies(env=env)
        try:
            tallies.follow(bank.name, bank.notification_log)
            with _timed(seconds, "follow"):
                tallies.pull_and_process(bank.name)
        finally:
            tallies.close()
    finally:
        bank.close()
    cold = Bank(env=env)
    try:
        with _timed(seconds, "reload"):
            total = sum(cold.repository.get(i).balance for i in ids)
    finally:
        cold.close()
    assert total == sum(1 + step % 7 for step in range(deposits)), "the workload lost a deposit"
    ops = {"open": accounts, "deposit": deposits, "follow": accounts + deposits, "reload": accounts}
    return {phase: ops[phase] / seconds[phase] for phase in PHASES}


def measure(
    impls: Sequence[Impl], accounts: int, deposits: int, repeats: int, console: Console
) -> list[dict[str, Any]]:
    samples: dict[str, list[dict[str, float]]] = {impl.name: [] for impl in impls}
    for repeat in range(repeats):
        for impl in impls:  # interleaved: load on the machine falls on every module alike
            rates = run_once(impl.fresh_env(f"r{repeat}"), accounts, deposits)
            samples[impl.name].append(rates)
            shown = "  ".join(f"{p} {rates[p]:>8,.0f}/s" for p in PHASES)
            console.print(f"  {impl.backend:<10} {impl.name:<13} repeat {repeat + 1}: {shown}")
    rows = []
    for impl in impls:
        for phase in PHASES:
            values = [s[phase] for s in samples[impl.name]]
            rows.append(
                {
                    "backend": impl.backend,
                    "impl": impl.name,
                    "phase": phase,
                    "ops_per_s": round(statistics.median(values), 1),
                    "ops_per_s_min": round(min(values), 1),
                    "ops_per_s_max": round(max(values), 1),
                    "repeats": len(values),
                }
            )
    return rows


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """eventlog / eventsourcing per backend and phase, on the eventlog row (>1: faster)."""
    peer = {(r["backend"], r["phase"]): r["ops_per_s"] for r in rows if r["impl"] != "eventlog"}
    for row in rows:
        base = peer.get((row["backend"], row["phase"]))
        if row["impl"] == "eventlog" and base:
            row["vs_eventsourcing"] = round(row["ops_per_s"] / base, 2)


def table(rows: Sequence[dict[str, Any]]) -> Table:
    out = Table(title="eventsourcing application: operations per second (median)")
    for column in ("backend", "impl", *PHASES):
        out.add_column(column, justify="right" if column in PHASES else "left")
    for backend in dict.fromkeys(r["backend"] for r in rows):
        for impl in dict.fromkeys(r["impl"] for r in rows if r["backend"] == backend):
            cells = []
            for phase in PHASES:
                row = next(
                    r
                    for r in rows
                    if (r["backend"], r["impl"], r["phase"]) == (backend, impl, phase)
                )
                ratio = row.get("vs_eventsourcing")
                cells.append(f"{row['ops_per_s']:,.0f}" + (f" (×{ratio})" if ratio else ""))
            out.add_row(backend, impl, *cells)
    return out


def run(
    *,
    quick: bool = False,
    repeats: int | None = None,
    scale: float | None = None,
    backends: Sequence[str] = ("sqlite", "postgresql"),
    out_dir: Path | None = None,
    workdir: Path | None = None,
    console: Console | None = None,
) -> Results:
    """Run the workload on every module and backend; print the table, write esapp.json."""
    console = console or Console()
    repeats = repeats if repeats is not None else (1 if quick else 3)
    scale = scale if scale is not None else (0.1 if quick else 1.0)
    accounts, deposits = max(2, round(100 * scale)), max(4, round(1000 * scale))
    with scratch(workdir, "eventlog-esapp-") as work:
        header = machine(work, {"repeats": repeats, "accounts": accounts, "deposits": deposits})
        results = Results("esapp", header)
        rows: list[dict[str, Any]] = []
        if "sqlite" in backends:
            console.print(f"[bold]SQLite[/] ({work}, {header['workdir_filesystem']})")
            rows += measure(sqlite_impls(work), accounts, deposits, repeats, console)
        if "postgresql" in backends:
            try:
                with pg_server() as server:
                    console.print(f"[bold]PostgreSQL[/] 127.0.0.1:{server.port}")
                    rows += measure(postgres_impls(server), accounts, deposits, repeats, console)
            except PgUnavailable as exc:
                reason = f"PostgreSQL rows skipped: {exc}"
                header["postgresql"] = {"skipped": reason}
                console.print(f"[yellow]{reason}[/]")
    add_ratios(rows)
    results.rows = rows
    console.print(table(rows))
    results.save(out_dir, console)
    return results


if __name__ == "__main__":
    run(quick=True)
