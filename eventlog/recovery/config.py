"""Recovery configuration (YAML), parsed strictly: a typo must never pass silently.

Three sections matter to the log: ``rollout_recovery`` (granularity per agent, per task, by
default), ``token_capture`` (rows staged in the data plane) and ``checkpointing``. They may sit
in a larger run configuration (a NeMo-RL YAML): other top-level keys are not ours and are
ignored. Inside our sections, unknown keys, wrong types and unknown granularities are
``ConfigError``s naming the key path; so is turning recovery on without the features it stands
on. A top-level key that is a near miss of one of our section names is refused too, because a
silently ignored ``rollout_recovry:`` would switch recovery off.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from typing import Annotated, Any

import msgspec
import msgspec.inspect as mi
import yaml

from eventlog.errors import InvalidEventError
from eventlog.recovery.errors import ConfigError
from eventlog.recovery.vocabulary import Granularity

__all__ = [
    "CheckpointingConfig",
    "Granularity",
    "RecoveryConfig",
    "RolloutRecoveryConfig",
    "TokenCaptureConfig",
    "check_staging_partition",
    "config_from_dict",
    "load_config",
    "our_sections",
    "parse_config",
    "resolve_granularity",
]


DEFAULT_STAGING_PARTITION = "rollout_staging"
"""Where workers stage token rows unless `token_capture.staging_partition` says otherwise."""

DEFAULT_TRAINING_PARTITION = "training"
"""Where finalization writes canonical rows (keys: canonical row ids) until they train."""


def check_staging_partition(name: str, where: str) -> str:
    """A staging partition apart from the training one: sharing it, a restore's staging
    check cleared every canonical row as never staged and its canonical check every staged
    row as an orphan, rows the log still owned, at every restore after."""
    if name == DEFAULT_TRAINING_PARTITION:
        raise ConfigError(
            f"{where}: {name!r} is the training partition, where canonical rows live",
            hint=f"stage token rows in a partition of their own (default "
            f"{DEFAULT_STAGING_PARTITION!r})",
        )
    return name


class RolloutRecoveryConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Granularity resolution: agent override beats task override beats the default."""

    default_granularity: Granularity = Granularity.SIBLING
    agent_granularity_overrides: dict[str, Granularity] = msgspec.field(default_factory=dict)
    task_granularity_overrides: dict[str, Granularity] = msgspec.field(default_factory=dict)
    min_valid_row_fraction: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = 0.0
    """A fully sealed group whose fraction of valid rows (siblings that train: mask_sample
    false) is below this is discarded, recorded, instead of finalized (0: never)."""


class TokenCaptureConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Whether workers stage token rows in the data plane, and in which partition."""

    enabled: bool = False
    staging_partition: Annotated[str, msgspec.Meta(min_length=1)] = DEFAULT_STAGING_PARTITION


class CheckpointingConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Whether checkpoints are taken, and whether they include the data plane's rows."""

    enabled: bool = False
    save_data_plane: bool = False


class RecoveryConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The whole recovery configuration; ``rollout_recovery=None`` means recovery is off."""

    rollout_recovery: RolloutRecoveryConfig | None = None
    token_capture: TokenCaptureConfig = msgspec.field(default_factory=TokenCaptureConfig)
    checkpointing: CheckpointingConfig = msgspec.field(default_factory=CheckpointingConfig)


# The sections: a null one (every key commented out) is read as an empty one.
_SECTIONS: dict[str, type[msgspec.Struct]] = {
    "": RecoveryConfig,
    "rollout_recovery": RolloutRecoveryConfig,
    "token_capture": TokenCaptureConfig,
    "checkpointing": CheckpointingConfig,
}

_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_\-]+$")


def _join(path: str, key: object) -> str:
    """Key path in dotted form; keys that would be ambiguous there are shown in brackets."""
    if isinstance(key, str) and _PLAIN_KEY.match(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]"


def _shown(path: str) -> str:
    return path or "(top level)"


def _lookup(data: object, path: str) -> tuple[bool, object]:
    """The raw value at a dotted path such as ``token_capture.enabled`` (found?, value)."""
    value = data
    for part in (p for p in path.split(".") if p):
        if not isinstance(value, Mapping) or part not in value:
            return False, None
        value = value[part]
    return True, value


def _describe(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, str):
        return repr(value)
    return f"{type(value).__name__} {value!r}"


def _expected(path: str, wanted: str, value: object) -> ConfigError:
    return ConfigError(f"{_shown(path)}: expected {wanted}, found {_describe(value)}")


def _check(value: object, kind: mi.Type, path: str) -> None:
    """Validate raw YAML `value` against the struct's type `kind`, key by key, recursively.

    Walking the structure ourselves names the exact key path (mapping keys included), which
    msgspec's own error only gives as text; what this does not know, msgspec still checks.
    """
    if isinstance(kind, mi.UnionType):
        if value is None and any(isinstance(t, mi.NoneType) for t in kind.types):
            return
        # A null section is read as an empty one, so `Struct | None` only ever wants a mapping.
        options = [t for t in kind.types if not isinstance(t, mi.NoneType)]
        if len(options) == 1:
            _check(value, options[0], path)
    elif isinstance(kind, mi.StructType):
        if not isinstance(value, Mapping):
            raise _expected(path, "a mapping", value)
        fields = {f.encode_name: f for f in kind.fields}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ConfigError(
                    f"{_shown(path)}: every key must be a string, found {_describe(key)}"
                )
            field = fields.get(key)
            if field is None:
                names = sorted(fields)
                close = difflib.get_close_matches(key, names, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(
                    f"{_join(path, key)}: unknown key; expected one of {', '.join(names)}{hint}"
                )
            _check(item, field.type, _join(path, key))
    elif isinstance(kind, mi.DictType):
        if not isinstance(value, Mapping):
            raise _expected(path, "a mapping", value)
        for key, item in value.items():
            if not isinstance(key, str) or not key:
                raise ConfigError(
                    f"{_shown(path)}: every name must be a non-empty string, "
                    f"found {_describe(key)} (quote it in YAML)"
                )
            _check(item, kind.value_type, _join(path, key))
    elif isinstance(kind, mi.EnumType | mi.LiteralType):
        allowed = [m.value for m in kind.cls] if isinstance(kind, mi.EnumType) else kind.values
        if isinstance(value, bool) or value not in allowed:
            raise _expected(path, " or ".join(repr(a) for a in allowed), value)
    elif isinstance(kind, mi.BoolType):
        if not isinstance(value, bool):
            raise _expected(path, "true or false", value)
    elif isinstance(kind, mi.FloatType):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _expected(path, "a number", value)
        if (kind.ge is not None and value < kind.ge) or (kind.le is not None and value > kind.le):
            raise _expected(path, f"a number from {kind.ge} to {kind.le}", value)
    elif isinstance(kind, mi.IntType):
        if isinstance(value, bool) or not isinstance(value, int):
            raise _expected(path, "an integer", value)
    elif isinstance(kind, mi.StrType):
        if not isinstance(value, str):
            raise _expected(path, "a string", value)
        if kind.min_length is not None and len(value) < kind.min_length:
            raise _expected(path, f"a string of length >= {kind.min_length}", value)


_CONFIG_TYPE = mi.type_info(RecoveryConfig)


def _check_requirements(data: Mapping[Any, Any], config: RecoveryConfig) -> None:
    """Recovery stands on staged token rows and data-plane checkpoints: say which is missing."""
    if config.rollout_recovery is None:
        return
    missing: list[str] = []
    for flag, value in (
        ("token_capture.enabled", config.token_capture.enabled),
        ("checkpointing.enabled", config.checkpointing.enabled),
        ("checkpointing.save_data_plane", config.checkpointing.save_data_plane),
    ):
        if value:
            continue
        found_it, raw = _lookup(data, flag)
        missing.append(f"{flag}: true (found {_describe(raw) if found_it else 'nothing'})")
    if missing:
        listed = ", ".join(missing[:-1]) + " and " if len(missing) > 1 else ""
        raise ConfigError(
            "rollout_recovery needs " + listed + missing[-1],
            hint="recovery restores staged token rows from data-plane checkpoints; "
            "enable them or remove the rollout_recovery section",
        )


def our_sections(data: Mapping[Any, Any]) -> dict[str, Any]:
    """Our sections of a (possibly larger) run configuration; a near miss of one is an error.

    Keys that are not ours belong to the rest of the run's configuration and are ignored.
    """
    names = sorted(k for k in _SECTIONS if k)
    ours: dict[str, Any] = {}
    for key, value in data.items():
        if key in _SECTIONS and key:
            ours[key] = value
            continue
        if not isinstance(key, str):
            continue
        close = difflib.get_close_matches(key, names, n=1, cutoff=0.8)
        if close and close[0] not in data:
            raise ConfigError(
                f"{_join('', key)}: unknown key; expected one of {', '.join(names)} "
                f"(did you mean {close[0]!r}?)",
                hint="other top-level keys are ignored, but this one looks like ours misspelt",
            )
    return ours


def config_from_dict(data: Mapping[str, Any] | None) -> RecoveryConfig:
    """Validate an already parsed configuration (``None`` or ``{}``: everything off).

    Only our sections are read (`our_sections`); the rest of a larger run config is ignored.
    """
    if data is None:
        return RecoveryConfig()
    if not isinstance(data, Mapping):
        raise ConfigError(f"(top level): expected a mapping, found {_describe(data)}")
    data = our_sections(data)
    # An empty section (`token_capture:` with every key commented out) means its defaults;
    # for rollout_recovery that still means "recovery on", so its requirements apply.
    data = {k: ({} if k in _SECTIONS and v is None else v) for k, v in data.items()}
    _check(data, _CONFIG_TYPE, "")
    try:
        config = msgspec.convert(data, RecoveryConfig, strict=True)
    except msgspec.ValidationError as exc:  # a constraint `_check` does not know
        raise ConfigError(f"(top level): {exc}") from None
    _check_requirements(data, config)
    check_staging_partition(
        config.token_capture.staging_partition, "token_capture.staging_partition"
    )
    return config


class _StrictLoader(yaml.SafeLoader):
    """A safe YAML loader that refuses a key given twice (PyYAML keeps the last silently)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            mark = key_node.start_mark
            raise ConfigError(
                f"key {key!r} appears twice in one mapping (line {mark.line + 1}, "
                f"column {mark.column + 1})"
            )
        seen[key] = loader.construct_object(value_node, deep=True)
    return seen


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def parse_config(text: str, *, source: str = "<string>") -> RecoveryConfig:
    """Parse and validate YAML text; ``source`` names it in error messages."""
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from None
    try:
        return config_from_dict(data)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}", hint=exc.hint) from None


