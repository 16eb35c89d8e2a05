"""Hypothesis strategies built from msgspec's own type information, constraints included.

`st.from_type` ignores msgspec.Meta constraints (min_length, ge, …), and msgspec only checks
them when decoding; building from `msgspec.inspect` keeps generated events valid by the same
rules the codec enforces.
"""

from __future__ import annotations

from typing import Any

import msgspec
import msgspec.inspect as mi
from hypothesis import strategies as st

_INT64 = (-(2**63), 2**63 - 1)


def for_type(info: mi.Type) -> st.SearchStrategy[Any]:
    """A strategy producing Python values that msgspec accepts as `info`."""
    if isinstance(info, mi.StructType):
        fields = {f.name: for_type(f.type) for f in info.fields}
        required = {f.name for f in info.fields if f.required}
        optional = {k: v for k, v in fields.items() if k not in required}
        return st.fixed_dictionaries(
            {k: v for k, v in fields.items() if k in required}, optional=optional
        ).map(lambda kwargs: info.cls(**kwargs))
    if isinstance(info, mi.StrType):
        return st.text(min_size=info.min_length or 0, max_size=info.max_length or 20)
    if isinstance(info, mi.BoolType):
        return st.booleans()
    if isinstance(info, mi.IntType):
        low = (
            info.ge if info.ge is not None else (info.gt + 1 if info.gt is not None else _INT64[0])
        )
        high = (
            info.le if info.le is not None else (info.lt - 1 if info.lt is not None else _INT64[1])
        )
        return st.integers(low, high)
    if isinstance(info, mi.FloatType):
        return st.floats(
            min_value=info.ge if info.ge is not None else info.gt,
            max_value=info.le if info.le is not None else info.lt,
            exclude_min=info.gt is not None,
            exclude_max=info.lt is not None,
            allow_nan=False,
        )
    if isinstance(info, mi.NoneType):
        return st.none()
    if isinstance(info, mi.LiteralType):
        return st.sampled_from(info.values)
    if isinstance(info, mi.EnumType):
        return st.sampled_from(list(info.cls))
    if isinstance(info, mi.UnionType):
        return st.one_of(*(for_type(t) for t in info.types))
    if isinstance(info, (mi.ListType, mi.SetType, mi.FrozenSetType, mi.VarTupleType)):
        items = st.lists(
            for_type(info.item_type), min_size=info.min_length or 0, max_size=info.max_length or 4
        )
        kind = {mi.ListType: list, mi.SetType: set, mi.FrozenSetType: frozenset}.get(
            type(info), tuple
        )
        return items.map(kind)
    if isinstance(info, mi.TupleType):
        return st.tuples(*(for_type(t) for t in info.item_types))
    if isinstance(info, mi.DictType):
        return st.dictionaries(
            for_type(info.key_type),
            for_type(info.value_type),
            min_size=info.min_length or 0,
            max_size=info.max_length or 4,
        )
    if isinstance(info, mi.BytesType):
        return st.binary(max_size=32)
    if isinstance(info, mi.UUIDType):
        return st.uuids()
    if isinstance(info, mi.AnyType):
        return st.none() | st.integers(-100, 100) | st.text(max_size=5)
    raise NotImplementedError(f"no strategy for {info!r}")


def events_of(cls: type[msgspec.Struct]) -> st.SearchStrategy[Any]:
    """Valid instances of an event class."""
    return for_type(mi.type_info(cls))
