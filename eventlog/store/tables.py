"""The tables as queries see them; alembic migrations (migrations/versions) create them.

This metadata and the migrated schema must agree (tests/test_schema_matches_migrations.py
compares them on SQLite and PostgreSQL), so a change here needs a migration and vice versa.
"""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

events = sa.Table(
    "events",
    metadata,
    # On SQLite only INTEGER PRIMARY KEY aliases the rowid; the writer assigns seq itself.
    sa.Column(
        "seq",
        sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
        primary_key=True,
        autoincrement=False,
    ),
    sa.Column("stream", sa.Text(), nullable=False),
    sa.Column("version", sa.BigInteger(), nullable=False),
    sa.Column("event_id", sa.LargeBinary(16), nullable=False),
    sa.Column("type", sa.Text(), nullable=False),
    sa.Column("schema", sa.Integer(), nullable=False),
    sa.Column("recorded_at", sa.BigInteger(), nullable=False),
    sa.Column("payload", sa.LargeBinary(), nullable=False),
    sa.Column("chain", sa.LargeBinary(32), nullable=False),
    # A stream's versions are dense and unique (optimistic concurrency), event ids too
    # (an append retried with the same id is recognised, not stored twice).
    sa.UniqueConstraint("stream", "version", name="uq_events_stream_version"),
    sa.UniqueConstraint("event_id", name="uq_events_event_id"),
)

log_meta = sa.Table(
    "log_meta",
    metadata,
    sa.Column("key", sa.Text(), primary_key=True),
    sa.Column("value", sa.Text(), nullable=False),
)

snapshots = sa.Table(
    "snapshots",
    metadata,
    sa.Column("name", sa.Text(), primary_key=True),
    sa.Column("seq", sa.BigInteger(), primary_key=True),
    sa.Column("created_at", sa.BigInteger(), nullable=False),
    sa.Column("payload", sa.LargeBinary(), nullable=False),
)

RECORD_COLUMNS = (
    events.c.seq,
    events.c.stream,
    events.c.version,
    events.c.event_id,
    events.c.type,
    events.c.schema,
    events.c.recorded_at,
    events.c.payload,
    events.c.chain,
)

LOG_TABLES = (*metadata.tables, "alembic_version")
"""Every table a log holds. A SQLite file holding any other table or view is another
program's database: eventlog neither adds its tables to it nor switches its journal mode.
(A PostgreSQL database is often shared: a run's tables live beside others' there.)"""