def load_config(path: str | os.PathLike[str]) -> RecoveryConfig:
    """Read and validate a YAML configuration file."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise ConfigError(f"{os.fspath(path)}: cannot read configuration: {exc.strerror}") from None
    return parse_config(text, source=os.fspath(path))


def _identity_field(value: object, field: str, expected: str) -> InvalidEventError:
    return InvalidEventError(f"prompt {field}: expected {expected}, found {_describe(value)}")


def resolve_granularity(config: RecoveryConfig, prompt: Mapping[str, Any]) -> Granularity:
    """The granularity for one prompt: agent override, else task override, else the default.

    Called once, at reservation; the result is stored in the event and never resolved again.
    A missing ``extra_env_info``/``agent_ref``/``task_name`` (absent or null) means no override;
    a present but malformed one is an error naming the field.
    """
    recovery = config.rollout_recovery or RolloutRecoveryConfig()
    if not isinstance(prompt, Mapping):
        raise _identity_field(prompt, "(the prompt itself)", "a mapping")
    agent_name: str | None = None
    extra = prompt.get("extra_env_info")
    if extra is not None:
        if not isinstance(extra, Mapping):
            raise _identity_field(extra, "extra_env_info", "a mapping")
        agent_ref = extra.get("agent_ref")
        if agent_ref is not None:
            if not isinstance(agent_ref, Mapping):
                raise _identity_field(agent_ref, "extra_env_info.agent_ref", "a mapping")
            if "name" not in agent_ref:
                raise InvalidEventError(
                    "prompt extra_env_info.agent_ref.name: expected a string, found nothing"
                )
            name = agent_ref["name"]
            if not isinstance(name, str):
                raise _identity_field(name, "extra_env_info.agent_ref.name", "a string")
            agent_name = name
    task_name = prompt.get("task_name")
    if task_name is not None and not isinstance(task_name, str):
        raise _identity_field(task_name, "task_name", "a string")
    if agent_name is not None and agent_name in recovery.agent_granularity_overrides:
        return recovery.agent_granularity_overrides[agent_name]
    if task_name is not None and task_name in recovery.task_granularity_overrides:
        return recovery.task_granularity_overrides[task_name]
    return recovery.default_granularity
