"""Create the log: the events table and the log's own metadata.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import time
import uuid

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# On SQLite only INTEGER PRIMARY KEY aliases the rowid (no second B-tree for seq).
_SEQ = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column("seq", _SEQ, primary_key=True, autoincrement=False),
        sa.Column("stream", sa.Text(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("event_id", sa.LargeBinary(16), nullable=False),
        sa.Column("type", sa.Text(), nullable=False),
        sa.Column("schema", sa.Integer(), nullable=False),
        sa.Column("recorded_at", sa.BigInteger(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column("chain", sa.LargeBinary(32), nullable=False),
        sa.UniqueConstraint("stream", "version", name="uq_events_stream_version"),
        sa.UniqueConstraint("event_id", name="uq_events_event_id"),
    )
    meta = op.create_table(
        "log_meta",
        sa.Column("key", sa.Text(), primary_key=True),
        sa.Column("value", sa.Text(), nullable=False),
    )
    op.bulk_insert(
        meta,
        [
            {"key": "log_id", "value": str(uuid.uuid4())},
            {"key": "created_at_ns", "value": str(time.time_ns())},
            {"key": "hash_algorithm", "value": "sha256"},
        ],
    )


def downgrade() -> None:
    op.drop_table("log_meta")
    op.drop_table("events")
