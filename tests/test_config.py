"""Recovery configuration: strict parsing, requirement checks, granularity resolution."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from eventlog.errors import InvalidEventError
from eventlog.recovery.config import (
    Granularity,
    RecoveryConfig,
    config_from_dict,
    load_config,
    parse_config,
    resolve_granularity,
)
from eventlog.recovery.errors import ConfigError

REQUIRED: dict[str, Any] = {
    "token_capture": {"enabled": True},
    "checkpointing": {"enabled": True, "save_data_plane": True},
}


def recovery(**section: Any) -> dict[str, Any]:
    """A configuration with recovery on, its requirements met, and ``section`` as its body."""
    return {"rollout_recovery": section, **REQUIRED}


FULL_YAML = """\
rollout_recovery:
  default_granularity: prompt_group
  agent_granularity_overrides:
    coder: sibling
  task_granularity_overrides:
    gsm8k: sibling
    "2024": prompt_group
token_capture:
  enabled: true
  staging_partition: staging_v2
checkpointing:
  enabled: true
  save_data_plane: true
"""


def test_full_yaml_file_loads_into_typed_sections(tmp_path: Path) -> None:
    path = tmp_path / "recovery.yaml"
    path.write_text(FULL_YAML)
    config = load_config(path)
    assert config.rollout_recovery is not None
    assert config.rollout_recovery.default_granularity is Granularity.PROMPT_GROUP
    assert config.rollout_recovery.agent_granularity_overrides == {"coder": Granularity.SIBLING}
    assert config.rollout_recovery.task_granularity_overrides == {
        "gsm8k": Granularity.SIBLING,
        "2024": Granularity.PROMPT_GROUP,
    }
    assert config.token_capture.enabled and config.token_capture.staging_partition == "staging_v2"
    assert config.checkpointing.enabled and config.checkpointing.save_data_plane
    assert config_from_dict(yaml.safe_load(FULL_YAML)) == config


def test_defaults_are_sibling_granularity_and_the_rollout_staging_partition() -> None:
    config = config_from_dict(recovery())
    assert config.rollout_recovery is not None
    assert config.rollout_recovery.default_granularity is Granularity.SIBLING
    assert config.rollout_recovery.agent_granularity_overrides == {}
    assert config.token_capture.staging_partition == "rollout_staging"


@pytest.mark.parametrize("empty", [None, {}, ""])
def test_empty_configuration_turns_recovery_off(empty: Any) -> None:
    config = parse_config(empty) if isinstance(empty, str) else config_from_dict(empty)
    assert config == RecoveryConfig()
    assert config.rollout_recovery is None
    assert not config.token_capture.enabled


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"rollout_recovry": {}},
            "rollout_recovry: unknown key; expected one of checkpointing, rollout_recovery, "
            "token_capture (did you mean 'rollout_recovery'?)",
        ),
        (
            recovery(default_granularty="sibling"),
            "rollout_recovery.default_granularty: unknown key",
        ),
        (
            {"token_capture": {"enabeld": True}},
            "token_capture.enabeld: unknown key; expected one of enabled, staging_partition "
            "(did you mean 'enabled'?)",
        ),
        (
            {"checkpointing": {"save_dataplane": True}},
            "checkpointing.save_dataplane: unknown key",
        ),
    ],
)
def test_unknown_key_is_an_error_naming_its_path(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        config_from_dict(data)
    assert str(raised.value).startswith(message)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            recovery(agent_granularity_overrides={"foo": "sibbling"}),
            "rollout_recovery.agent_granularity_overrides.foo: "
            "expected 'sibling' or 'prompt_group', found 'sibbling'",
        ),
        (
            recovery(task_granularity_overrides={"math.hard": "group"}),
            "rollout_recovery.task_granularity_overrides['math.hard']: "
            "expected 'sibling' or 'prompt_group', found 'group'",
        ),
        (
            recovery(task_granularity_overrides={"gsm8k": None}),
            "rollout_recovery.task_granularity_overrides.gsm8k: "
            "expected 'sibling' or 'prompt_group', found null",
        ),
        (
            recovery(default_granularity="Sibling"),
            "rollout_recovery.default_granularity: "
            "expected 'sibling' or 'prompt_group', found 'Sibling'",
        ),
    ],
)
def test_unknown_granularity_is_an_error_naming_the_key(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        config_from_dict(data)
    assert str(raised.value) == message


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"token_capture": {"enabled": "yes"}},
            "token_capture.enabled: expected true or false, found 'yes'",
        ),
        (
            {"checkpointing": {"save_data_plane": 1}},
            "checkpointing.save_data_plane: expected true or false, found int 1",
        ),
        (
            {"token_capture": {"staging_partition": 7}},
            "token_capture.staging_partition: expected a string, found int 7",
        ),
        (
            {"token_capture": {"staging_partition": ""}},
            "token_capture.staging_partition: expected a string of length >= 1, found ''",
        ),
        (
            {"rollout_recovery": [], **REQUIRED},
            "rollout_recovery: expected a mapping, found a list",
        ),
        (
            recovery(agent_granularity_overrides=["coder"]),
            "rollout_recovery.agent_granularity_overrides: expected a mapping, found a list",
        ),
        (
            recovery(task_granularity_overrides={2024: "sibling"}),
            "rollout_recovery.task_granularity_overrides: every name must be a non-empty string, "
            "found int 2024 (quote it in YAML)",
        ),
        (
            {"token_capture": {True: "x"}},
            "token_capture: every key must be a string, found true",
        ),
    ],
)
def test_wrong_type_is_an_error_naming_key_expected_and_found(
    data: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        config_from_dict(data)
    assert str(raised.value) == message


def test_configuration_that_is_not_a_mapping_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^c\.yaml: \(top level\): expected a mapping"):
        parse_config("- rollout_recovery\n", source="c.yaml")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"token_capture": {"enabled": False}},
            "rollout_recovery needs token_capture.enabled: true (found false), "
            "checkpointing.enabled: true (found nothing) and "
            "checkpointing.save_data_plane: true (found nothing)",
        ),
        (
            {"token_capture": {"enabled": True}, "checkpointing": {"enabled": True}},
            "rollout_recovery needs checkpointing.save_data_plane: true (found nothing)",
        ),
        (
            {
                "token_capture": {"enabled": True},
                "checkpointing": {"enabled": True, "save_data_plane": False},
            },
            "rollout_recovery needs checkpointing.save_data_plane: true (found false)",
        ),
        (
            {"token_capture": {"enabled": True}, "checkpointing": {"save_data_plane": True}},
            "rollout_recovery needs checkpointing.enabled: true (found nothing)",
        ),
        (
            {
                "token_capture": {"enabled": True},
                "checkpointing": {"enabled": False, "save_data_plane": True},
            },
            "rollout_recovery needs checkpointing.enabled: true (found false)",
        ),
        (
            {"checkpointing": {"enabled": True, "save_data_plane": True}},
            "rollout_recovery needs token_capture.enabled: true (found nothing)",
        ),
    ],
)
def test_recovery_without_its_requirements_says_exactly_which_is_missing(
    overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        config_from_dict({"rollout_recovery": {}, **overrides})
    assert str(raised.value) == message
    assert raised.value.hint is not None and "remove the rollout_recovery section" in (
        raised.value.hint
    )


def test_empty_rollout_recovery_section_still_turns_recovery_on_and_checks_requirements() -> None:
    with pytest.raises(ConfigError, match=r"rollout_recovery needs token_capture\.enabled"):
        parse_config("rollout_recovery:\n")
    config = parse_config(
        "rollout_recovery:\n"
        "token_capture: {enabled: true}\n"
        "checkpointing: {enabled: true, save_data_plane: true}\n"
    )
    assert config.rollout_recovery is not None
    assert config.rollout_recovery.default_granularity is Granularity.SIBLING


def test_features_without_recovery_need_no_recovery_section() -> None:
    config = config_from_dict({"token_capture": {"enabled": True}})
    assert config.rollout_recovery is None and config.token_capture.enabled


def test_yaml_key_given_twice_is_refused_with_its_line() -> None:
    text = "token_capture:\n  enabled: false\n  enabled: true\n"
    with pytest.raises(ConfigError, match=r"^cfg\.yaml: key 'enabled' appears twice .*line 3"):
        parse_config(text, source="cfg.yaml")


def test_invalid_yaml_is_a_config_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("rollout_recovery: [\n")
    with pytest.raises(ConfigError, match=r"broken\.yaml: not valid YAML"):
        load_config(path)


def test_missing_file_is_a_config_error_naming_the_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"absent\.yaml: cannot read configuration"):
        load_config(tmp_path / "absent.yaml")


def test_error_from_a_file_names_the_file_and_the_key_path(tmp_path: Path) -> None:
    path = tmp_path / "typo.yaml"
    path.write_text(FULL_YAML.replace("staging_partition", "staging_partiton"))
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert str(raised.value).startswith(f"{path}: token_capture.staging_partiton: unknown key")


# -- resolution ---------------------------------------------------------------------------

RESOLVING = config_from_dict(
    recovery(
        default_granularity="sibling",
        agent_granularity_overrides={"coder": "prompt_group", "chatter": "sibling"},
        task_granularity_overrides={"gsm8k": "prompt_group", "poetry": "sibling"},
    )
)


def prompt(task: object = "other", agent: object = "nobody") -> dict[str, Any]:
    return {"task_name": task, "extra_env_info": {"agent_ref": {"name": agent}}}


@pytest.mark.parametrize(
    ("task", "agent", "expected"),
    [
        ("poetry", "coder", Granularity.PROMPT_GROUP),  # agent beats task
        ("gsm8k", "chatter", Granularity.SIBLING),  # agent beats task, the other way round
        ("gsm8k", "nobody", Granularity.PROMPT_GROUP),  # task beats default
        ("other", "nobody", Granularity.SIBLING),  # default
    ],
)
def test_agent_override_beats_task_override_beats_default(
    task: str, agent: str, expected: Granularity
) -> None:
    assert resolve_granularity(RESOLVING, prompt(task, agent)) is expected


def test_default_granularity_applies_when_nothing_matches() -> None:
    config = config_from_dict(recovery(default_granularity="prompt_group"))
    assert resolve_granularity(config, prompt()) is Granularity.PROMPT_GROUP


@pytest.mark.parametrize(
    "identity",
    [
        {},
        {"task_name": None, "extra_env_info": None},
        {"task_name": "gsm8k"},
        {"task_name": "gsm8k", "extra_env_info": {}},
        {"task_name": "gsm8k", "extra_env_info": {"agent_ref": None}},
    ],
)
def test_absent_or_null_identity_fields_mean_no_override(identity: dict[str, Any]) -> None:
    expected = (
        Granularity.PROMPT_GROUP if identity.get("task_name") == "gsm8k" else Granularity.SIBLING
    )
    assert resolve_granularity(RESOLVING, identity) is expected


def test_resolution_without_a_recovery_section_uses_the_sibling_default() -> None:
    assert resolve_granularity(RecoveryConfig(), prompt("gsm8k", "coder")) is Granularity.SIBLING


@pytest.mark.parametrize(
    ("identity", "message"),
    [
        (
            {"extra_env_info": ["coder"]},
            "prompt extra_env_info: expected a mapping, found a list",
        ),
        (
            {"extra_env_info": {"agent_ref": "coder"}},
            "prompt extra_env_info.agent_ref: expected a mapping, found 'coder'",
        ),
        (
            {"extra_env_info": {"agent_ref": {"name": 3}}},
            "prompt extra_env_info.agent_ref.name: expected a string, found int 3",
        ),
        (
            {"extra_env_info": {"agent_ref": {"version": 2}}},
            "prompt extra_env_info.agent_ref.name: expected a string, found nothing",
        ),
        (
            {"task_name": ["gsm8k"]},
            "prompt task_name: expected a string, found a list",
        ),
    ],
)
def test_malformed_prompt_identity_is_an_error_naming_the_field(
    identity: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidEventError) as raised:
        resolve_granularity(RESOLVING, identity)
    assert str(raised.value) == message


def test_config_granularity_is_the_event_vocabulary_s() -> None:
    from eventlog.recovery import vocabulary

    assert Granularity is vocabulary.Granularity


def test_our_sections_are_read_out_of_a_larger_run_config_and_the_rest_is_ignored() -> None:
    """A NeMo-RL style YAML: other top-level keys are not ours; inside ours, still strict."""
    text = textwrap.dedent(
        """
        policy: {model_name: tiny, train_global_batch_size: 8}
        grpo: {num_prompts_per_step: 4, num_generations_per_prompt: 2}
        logger: {wandb_enabled: false}
        rollout_recovery: {default_granularity: prompt_group}
        token_capture: {enabled: true}
        checkpointing: {enabled: true, save_data_plane: true, checkpoint_dir: results}
        """
    )
    with pytest.raises(ConfigError, match=r"^<string>: checkpointing\.checkpoint_dir: unknown key"):
        parse_config(text)
    config = parse_config(text.replace(", checkpoint_dir: results", ""))
    assert config.rollout_recovery is not None
    assert config.rollout_recovery.default_granularity is Granularity.PROMPT_GROUP
    assert config.checkpointing.enabled and config.token_capture.enabled
    # A near miss of one of our section names is still refused, not ignored.
    with pytest.raises(
        ConfigError, match=r"token_captur: unknown key.*did you mean 'token_capture'"
    ):
        config_from_dict({"token_captur": {"enabled": True}, "policy": {}})


def test_the_staging_partition_is_not_the_training_one(tmp_path: Path) -> None:
    """Sharing it, a restore's staging check cleared every canonical row as never staged and
    its canonical check every staged row as an orphan, at every restore after."""
    from eventlog import EventLog
    from eventlog.dataplane.memory import InMemoryDataPlane
    from eventlog.recovery.ledger import RecoveryLedger

    with pytest.raises(ConfigError, match=r"token_capture.staging_partition: 'training' is the"):
        config_from_dict({"token_capture": {"staging_partition": "training"}})
    with EventLog.open(tmp_path / "run.db") as log:
        with pytest.raises(ConfigError, match=r"^staging_partition: 'training' is the training"):
            RecoveryLedger(log, InMemoryDataPlane(), staging_partition="training")
        assert log.head() == 0
