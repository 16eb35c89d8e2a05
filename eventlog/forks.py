"""What a child of fork inherits from its parent's open logs.

The child has none of the parent's threads, and its copies of the parent's connections must
be neither used (SQLite forbids it: the file's locks belong to the parent) nor closed (a
PostgreSQL connection's close would end the parent's session). Each open log's parts start
afresh in the child (`after_fork_in_child`), opening connections of their own as needed, and
the inherited ones are kept here, untouched, for the rest of the process.
"""

from __future__ import annotations

import functools
import os
import weakref
from collections.abc import Iterable
from typing import NoReturn, Protocol

from sqlalchemy import Engine, NullPool

from eventlog.errors import EventLogError


class Inheritable(Protocol):
    def after_fork_in_child(self) -> None: ...


_live: weakref.WeakSet[Inheritable] = weakref.WeakSet()
_kept: list[object] = []


def watch(part: Inheritable) -> None:
    """Call `part.after_fork_in_child()` in every child forked while `part` lives."""
    _live.add(part)


def keep(*inherited: object) -> None:
    """Keep what the parent left (connections, pools) alive and unused in this process."""
    _kept.extend(item for item in inherited if item is not None)


def abandon_pools(engines: Iterable[Engine], refusal: EventLogError | None = None) -> None:
    """Give each engine a new, empty pool; the parent's connections stay in the old one.
    With `refusal`, the new pool connects to nothing: every use raises it."""
    for engine in engines:
        keep(engine.pool)
        if refusal is None:
            engine.dispose(close=False)
        else:
            engine.pool = NullPool(creator=functools.partial(_refuse, refusal))


def _refuse(refusal: EventLogError) -> NoReturn:
    raise refusal


def _forked() -> None:
    for part in list(_live):
        part.after_fork_in_child()


os.register_at_fork(after_in_child=_forked)
