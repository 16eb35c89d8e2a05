"""Runs: several logs in one PostgreSQL database, each in a schema of its own.

A run is selected by name, in the target (`postgresql+psycopg://…/db?run=NAME`), with
`EventLog.open(url, run=NAME)` or with the CLI's `--run NAME` / `EVENTLOG_RUN`. Run NAME lives
in schema `run_NAME`: its own tables, alembic revision, append-only triggers, hash chain,
write lock and notification channel. Every connection of the run's store sets `search_path`
to that schema alone, so no statement can name another run's records. The log in the
database's default schema is the run `default` (a log made before runs existed is that one).

SQLite: one file per run; a run name on a SQLite target is refused.
"""

from __future__ import annotations

import hashlib
import re

import sqlalchemy as sa

from eventlog.errors import InvalidEventError

RUN_PARAM = "run"
DEFAULT_RUN = "default"
SCHEMA_PREFIX = "run_"
_NAME = re.compile(r"[a-z][a-z0-9_]{0,47}")
LOG_TABLES = frozenset({"events", "log_meta", "alembic_version"})


def check_run_name(name: str) -> str:
    """A run name: lower-case letters, digits and `_`, starting with a letter, at most 48."""
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        raise InvalidEventError(
            f"run {name!r}: a run name is 1-48 lower-case letters, digits or '_', "
            "starting with a letter"
        )
    return name


def schema_for(run: str | None) -> str | None:
    """The schema run `run` lives in; None for the default run (the database's own schema)."""
    if run is None or run == DEFAULT_RUN:
        return None
    return SCHEMA_PREFIX + check_run_name(run)


def run_for(schema: str, default_schema: str) -> str | None:
    """The run whose log lives in `schema` (None: not a run's schema)."""
    if schema == default_schema:
        return DEFAULT_RUN
    if schema.startswith(SCHEMA_PREFIX) and _NAME.fullmatch(schema[len(SCHEMA_PREFIX) :]):
        return schema[len(SCHEMA_PREFIX) :]
    return None


def split_run(url: sa.URL, run: str | None = None) -> tuple[sa.URL, str | None]:
    """The URL without its `run` parameter, and the run it (or `run`) names.

    Naming two different runs (the URL one, the argument another) is refused: which of the
    two the caller meant cannot be guessed.
    """
    given = url.query.get(RUN_PARAM)
    if isinstance(given, tuple):
        raise InvalidEventError(f"run given {len(given)} times in the target; give it once")
    if given is not None:
        url = url.difference_update_query([RUN_PARAM])
        check_run_name(given)
        if run is not None and run != given:
            raise InvalidEventError(f"run {run!r} asked for, but the target names run {given!r}")
    chosen = run if run is not None else given
    if chosen is not None:
        check_run_name(chosen)
    if chosen is not None and url.get_backend_name() != "postgresql":
        raise InvalidEventError(
            f"run {chosen!r}: runs share a PostgreSQL database; on SQLite each run is a file "
            "of its own (open that file instead)"
        )
    return url, None if chosen in (None, DEFAULT_RUN) else chosen


def with_run(target: str, run: str | None) -> str:
    """`target` with `run` named in it (a path or URL as given when `run` is None)."""
    if run is None:
        return target
    url = sa.make_url(target) if "://" in target else None
    if url is None or url.drivername.startswith("sqlite"):
        raise InvalidEventError(
            f"run {run!r}: runs share a PostgreSQL database; on SQLite each run is a file "
            "of its own (open that file instead)"
        )
    given = url.query.get(RUN_PARAM)
    if given is not None and given != run:
        raise InvalidEventError(f"run {run!r} asked for, but the target names run {given!r}")
    return url.update_query_dict({RUN_PARAM: run}).render_as_string(hide_password=False)


def lock_key(base: int, schema: str | None) -> int:
    """An advisory-lock key of the run's own (the default run keeps `base`), so runs never
    wait for one another's writers or migrations."""
    if schema is None:
        return base
    digest = hashlib.blake2b(f"{base}:{schema}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def channel_for(base: str, schema: str | None) -> str:
    """The run's notification channel (a run's `tail -f` wakes only for its own appends):
    `{base}_{schema}`, or `{base}_` and a hash of it where that passes PostgreSQL's 63-byte
    names (a run name of 42 or more letters: every append failed, "channel name too long")."""
    if schema is None:
        return base
    channel = f"{base}_{schema}"
    if len(channel.encode()) <= _NAME_BYTES:
        return channel
    return f"{base}_{hashlib.blake2b(channel.encode(), digest_size=8).hexdigest()}"


_NAME_BYTES = 63
"""The longest identifier PostgreSQL keeps whole (NAMEDATALEN - 1)."""


def find_runs(engine: sa.Engine) -> list[str]:
    """The runs whose logs the database holds (schemas with eventlog's tables), by name."""
    inspector = sa.inspect(engine)
    default_schema = inspector.default_schema_name or "public"
    found: list[str] = []
    for schema in inspector.get_schema_names():
        run = run_for(schema, default_schema)
        if run is not None and set(inspector.get_table_names(schema=schema)) >= LOG_TABLES:
            found.append(run)
    return sorted(found, key=lambda name: (name != DEFAULT_RUN, name))
