"""Rollout recovery on the log: the vocabulary, the ledger, checkpoint and restore.

The public names below load on first use, so importing one module of this package (the
vocabulary, say, as `projections/` does) does not pull in the ledger and its config parser.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eventlog.recovery.barrier import Cut, MutationBarrier
    from eventlog.recovery.config import RecoveryConfig, load_config, resolve_granularity
    from eventlog.recovery.ledger import RecoveryLedger, SiblingResult
    from eventlog.recovery.outbox import AckReceiver, Outbox
    from eventlog.recovery.restore import Dataset, RestorePlan

_EXPORTS = {
    "Cut": "eventlog.recovery.barrier",
    "MutationBarrier": "eventlog.recovery.barrier",
    "RecoveryConfig": "eventlog.recovery.config",
    "load_config": "eventlog.recovery.config",
    "resolve_granularity": "eventlog.recovery.config",
    "RecoveryLedger": "eventlog.recovery.ledger",
    "SiblingResult": "eventlog.recovery.ledger",
    "AckReceiver": "eventlog.recovery.outbox",
    "Outbox": "eventlog.recovery.outbox",
    "Dataset": "eventlog.recovery.restore",
    "RestorePlan": "eventlog.recovery.restore",
}

__all__ = [
    "AckReceiver",
    "Cut",
    "Dataset",
    "MutationBarrier",
    "Outbox",
    "RecoveryConfig",
    "RecoveryLedger",
    "RestorePlan",
    "SiblingResult",
    "load_config",
    "resolve_granularity",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'eventlog.recovery' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
