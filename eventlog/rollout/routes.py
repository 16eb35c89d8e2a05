"""Where a rollout worker's attempt events go when it runs away from the controller.

`EventRoute` names the two ways (see `eventlog.rollout.actor`); `check_route` refuses a route
the log cannot serve; `ChosenIds` makes an append safe to retry. Nothing here imports Ray.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from collections.abc import Sequence
from typing import Literal

from eventlog.errors import StorageUnavailableError
from eventlog.log import resolve_url
from eventlog.records import AppendRequest, AppendResult, Proposed
from eventlog.recovery.errors import ConfigError
from eventlog.rollout.worker import AttemptLog

logger = logging.getLogger(__name__)

EventRoute = Literal["direct", "forwarded"]
ROUTES: tuple[EventRoute, ...] = ("direct", "forwarded")

_RETRIES = 3
"""Appends retried after StorageUnavailableError (outcome unknown) before giving up."""


def check_route(route: str, log_target: str | None) -> EventRoute:
    """The route, if it fits the log: ``direct`` needs a log every host reaches (PostgreSQL)."""
    if route not in ROUTES:
        raise ConfigError(f"rollout.route: expected one of {list(ROUTES)}, found {route!r}")
    if route == "direct":
        if log_target is None:
            raise ConfigError("rollout.route: 'direct' needs the log's URL, found none")
        if resolve_url(log_target).get_backend_name() != "postgresql":
            raise ConfigError(
                f"rollout.route: 'direct' needs a log every host reaches (a PostgreSQL URL), "
                f"found {resolve_url(log_target).get_backend_name()} log {log_target!r}",
                hint="use route 'forwarded' (the controller appends) or a postgresql+psycopg URL",
            )
        return "direct"
    return "forwarded"


class ChosenIds:
    """Gives every event an id chosen here and retries an append whose outcome is unknown.

    The retry repeats the very same ids, so if the first try committed and only its reply was
    lost, the log answers with the original result instead of appending again.
    """

    def __init__(self, log: AttemptLog, retries: int = _RETRIES) -> None:
        self.log = log
        self.retries = retries

    async def append_batch_async(self, requests: Sequence[AppendRequest]) -> list[AppendResult]:
        chosen = [
            AppendRequest(
                r.stream,
                [e if isinstance(e, Proposed) else Proposed(e, uuid.uuid4()) for e in r.events],
                r.expected_version,
            )
            for r in requests
        ]
        for attempt in itertools.count():
            try:
                return await self.log.append_batch_async(chosen)
            except StorageUnavailableError:
                if attempt >= self.retries:
                    raise
                logger.warning("append outcome unknown; retrying with the same event ids")
                await asyncio.sleep(0.05 * 2**attempt)
        raise AssertionError("unreachable")
