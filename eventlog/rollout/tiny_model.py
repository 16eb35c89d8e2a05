"""A tiny random-weight Llama, built locally and deterministically, for tests and the demo.

No model hub is reachable on CI machines, yet the rollout worker must be exercised against a
real vLLM engine. This module builds a model vLLM and transformers both load: a byte-level BPE
tokenizer trained with `tokenizers` on a corpus kept in this file, and a 2-layer `LlamaConfig`
(hidden 128, head_dim 32) initialised from a fixed seed, saved with `save_pretrained`.

The build takes a few seconds, so it is cached: the directory gets a stamp file holding the
recipe hash (corpus, configuration, seed and the versions of the libraries that write the
files) and the sha256 of every file written. A second call with the same recipe checks the
stamp and the file digests and returns at once. Same recipe and same library versions give
the same bytes (checked by `tests/test_tiny_model.py`).

Run ``python -m eventlog.rollout.tiny_model DIR`` to build one from a shell.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import click

from eventlog.recovery.errors import ConfigError

logger = logging.getLogger(__name__)

STAMP_FILE = "eventlog-tiny-model.json"
"""Written last: a directory without a matching stamp is rebuilt from scratch."""

SEED = 20240611
VOCAB_SIZE = 512
BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|eos|>"
PAD_TOKEN = "<|pad|>"
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN)

MODEL_CONFIG: dict[str, int | float | bool] = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
    "initializer_range": 0.02,
}

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<{{ message['role'] }}>{{ message['content'] }}</{{ message['role'] }}>\n"
    "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
)
"""A minimal template so chat-style prompts work; plain prompts need none."""

# Public-domain-style prose written for this file, plus arithmetic, so that common English
# fragments and digits get their own merges. Changing it changes the recipe hash.
CORPUS: tuple[str, ...] = (
    "The controller appends every change of a prompt group before it acts on it.",
    "A rollout worker generates tokens, stages them in the data plane and reports back.",
    "After a crash the run restores from the last checkpoint and reruns only what is missing.",
    "Each sibling of a group is one generation slot; each attempt is one physical run of it.",
    "The quick brown fox jumps over the lazy dog while the river runs to the sea.",
    "In the morning the baker opens the shop, and the town smells of bread and coffee.",
    "Numbers are written with digits: one is 1, two is 2, three is 3, ten is 10.",
    "Question: what is 2 + 3? Answer: 5. Question: what is 7 + 8? Answer: 15.",
    "Question: what is 12 - 4? Answer: 8. Question: what is 6 * 7? Answer: 42.",
    "Write a short story about a lighthouse keeper who counts the ships at night.",
    "Summarise the paragraph in one sentence, then list three keywords.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    "user: hello there. assistant: hello! how can I help you today?",
    "A log is a sequence of facts; a projection folds those facts back into state.",
    "Rewards are numbers between zero and one; a masked sample does not train.",
    "The weather was cold and clear, and the stars were bright above the hills.",
)


def recipe() -> dict[str, object]:
    """Everything that determines the built files; its hash names a build."""
    return {
        "format": 1,
        "seed": SEED,
        "vocab_size": VOCAB_SIZE,
        "special_tokens": list(SPECIAL_TOKENS),
        "model_config": MODEL_CONFIG,
        "chat_template": CHAT_TEMPLATE,
        "corpus_sha256": hashlib.sha256("\x00".join(CORPUS).encode("utf-8")).hexdigest(),
        "versions": {
            name: _version(name) for name in ("torch", "transformers", "tokenizers", "safetensors")
        },
    }


def recipe_hash() -> str:
    """sha256 of the canonical JSON of `recipe()`."""
    canonical = json.dumps(recipe(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def build_tiny_model(directory: str | os.PathLike[str]) -> Path:
    """Build the tiny model into `directory` (or reuse it there) and return its absolute path.

    Safe to call from several processes at once: builds are serialised by a lock file next to
    the directory and land by an atomic rename, so a reader never sees a half-written model.
    """
    target = Path(directory).expanduser().resolve()
    wanted = recipe_hash()
    if _is_current(target, wanted):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target.parent / f".{target.name}.lock"):
        if _is_current(target, wanted):  # another process built it while we waited
            return target
        if target.exists() and any(target.iterdir()) and not (target / STAMP_FILE).exists():
            raise ConfigError(
                f"tiny model directory {str(target)!r}: expected an empty directory or a tiny "
                f"model (with {STAMP_FILE}), found other files; choose another directory"
            )
        started = time.perf_counter()
        scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            scratch.chmod(0o755)  # mkdtemp makes it private; the model is meant to be shared
            _build_into(scratch, wanted)
            if target.exists():
                shutil.rmtree(target)
            os.replace(scratch, target)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        logger.info(
            "built tiny model %s in %.1f s (recipe %s)",
            target,
            time.perf_counter() - started,
            wanted[:12],
        )
    return target


def _build_into(directory: Path, wanted: str) -> None:
    # Imported here: only building needs them, and they take seconds to import.
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(list(CORPUS), trainer=trainer)
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=MODEL_CONFIG["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(directory)

    shape: dict[str, Any] = dict(MODEL_CONFIG)
    config = LlamaConfig(
        **shape,
        bos_token_id=_token_id(fast, BOS_TOKEN),
        eos_token_id=_token_id(fast, EOS_TOKEN),
        pad_token_id=_token_id(fast, PAD_TOKEN),
        dtype="bfloat16",
    )
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(SEED)
        model = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]
        model = model.to(torch.bfloat16)  # type: ignore[arg-type]
    finally:
        torch.random.set_rng_state(generator_state)
    with _quiet_progress_bars():
        model.save_pretrained(directory, safe_serialization=True)

    files = {
        path.relative_to(directory).as_posix(): _sha256(path)
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }
    stamp = {"recipe_hash": wanted, "recipe": recipe(), "files": files}
    (directory / STAMP_FILE).write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n")


def _token_id(tokenizer: Any, token: str) -> int:
    found = tokenizer.convert_tokens_to_ids(token)
    if not isinstance(found, int):
        raise ConfigError(f"tiny model tokenizer: expected one id for {token!r}, found {found!r}")
    return found


def _is_current(directory: Path, wanted: str) -> bool:
    """True when `directory` holds an intact build of this recipe."""
    try:
        stamp = json.loads((directory / STAMP_FILE).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(stamp, dict) or stamp.get("recipe_hash") != wanted:
        return False
    files = stamp.get("files")
    if not isinstance(files, dict) or not files:
        return False
    for name, digest in files.items():
        path = directory / name
        if not path.is_file() or _sha256(path) != digest:
            logger.warning("tiny model %s: %s is missing or changed; rebuilding", directory, name)
            return False
    return True


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "absent"


@contextlib.contextmanager
def _quiet_progress_bars() -> Iterator[None]:
    """Library code must not draw progress bars on the caller's terminal."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("directory", type=click.Path(path_type=Path))
def command(directory: Path) -> None:
    """Build the tiny model in DIRECTORY (or reuse the one there) and print its path."""
    click.echo(str(build_tiny_model(directory)))


def main(argv: list[str] | None = None) -> int:
    """`python -m eventlog.rollout.tiny_model DIR`: run `command`, return its exit status."""
    try:
        command.main(args=argv, prog_name="python -m eventlog.rollout.tiny_model")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
