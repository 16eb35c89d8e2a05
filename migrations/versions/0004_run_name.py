"""Runs: the log records the name of the run it belongs to (log_meta key `run`).

Several runs may share one PostgreSQL database, each in a schema of its own (`run_NAME`,
see eventlog.store.runs); the log in the database's default schema, and every SQLite file,
is the run `default`. Upgrading a log made before runs existed makes it that run. The name
travels with the log, so a run restored into another database still says which it is.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_META = sa.table("log_meta", sa.column("key", sa.Text()), sa.column("value", sa.Text()))


def _run_name() -> str:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return "default"
    schema = bind.exec_driver_sql("SELECT current_schema()").scalar()
    if isinstance(schema, str) and schema.startswith("run_"):
        return schema[len("run_") :]
    return "default"


def upgrade() -> None:
    op.bulk_insert(_META, [{"key": "run", "value": _run_name()}])


def downgrade() -> None:
    op.execute(_META.delete().where(_META.c.key == "run"))
