"""The data-plane contract, run against the in-memory twin and a real TransferQueue.

Rows are what a rollout worker stages: token ids (int64, a different length per row),
logprobs (float32), a loss mask (bool) and a scalar reward (0-d float32).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
import torch

from eventlog.dataplane.protocol import DataPlane, Row, inventory_digest
from eventlog.recovery.errors import DataPlaneError, MissingRowsError
from tests.fixtures.tq import ClearableDataPlane


def staged_row(length: int, seed: int) -> dict[str, torch.Tensor]:
    """One staged call: deterministic tensors of `length` tokens."""
    gen = torch.Generator().manual_seed(seed)
    return {
        "token_ids": torch.randint(0, 50_000, (length,), generator=gen, dtype=torch.int64),
        "logprobs": -torch.rand(length, generator=gen, dtype=torch.float32),
        "mask": torch.rand(length, generator=gen) > 0.3,
        "reward": torch.tensor(float(seed) / 7.0, dtype=torch.float32),
    }


def assert_same_row(found: Row, expected: Mapping[str, torch.Tensor], key: str) -> None:
    assert sorted(found) == sorted(expected), key
    for name, tensor in expected.items():
        value = found[name]
        assert isinstance(value, torch.Tensor), (key, name)
        assert value.dtype == tensor.dtype, (key, name)
        assert value.shape == tensor.shape, (key, name)
        assert torch.equal(value, tensor), (key, name)


def assert_plane_holds(
    plane: DataPlane, partition: str, rows: Mapping[str, Mapping[str, torch.Tensor]]
) -> None:
    assert sorted(plane.list_keys(partition)) == sorted(rows)
    found = plane.read_rows(partition, list(rows))
    assert list(found) == list(rows)
    for key, expected in rows.items():
        assert_same_row(found[key], expected, key)


def test_put_then_read_round_trips_each_row_with_its_own_dtypes_and_lengths(
    data_plane: ClearableDataPlane, partition_name: str
) -> None:
    rows = {f"g1_g{i}/call0": staged_row(length, seed=i) for i, length in enumerate([5, 1, 17, 3])}
    data_plane.put_rows(partition_name, rows)
    assert_plane_holds(data_plane, partition_name, rows)


def test_read_returns_exactly_the_requested_keys_in_request_order(
    data_plane: ClearableDataPlane, partition_name: str
) -> None:
    rows = {f"k{i}": staged_row(2 + i, seed=i) for i in range(6)}
    data_plane.put_rows(partition_name, rows)
    wanted = ["k4", "k0", "k5", "k0"]
    found = data_plane.read_rows(partition_name, wanted)
    assert list(found) == ["k4", "k0", "k5"]
    for key in found:
        assert_same_row(found[key], rows[key], key)


def test_rows_of_equal_length_and_empty_rows_round_trip(
    data_plane: ClearableDataPlane, partition_name: str
) -> None:
    rows = {"a": staged_row(4, seed=1), "b": staged_row(4, seed=2), "empty": staged_row(0, 3)}
    data_plane.put_rows(partition_name, rows)
    assert_plane_holds(data_plane, partition_name, rows)


def test_rows_with_different_fields_can_be_read_together(
    data_plane: ClearableDataPlane, partition_name: str
) -> None:
    full = staged_row(6, seed=1)
    ids_only = {"token_ids": torch.arange(3, dtype=torch.int64)}
    matrix = {"hidden": torch.ones(2, 3, dtype=torch.float16), "token_ids": torch.arange(2)}
    data_plane.put_rows(partition_name, {"full": full})
    data_plane.put_rows(partition_name, {"ids_only": ids_only, "matrix": matrix})
    found = data_plane.read_rows(partition_name, ["ids_only", "full", "matrix"])
    assert_same_row(found["full"], full, "full")
    assert_same_row(found["ids_only"], ids_only, "ids_only")
    assert_same_row(found["matrix"], matrix, "matrix")


def test_put_upserts_replacing_the_whole_row_and_its_tags(
    data_plane: ClearableDataPlane, partition_name: str
) -> None:
    data_plane.put_rows(
        partition_name,
        {"k": staged_row(5, seed=1), "other": staged_row(2, seed=2)},
        tags={"k": {"rollout_id": "g1_g0", "stale": "yes"}},
    )
    replacement = {"token_ids": torch.tensor([9, 9, 9], dtype=torch.int64)}
    data_plane.put_rows(partition_name, {"k": replacement}, tags={"k": {"rollout_id": "g1_g0-a1"}})
    assert data_plane.list_keys(partition_name) == {"k": {"rollout_id": "g1_g0-a1"}, "other": {}}
    assert_same_row(data_plane.read_rows(partition_name, ["k"])["k"], replacement, "k")
    assert_same_row(
        data_plane.read_rows(partition_name, ["other"])["other"], staged_row(2, seed=2), "other"
    )


def test_read_with_a_missing_key_raises_naming_key_and_partition_and_returns_nothing(
    data_plane: ClearableDataPlane, partition_name: str
) -> None:
    data_plane.put_rows(partition_name, {"present": staged_row(3, seed=1)})
    with pytest.raises(MissingRowsError) as err:
        data_plane.read_rows(partition_name, ["present", "absent-1", "absent-2"])
    assert err.value.partition == partition_name
    assert err.value.keys == ["absent-1", "absent-2"]
    assert partition_name in str(err.value) and "absent-1" in str(err.value)
    assert "present" not in err.value.keys


def test_read_from_an_unknown_partition_raises_missing_rows(
    data_plane: ClearableDataPlane, partition_name: str
) -> None:
    with pytest.raises(MissingRowsError) as err:
        data_plane.read_rows(partition_name, ["k"])
    assert err.value.partition == partition_name and err.value.keys == ["k"]


def test_deleted_rows_are_missing_and_delete_is_idempotent(
    data_plane: ClearableDataPlane, partition_name: str
) -> None:
    rows = {"a": staged_row(2, seed=1), "b": staged_row(3, seed=2)}
    data_plane.put_rows(partition_name, rows)
    data_plane.delete_rows(partition_name, ["a", "never-existed"])
    data_plane.delete_rows(partition_name, ["a"])
    data_plane.delete_rows("no-such-partition", ["a"])
    assert list(data_plane.list_keys(partition_name)) == ["b"]
    with pytest.raises(MissingRowsError) as err:
        data_plane.read_rows(partition_name, ["a", "b"])
    assert err.value.keys == ["a"]
    assert_same_row(data_plane.read_rows(partition_name, ["b"])["b"], rows["b"], "b")


def test_a_deleted_key_can_be_staged_again(
    data_plane: ClearableDataPlane, partition_name: str
) -> None:
    data_plane.put_rows(partition_name, {"k": staged_row(3, seed=1)})
    data_plane.delete_rows(partition_name, ["k"])
    data_plane.put_rows(partition_name, {"k": staged_row(8, seed=2)})
    assert_plane_holds(data_plane, partition_name, {"k": staged_row(8, seed=2)})


def test_partitions_are_isolated_by_name(
    data_plane: ClearableDataPlane, partition_name: str
) -> None:
    staging, training = f"{partition_name}-staging", f"{partition_name}-train"
    data_plane.put_rows(staging, {"k": staged_row(2, seed=1)}, tags={"k": {"p": "staging"}})
    data_plane.put_rows(training, {"k": staged_row(9, seed=2)}, tags={"k": {"p": "train"}})
    data_plane.delete_rows(staging, ["k"])
    assert data_plane.list_keys(staging) == {}
    assert data_plane.list_keys(training) == {"k": {"p": "train"}}
    assert_same_row(data_plane.read_rows(training, ["k"])["k"], staged_row(9, seed=2), "k")


def test_list_partitions_names_only_partitions_that_hold_rows(
    data_plane: ClearableDataPlane, partition_name: str
) -> None:
    first, second = f"{partition_name}-a", f"{partition_name}-b"
    assert data_plane.list_partitions() == []
    data_plane.put_rows(second, {"k": staged_row(1, seed=1)})
    data_plane.put_rows(first, {"k": staged_row(1, seed=2)})
    assert data_plane.list_partitions() == [first, second]
    data_plane.delete_rows(first, ["k"])
    assert data_plane.list_partitions() == [second]


def test_list_keys_returns_every_key_with_its_tags(
    data_plane: ClearableDataPlane, partition_name: str
) -> None:
    data_plane.put_rows(
        partition_name,
        {"a": staged_row(1, seed=1), "b": staged_row(1, seed=2)},
        tags={"a": {"rollout_id": "g1_g0", "weight_version": "3"}},
    )
    assert data_plane.list_keys(partition_name) == {
        "a": {"rollout_id": "g1_g0", "weight_version": "3"},
        "b": {},
    }


def test_an_empty_or_unknown_partition_lists_no_keys_and_empty_calls_do_nothing(
    data_plane: ClearableDataPlane, partition_name: str
) -> None:
    assert data_plane.list_keys(partition_name) == {}
    assert data_plane.read_rows(partition_name, []) == {}
    data_plane.put_rows(partition_name, {})
    data_plane.delete_rows(partition_name, [])
    assert data_plane.list_partitions() == []
    assert data_plane.list_keys(partition_name) == {}


@pytest.mark.parametrize(
    ("rows", "tags", "named"),
    [
        ({"k": {"token_ids": [1, 2, 3]}}, None, "token_ids"),
        ({"k": {}}, None, "'k'"),
        ({"k": {"x": torch.ones(1)}}, {"other": {"t": "v"}}, "other"),
        ({"k": {"x": torch.ones(1)}}, {"k": {"eventlog.fields": "[]"}}, "eventlog.fields"),
        ({"k": {"x": torch.ones(1)}}, {"k": {"n": 3}}, "'n'"),
    ],
    ids=["list-not-tensor", "empty-row", "tags-for-unknown-key", "reserved-tag", "int-tag"],
)
def test_an_invalid_put_is_rejected_whole_and_writes_nothing(
    data_plane: ClearableDataPlane,
    partition_name: str,
    rows: dict[str, Row],
    tags: dict[str, dict[str, str]] | None,
    named: str,
) -> None:
    batch: dict[str, Row] = {"good": staged_row(2, seed=1), **rows}
    with pytest.raises(DataPlaneError) as err:
        data_plane.put_rows(partition_name, batch, tags=tags)
    assert named in str(err.value) and partition_name in str(err.value)
    assert data_plane.list_keys(partition_name) == {}


def test_returned_tensors_are_copies_that_do_not_alias_stored_rows(
    data_plane: ClearableDataPlane, partition_name: str
) -> None:
    row = staged_row(4, seed=1)
    mine = {name: tensor.clone() for name, tensor in row.items()}
    data_plane.put_rows(partition_name, {"k": mine})
    mine["token_ids"].zero_()
    first = data_plane.read_rows(partition_name, ["k"])["k"]
    token_ids = first["token_ids"]
    assert isinstance(token_ids, torch.Tensor)
    token_ids.zero_()
    assert_same_row(data_plane.read_rows(partition_name, ["k"])["k"], row, "k")


def test_checkpoint_then_load_restores_exactly_the_saved_rows(
    data_plane: ClearableDataPlane, partition_name: str, tmp_path: Path
) -> None:
    staging, training = f"{partition_name}-staging", f"{partition_name}-train"
    staged = {f"g{i}_g0/call0": staged_row(3 + i, seed=i) for i in range(5)}
    trained = {"row-0": staged_row(11, seed=99)}
    data_plane.put_rows(staging, staged, tags={"g0_g0/call0": {"rollout_id": "g0_g0"}})
    data_plane.put_rows(training, trained)

    checkpoint = data_plane.save_checkpoint(str(tmp_path / "step-1"))

    expected_pairs = [(staging, k) for k in staged] + [(training, k) for k in trained]
    assert checkpoint.row_count == 6
    assert checkpoint.inventory_digest == inventory_digest(expected_pairs)
    assert Path(checkpoint.ref).is_absolute()

    # Work after the checkpoint: all of it must be rolled back by the load.
    data_plane.delete_rows(staging, ["g1_g0/call0"])
    data_plane.put_rows(staging, {"g0_g0/call0": staged_row(1, seed=7), "late": staged_row(2, 8)})
    data_plane.put_rows(f"{partition_name}-later", {"x": staged_row(2, seed=9)})
    data_plane.clear()
    data_plane.put_rows(f"{partition_name}-junk", {"x": staged_row(2, seed=10)})

    data_plane.load_checkpoint(checkpoint)

    assert data_plane.list_partitions() == sorted([staging, training])
    assert_plane_holds(data_plane, staging, staged)
    assert_plane_holds(data_plane, training, trained)
    assert data_plane.list_keys(staging)["g0_g0/call0"] == {"rollout_id": "g0_g0"}
    reloaded = data_plane.save_checkpoint(str(tmp_path / "again"))
    assert reloaded.inventory_digest == checkpoint.inventory_digest


def test_rows_put_after_loading_a_checkpoint_are_stored_beside_the_loaded_ones(
    data_plane: ClearableDataPlane, partition_name: str, tmp_path: Path
) -> None:
    data_plane.put_rows(partition_name, {"a": staged_row(2, seed=1)})
    checkpoint = data_plane.save_checkpoint(str(tmp_path / "cp"))
    data_plane.load_checkpoint(checkpoint)
    data_plane.put_rows(partition_name, {"b": staged_row(3, seed=2)})
    assert_plane_holds(
        data_plane, partition_name, {"a": staged_row(2, seed=1), "b": staged_row(3, seed=2)}
    )


def test_checkpoint_of_an_empty_plane_loads_as_empty(
    data_plane: ClearableDataPlane, partition_name: str, tmp_path: Path
) -> None:
    checkpoint = data_plane.save_checkpoint(str(tmp_path / "empty"))
    assert checkpoint.row_count == 0 and checkpoint.inventory_digest == inventory_digest([])
    data_plane.put_rows(partition_name, {"k": staged_row(2, seed=1)})
    data_plane.load_checkpoint(checkpoint)
    assert data_plane.list_partitions() == []


def test_loading_a_checkpoint_whose_digest_does_not_match_is_refused(
    data_plane: ClearableDataPlane, partition_name: str, tmp_path: Path
) -> None:
    data_plane.put_rows(partition_name, {"k": staged_row(2, seed=1)})
    checkpoint = data_plane.save_checkpoint(str(tmp_path / "cp"))
    forged = type(checkpoint)(
        ref=checkpoint.ref, inventory_digest=inventory_digest([]), row_count=0
    )
    with pytest.raises(DataPlaneError, match="inventory digest"):
        data_plane.load_checkpoint(forged)


def test_loading_from_a_directory_without_a_checkpoint_raises_data_plane_error(
    data_plane: ClearableDataPlane, tmp_path: Path
) -> None:
    checkpoint = data_plane.save_checkpoint(str(tmp_path / "real"))
    missing = type(checkpoint)(
        ref=str(tmp_path / "nothing-here"), inventory_digest="0", row_count=0
    )
    with pytest.raises(DataPlaneError, match="nothing-here"):
        data_plane.load_checkpoint(missing)


def test_inventory_digest_ignores_order_and_separates_names() -> None:
    pairs = [("p", "a"), ("p", "b"), ("q", "a")]
    assert inventory_digest(pairs) == inventory_digest(list(reversed(pairs)))
    assert inventory_digest([("ab", "c")]) != inventory_digest([("a", "bc")])
    assert inventory_digest([]) != inventory_digest([("p", "a")])
