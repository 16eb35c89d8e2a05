"""Checks every data plane applies to what it is given, so the implementations agree.

Both the in-memory twin and the TransferQueue adapter call these before touching anything,
which is what makes "nothing was written" true for every rejected put.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from eventlog.dataplane.protocol import RESERVED_TAG_PREFIX, Row
from eventlog.recovery.errors import DataPlaneError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class CheckedRow:
    """One validated row of a put: its key, tensors (detached, on CPU) and tags."""

    key: str
    fields: dict[str, torch.Tensor]
    tags: dict[str, str]


def check_partition(partition: object) -> str:
    """A partition name is a non-empty str."""
    if not isinstance(partition, str) or not partition:
        raise DataPlaneError(f"partition name must be a non-empty str, found {partition!r}")
    return partition


def check_keys(partition: str, keys: Iterable[str]) -> list[str]:
    """Keys as a list without repeats, in first-seen order; each a non-empty str."""
    if isinstance(keys, str):
        raise DataPlaneError(
            f"partition {partition!r}: keys must be a sequence of str, "
            f"found the single str {keys!r}"
        )
    seen: dict[str, None] = {}
    for key in keys:
        if not isinstance(key, str) or not key:
            raise DataPlaneError(
                f"partition {partition!r}: staging key must be a non-empty str, found {key!r}"
            )
        seen.setdefault(key)
    return list(seen)


def check_rows(
    partition: str,
    rows: Mapping[str, Row],
    tags: Mapping[str, Mapping[str, str]] | None,
) -> list[CheckedRow]:
    """Validate a put whole, before anything is written; raise DataPlaneError naming the key."""
    import torch  # here, not at module level: an import of the plane must not load torch

    check_partition(partition)
    tags = tags or {}
    unknown = sorted(set(tags) - set(rows))
    if unknown:
        raise DataPlaneError(
            f"partition {partition!r}: tags given for keys that are not in the put: {unknown}"
        )
    checked: list[CheckedRow] = []
    for key, row in rows.items():
        where = f"partition {partition!r}, staging key {key!r}"
        if not isinstance(key, str) or not key:
            raise DataPlaneError(
                f"partition {partition!r}: staging key must be a non-empty str, found {key!r}"
            )
        if not isinstance(row, Mapping) or not row:
            raise DataPlaneError(f"{where}: a row must be a non-empty mapping of field -> tensor")
        fields: dict[str, torch.Tensor] = {}
        for name, value in row.items():
            if not isinstance(name, str) or not name:
                raise DataPlaneError(f"{where}: field name must be a non-empty str, found {name!r}")
            if not isinstance(value, torch.Tensor):
                raise DataPlaneError(
                    f"{where}, field {name!r}: expected a torch.Tensor, "
                    f"found {type(value).__name__}"
                )
            if value.is_nested or value.layout != torch.strided:
                raise DataPlaneError(
                    f"{where}, field {name!r}: expected a dense tensor, found layout {value.layout}"
                )
            fields[name] = value.detach().to("cpu")
        row_tags = dict(tags.get(key, {}))
        for tag, text in row_tags.items():
            if not isinstance(tag, str) or not isinstance(text, str):
                raise DataPlaneError(f"{where}: tags must be str -> str, found {tag!r}: {text!r}")
            if tag.startswith(RESERVED_TAG_PREFIX):
                raise DataPlaneError(
                    f"{where}: tag {tag!r} uses the reserved prefix {RESERVED_TAG_PREFIX!r}"
                )
        checked.append(CheckedRow(key=key, fields=fields, tags=row_tags))
    return checked
