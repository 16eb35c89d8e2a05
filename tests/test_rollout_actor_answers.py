"""`ActorPool` answers forwarded appends per actor, one call per loop turn (issue 12).

A group commit lands many forwarded appends at once; each answer used to be its own Ray call
submitted on the controller's loop, and that turn was the loop's longest. Pinned here without
Ray: stand-ins for the actor handles (the streaming reply and the answer call) and for the
log (a commit that settles every queued append in one turn). What must still hold: each
forward gets its own results, a refused append its own error, and the call that forwarded a
refused append raises the controller's error.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from eventlog.errors import ConcurrencyError
from eventlog.records import NO_STREAM, AppendRequest, AppendResult
from eventlog.rollout.actor import ActorPool, Answer, CallOutcome, Forward


class _Method:
    """`handle.method` of a Ray actor: `.remote(...)` (and `.options(...)`) call `fn`."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def options(self, **_: object) -> _Method:
        return self

    def remote(self, *args: Any) -> Any:
        return self.fn(*args)


async def _ready(item: Forward | CallOutcome) -> Forward | CallOutcome:
    return item


class FakeActor:
    """One forwarded append per attempt; it waits for that append's answer, then ends."""

    def __init__(self, tokens: itertools.count[int]) -> None:
        self.tokens = tokens
        self.waiting: dict[int, asyncio.Future[list[AppendResult] | str]] = {}
        self.answer_calls: list[list[Answer]] = []
        self.got: dict[str, list[AppendResult] | str] = {}
        self.run_attempts = _Method(self._run)
        self.answer_all = _Method(self._answer_all)

    def _run(self, group_id: str, attempts: list[tuple[int, int]], *_: object) -> Any:
        async def replies() -> AsyncIterator[Any]:
            for index, _attempt in attempts:
                stream = f"attempt/{group_id}_g{index}"
                token = next(self.tokens)
                answered = asyncio.get_running_loop().create_future()
                self.waiting[token] = answered
                yield _ready(Forward(token, [AppendRequest(stream, [], NO_STREAM)]))
                self.got[stream] = got = await answered
                if isinstance(got, str):  # refused: the worker's append raises, as a real one
                    yield _ready(CallOutcome(None, "ForwardedAppendError", got))
                    return
            yield _ready(CallOutcome(results=[]))

        return replies()

    def _answer_all(self, answers: list[Answer]) -> None:
        self.answer_calls.append(answers)
        for token, results, error in answers:
            answer = results if results is not None else error
            assert answer is not None
            self.waiting.pop(token).set_result(answer)


class OneCommit:
    """A log whose commit lands once `size` appends are queued, settling all in one turn;
    an append to a stream named in `refuse` fails with ConcurrencyError."""

    def __init__(self, size: int, refuse: frozenset[str] = frozenset()) -> None:
        self.size = size
        self.refuse = refuse
        self.queued: list[tuple[asyncio.Future[list[AppendResult]], str]] = []

    async def append_batch_async(self, requests: Sequence[AppendRequest]) -> list[AppendResult]:
        (request,) = requests
        landed: asyncio.Future[list[AppendResult]] = asyncio.get_running_loop().create_future()
        self.queued.append((landed, request.stream))
        if len(self.queued) == self.size:
            for seq, (future, stream) in enumerate(self.queued, start=1):
                if stream in self.refuse:
                    future.set_exception(ConcurrencyError(stream, NO_STREAM, 1))
                else:
                    future.set_result([AppendResult(stream, [seq], [0], [uuid.uuid4()])])
        return await landed


def test_answers_landing_in_one_commit_reach_each_actor_in_one_call_with_their_own_results() -> (
    None
):
    tokens = itertools.count()
    one, two = FakeActor(tokens), FakeActor(tokens)
    log = OneCommit(size=4, refuse=frozenset({"attempt/g2_g0"}))
    pool = ActorPool(log, [one, two], slots=4)

    async def main() -> list[list[Any] | BaseException]:
        calls = [
            pool.call(one, "g0", [(0, 0)], "p", None, None),  # type: ignore[arg-type]
            pool.call(one, "g1", [(0, 0)], "p", None, None),  # type: ignore[arg-type]
            pool.call(one, "g2", [(0, 0)], "p", None, None),  # type: ignore[arg-type]
            pool.call(two, "g3", [(0, 0)], "p", None, None),  # type: ignore[arg-type]
        ]
        return await asyncio.gather(*calls, return_exceptions=True)

    outcomes = asyncio.run(main())

    assert [len(answers) for answers in one.answer_calls] == [3]  # one call, three answers
    assert [len(answers) for answers in two.answer_calls] == [1]
    seqs = {
        stream: got[0].seqs if isinstance(got, list) else got
        for actor in (one, two)
        for stream, got in actor.got.items()
    }
    assert seqs == {
        "attempt/g0_g0": [1],
        "attempt/g1_g0": [2],
        "attempt/g2_g0": str(ConcurrencyError("attempt/g2_g0", NO_STREAM, 1)),
        "attempt/g3_g0": [4],
    }
    assert outcomes[:2] == [[], []] and outcomes[3] == []
    assert isinstance(outcomes[2], ConcurrencyError)  # the controller's own error, not a copy
