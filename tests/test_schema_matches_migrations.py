"""The migrations and `eventlog.store.tables` describe one schema, on every backend.

Queries are built from the metadata; the database is built by the migrations. Were they to
drift apart (a constraint only one of them has, a column of another type), a query could
rely on something the real schema lacks. Alembic's own autogenerate comparison reports any
difference in tables, columns, types, nullability, indexes and unique constraints; triggers
(migration 0003) are not part of the metadata, so it does not look at them.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from eventlog.log import resolve_url
from eventlog.store import migrate, tables

ALEMBIC_OWN_TABLE = "alembic_version"


def _schema_differences(target: str, metadata: sa.MetaData) -> list[Any]:
    engine = sa.create_engine(resolve_url(target))
    try:
        migrate.upgrade(engine)
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn,
                opts={
                    "compare_type": True,
                    "include_name": lambda name, kind, _parent: (
                        not (kind == "table" and name == ALEMBIC_OWN_TABLE)
                    ),
                },
            )
            return list(compare_metadata(context, metadata))
    finally:
        engine.dispose()


def test_migrated_schema_matches_the_metadata_queries_are_built_from(log_target: str) -> None:
    assert _schema_differences(log_target, tables.metadata) == []


def test_the_comparison_notices_a_unique_constraint_the_metadata_lacks(log_target: str) -> None:
    """Guards the guard: a copy of the metadata without one unique constraint differs."""
    copy = sa.MetaData()
    for table in tables.metadata.tables.values():
        table.to_metadata(copy)
    events = copy.tables["events"]
    events.constraints = {
        c
        for c in events.constraints
        if not (isinstance(c, sa.UniqueConstraint) and c.name == "uq_events_event_id")
    }
    differences = _schema_differences(log_target, copy)
    assert [d[0] for d in differences] == ["remove_constraint"], differences
    assert differences[0][1].name == "uq_events_event_id"


def test_the_head_revision_known_without_alembic_is_the_scripts_head() -> None:
    """A log at HEAD_REVISION is opened without loading alembic: it must be alembic's head."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory(str(migrate.migrations_dir())).get_current_head()
    assert head == migrate.HEAD_REVISION
