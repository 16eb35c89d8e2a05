"""The demo's configuration, dataset and the worker pool's slots (no engine needed)."""

from __future__ import annotations

import asyncio

import pytest

from eventlog.demo.scenario import CONFIG_YAML, PROMPTS, DemoDataset, demo_config
from eventlog.recovery.config import resolve_granularity
from eventlog.recovery.restore import prompt_digest
from eventlog.rollout.agents import get_agent
from eventlog.rollout.pool import PrioritySlots


def test_demo_config_is_strict_yaml_that_turns_recovery_on() -> None:
    config = demo_config()
    assert "agent_granularity_overrides" in CONFIG_YAML
    assert config.token_capture.enabled and config.checkpointing.save_data_plane
    assert config.rollout_recovery is not None


def test_the_agent_override_beats_the_task_override_in_the_demo_config() -> None:
    config, dataset = demo_config(), DemoDataset()
    echo, arithmetic = dataset.get("demo-000"), dataset.get("demo-001")
    assert (echo["task_name"], arithmetic["task_name"]) == ("echo", "arithmetic")
    # arithmetic's task override says sibling; its agent's override says prompt_group.
    assert resolve_granularity(config, echo) == "sibling"
    assert resolve_granularity(config, arithmetic) == "prompt_group"


def test_demo_dataset_ids_and_content_are_stable_across_instances() -> None:
    first, second = DemoDataset(), DemoDataset()
    assert first.sample_ids(2, 4) == ["demo-004", "demo-005", "demo-006", "demo-007"]
    for sample_id in first.sample_ids(1, len(PROMPTS)):
        a, b = first.get(sample_id), second.get(sample_id)
        assert prompt_digest(a) == prompt_digest(b)
        get_agent(a["extra_env_info"]["agent_ref"]["name"])  # every prompt names a real agent


def test_demo_dataset_refuses_an_unknown_sample_id() -> None:
    with pytest.raises(KeyError, match="demo-999"):
        DemoDataset().get("demo-999")


def test_a_freed_slot_goes_to_the_lowest_priority_waiter_first() -> None:
    async def scenario() -> list[str]:
        slots = PrioritySlots(1)
        order: list[str] = []
        await slots.acquire((0,))

        async def wait(name: str, priority: tuple[int, ...]) -> None:
            await slots.acquire(priority)
            order.append(name)
            slots.release()

        waiters = [
            asyncio.create_task(wait("step3", (3, 0))),
            asyncio.create_task(wait("step2-sibling1", (2, 1))),
            asyncio.create_task(wait("step2-sibling0", (2, 0))),
        ]
        await asyncio.sleep(0)
        slots.release()
        await asyncio.gather(*waiters)
        return order

    assert asyncio.run(scenario()) == ["step2-sibling0", "step2-sibling1", "step3"]


def test_a_cancelled_waiter_does_not_take_a_slot_with_it() -> None:
    async def scenario() -> bool:
        slots = PrioritySlots(1)
        await slots.acquire((0,))
        doomed = asyncio.create_task(slots.acquire((1,)))
        await asyncio.sleep(0)
        doomed.cancel()
        await asyncio.gather(doomed, return_exceptions=True)
        slots.release()
        await asyncio.wait_for(slots.acquire((2,)), timeout=1)  # the slot is free again
        return True

    assert asyncio.run(scenario())


def test_a_slot_handed_to_a_waiter_cancelled_at_that_moment_is_passed_on() -> None:
    async def scenario() -> bool:
        slots = PrioritySlots(1)
        await slots.acquire((0,))
        doomed = asyncio.create_task(slots.acquire((1,)))
        await asyncio.sleep(0)
        slots.release()  # hands the slot to `doomed`...
        doomed.cancel()  # ...which is cancelled before it could run
        await asyncio.gather(doomed, return_exceptions=True)
        await asyncio.wait_for(slots.acquire((2,)), timeout=1)
        return True

    assert asyncio.run(scenario())
