"""The controller acknowledges every sealed result to the agent environment exactly once
(the outbox, eventlog.recovery.outbox), on the session's real vLLM engine and a real log."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from eventlog import EventLog
from eventlog.dataplane.memory import InMemoryDataPlane
from eventlog.demo.scenario import DemoDataset, demo_config
from eventlog.recovery.outbox import Outbox
from eventlog.recovery.vocabulary import AcknowledgementPending
from eventlog.rollout.controller import Controller, LoopSettings
from tests.fixtures.vllm import VllmSession
from tests.test_rollout_controller import seals

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


class Environment:
    """Takes each key once; a first send of every third result fails (it is sent again)."""

    def __init__(self) -> None:
        self.sends: Counter[str] = Counter()
        self.applied: list[str] = []

    def acknowledge(self, key: str, ack: AcknowledgementPending) -> None:
        self.sends[ack.rollout_id] += 1
        if len(self.sends) % 3 == 0 and self.sends[ack.rollout_id] == 1:
            raise ConnectionError(f"{key}: environment busy")
        if key not in self.applied:
            self.applied.append(key)


def test_every_sealed_result_is_acknowledged_once_with_its_key(
    vllm_session: VllmSession, tmp_path: Path
) -> None:
    env = Environment()
    with EventLog.open(tmp_path / "run.db") as log:
        controller = Controller(
            log=log,
            data_plane=InMemoryDataPlane(),
            engine=vllm_session.engine,
            source=DemoDataset(),
            config=demo_config(),
            settings=LoopSettings(steps=1, groups_per_step=2, siblings=3, max_tokens=8, slots=8),
            checkpoint_dir=tmp_path / "checkpoints",
            acknowledge=env,
        )
        vllm_session.run(controller.run())
        sealed = seals(list(log.read()))
        outbox = Outbox(log, env)
        assert outbox.record_seals() == [] and outbox.pending() == []
        key = outbox.key
    assert sorted(env.applied) == sorted(key(r.rollout_id) for r in sealed.values())
    assert set(env.sends) == {r.rollout_id for r in sealed.values()}
    assert max(env.sends.values()) <= 2
