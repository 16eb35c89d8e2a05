"""Alembic environment and versions; installed as `eventlog._migrations`."""
