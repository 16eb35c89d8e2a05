"""The demo's world: a built-in dataset, its recovery configuration, and the faults it injects.

Two kinds of prompt alternate in the dataset, each with its own agent: ``echo`` prompts go to
the one-call ``overlap`` agent and recover sibling by sibling; ``arithmetic`` prompts go to
the two-call ``two_turn_digits`` agent, which the configuration below switches to
``prompt_group`` (all siblings or none) by an agent override, beating the task override.
"""

from __future__ import annotations

from typing import Any

from eventlog.recovery.config import RecoveryConfig, parse_config, resolve_granularity
from eventlog.rollout.faults import FaultPlan
from eventlog.rollout.settings import LoopSettings

CONFIG_YAML = """\
# Recovery configuration of `eventlog demo` (parsed strictly by eventlog.config).
rollout_recovery:
  default_granularity: sibling        # echo prompts (agent "overlap"): rerun only what failed
  task_granularity_overrides:
    arithmetic: sibling               # ...but an agent override beats a task override:
  agent_granularity_overrides:
    two_turn_digits: prompt_group     # the two-call arithmetic agent reruns whole groups
token_capture:
  enabled: true                       # workers stage token rows in the data plane
  staging_partition: rollout_staging
checkpointing:
  enabled: true
  save_data_plane: true               # a checkpoint saves the staged rows with the log position
"""

AGENTS = {"echo": "overlap", "arithmetic": "two_turn_digits"}

# Written for this file. Even positions are echo prompts, odd ones arithmetic.
PROMPTS: tuple[tuple[str, str], ...] = (
    ("echo", "Repeat after me: the quick brown fox jumps over the lazy dog."),
    ("arithmetic", "Question: what is 2 + 3? Answer:"),
    ("echo", "Repeat after me: the river runs to the sea."),
    ("arithmetic", "Question: what is 7 + 8? Answer:"),
    ("echo", "Repeat after me: a log is a sequence of facts."),
    ("arithmetic", "Question: what is 12 - 4? Answer:"),
    ("echo", "Repeat after me: the baker opens the shop in the morning."),
    ("arithmetic", "Question: what is 6 * 7? Answer:"),
    ("echo", "Repeat after me: each sibling of a group is one generation slot."),
    ("arithmetic", "Question: what is 9 + 10? Answer:"),
    ("echo", "Repeat after me: the stars were bright above the hills."),
    ("arithmetic", "Question: what is 3 * 3? Answer:"),
    ("echo", "Repeat after me: a projection folds facts back into state."),
    ("arithmetic", "Question: what is 15 - 8? Answer:"),
    ("echo", "Repeat after me: the weather was cold and clear."),
    ("arithmetic", "Question: what is 4 + 4? Answer:"),
)


def demo_config() -> RecoveryConfig:
    return parse_config(CONFIG_YAML, source="eventlog demo configuration")


class DemoDataset:
    """Prompts by stable sample id (``demo-NNN``); restore rehydrates them from here."""

    def get(self, sample_id: str) -> dict[str, Any]:
        index = _index(sample_id)
        task, text = PROMPTS[index]
        return {
            "prompt_id": f"demo-prompt-{index:03d}",
            "task_name": task,
            "text": text,
            "extra_env_info": {"agent_ref": {"name": AGENTS[task]}},
        }

    def sample_ids(self, step: int, count: int) -> list[str]:
        """Step `step` takes the next `count` prompts, wrapping around the dataset."""
        return [f"demo-{((step - 1) * count + j) % len(PROMPTS):03d}" for j in range(count)]


def _index(sample_id: str) -> int:
    head, _, number = sample_id.partition("-")
    if head != "demo" or not number.isdigit() or int(number) >= len(PROMPTS):
        raise KeyError(f"no demo sample {sample_id!r} (demo-000..demo-{len(PROMPTS) - 1:03d})")
    return int(number)


def demo_faults(settings: LoopSettings, *, in_process: bool = True) -> FaultPlan:
    """Faults of step 1, by rollout id (attempt 0 of a sibling is its logical id).

    - an echo (sibling) attempt fails: that sibling alone reruns;
    - an arithmetic (prompt_group) attempt fails in its second call, after its first row was
      staged: the whole group reruns, results of its siblings that finish meanwhile are
      rejected, and the staged row is left unreferenced (a restore clears it, with evidence);
    - a worker dies mid-attempt: every attempt it was running fails, a fresh worker replaces it.
    Faults name step-1 groups of the first controller only: rerun attempts have new ids.

    With in-process workers (they hear of the controller's seals), two stragglers make
    step 1's checkpoint catch step 2's first `sibling` group half-sealed, whatever the
    machine's speed: step 1's sibling 0 waits until that group's sibling 0 is sealed (so step
    1 cannot train before it), and its last sibling waits for step 1's weights (so it cannot
    be sealed before that checkpoint). A `sibling` group (as the configuration resolves it),
    since a `prompt_group` group seals its siblings only all at once (waiting on one would
    never end); none in step 2, no stragglers. A
    waiting straggler holds its slot: two slots at least.
    """
    last = settings.siblings - 1
    fail = {f"step1-g0_g{last}": 4}
    kill: dict[str, int] = {}
    if settings.groups_per_step > 1:
        fail["step1-g1_g0"] = settings.max_tokens + 4
    if settings.siblings > 1:
        kill[f"step1-g{min(2, settings.groups_per_step - 1)}_g1"] = 6
    plan = FaultPlan(fail_after_tokens=fail, kill_after_tokens=kill)
    dataset, config = DemoDataset(), demo_config()
    by_sibling = [
        j
        for j, sample in enumerate(dataset.sample_ids(2, settings.groups_per_step))
        if resolve_granularity(config, dataset.get(sample)) == "sibling"
    ]
    if in_process and by_sibling and settings.siblings > 1 and settings.slots >= 2:
        plan.stall_until_sealed["step1-g0_g0"] = f"step2-g{by_sibling[0]}_g0"
        plan.stall_until_weights[f"step2-g{by_sibling[0]}_g{last}"] = 1
    return plan
