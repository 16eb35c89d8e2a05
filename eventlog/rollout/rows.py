"""Training rows: what finalization writes and what the stand-in trainer reads.

Finalization joins each sealed sibling's staged calls (token ids, logprobs, loss mask) into
one canonical row keyed by the sibling's logical id, with its reward and mask_sample, in the
data plane's training partition; the staging rows can then go. A checkpoint saves that
partition too, so a restore gives the replay buffer's groups their rows back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from eventlog.dataplane.protocol import DataPlane, Row
from eventlog.recovery.config import DEFAULT_TRAINING_PARTITION
from eventlog.recovery.errors import LedgerRuleError
from eventlog.recovery.ledger import FinalizationInputs

TRAINING_PARTITION = DEFAULT_TRAINING_PARTITION
"""Where finalized groups' canonical rows wait for the train step (keys: canonical row ids)."""


@dataclass(frozen=True)
class StepReport:
    """What one train step consumed."""

    step: int
    groups: int
    rows: int
    masked_rows: int
    mean_reward: float
    """Over the rows that train (mask_sample false)."""
    trained_tokens: int


def canonical_rows(
    data_plane: DataPlane, staging_partition: str, inputs: FinalizationInputs
) -> tuple[dict[str, Row], int | None]:
    """One training row per sibling, and the oldest weight version any of its calls used.

    Raises MissingRowsError when a staging row a seal names is gone (fail closed).
    """
    keys = [k for receipt in inputs.receipts if receipt for k in receipt.staging_keys]
    staged = data_plane.read_rows(staging_partition, keys)
    rows: dict[str, Row] = {}
    weights: list[int] = []
    for row_id, receipt, reward, masked in zip(
        inputs.canonical_row_ids,
        inputs.receipts,
        inputs.rewards,
        inputs.mask_samples,
        strict=True,
    ):
        calls = [staged[k] for k in receipt.staging_keys] if receipt else []
        weights += [int(tensor(c, "weight_version").item()) for c in calls]
        rows[row_id] = {
            "token_ids": _joined(calls, "token_ids", torch.int64),
            "logprobs": _joined(calls, "logprobs", torch.float32),
            "mask": _joined(calls, "mask", torch.float32),
            "reward": torch.tensor(reward, dtype=torch.float32),
            "mask_sample": torch.tensor(masked, dtype=torch.bool),
        }
    return rows, min(weights, default=None)


def step_report(step: int, groups: int, rows: Mapping[str, Row]) -> StepReport:
    """What a train step over these canonical rows would learn from."""
    kept = [r for r in rows.values() if not bool(tensor(r, "mask_sample").item())]
    rewards = [float(tensor(r, "reward").item()) for r in kept]
    return StepReport(
        step=step,
        groups=groups,
        rows=len(rows),
        masked_rows=len(rows) - len(kept),
        mean_reward=sum(rewards) / len(rewards) if rewards else 0.0,
        trained_tokens=int(sum(tensor(r, "mask").sum().item() for r in kept)),
    )


def tensor(row: Mapping[str, object], name: str) -> torch.Tensor:
    value = row.get(name)
    if not isinstance(value, torch.Tensor):
        raise LedgerRuleError(f"row field {name!r}: expected a tensor, found {type(value)}")
    return value


def _joined(calls: Sequence[Row], name: str, dtype: torch.dtype) -> torch.Tensor:
    if not calls:
        return torch.zeros(0, dtype=dtype)
    return torch.cat([tensor(c, name).to(dtype) for c in calls])
