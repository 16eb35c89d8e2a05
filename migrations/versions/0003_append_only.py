"""Append-only enforced by the database: triggers refuse UPDATE and DELETE of records.

A log is evidence; only `verify` noticed a rewrite before. Now the database itself refuses
one, on SQLite (for anyone writing the file through SQLite) and on PostgreSQL (for every
role, the owner included; TRUNCATE too). Someone who drops the trigger can still rewrite
history, which the hash chain and a kept anchor then show. Retention, if ever needed, is an
explicit, recorded operation: it drops these triggers in a migration of its own.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_MESSAGE = "eventlog: records are append-only"

_SQLITE = [
    f"""CREATE TRIGGER events_no_update BEFORE UPDATE ON events
    BEGIN SELECT RAISE(ABORT, '{_MESSAGE} (UPDATE refused)'); END""",
    f"""CREATE TRIGGER events_no_delete BEFORE DELETE ON events
    BEGIN SELECT RAISE(ABORT, '{_MESSAGE} (DELETE refused)'); END""",
]

# SQLSTATE 23000 (integrity_constraint_violation): drivers raise their IntegrityError.
_POSTGRES = [
    f"""CREATE FUNCTION eventlog_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION '{_MESSAGE} (% refused)', TG_OP
            USING ERRCODE = 'integrity_constraint_violation';
    END $$""",
    """CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION eventlog_refuse_change()""",
    """CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION eventlog_refuse_change()""",
]


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    for statement in _POSTGRES if dialect == "postgresql" else _SQLITE:
        op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER events_no_truncate ON events")
        op.execute("DROP TRIGGER events_append_only ON events")
        op.execute("DROP FUNCTION eventlog_refuse_change()")
    else:
        op.execute("DROP TRIGGER events_no_delete")
        op.execute("DROP TRIGGER events_no_update")
