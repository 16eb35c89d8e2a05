"""`eventlog append`: append events given as JSON lines, all of them or none.

Each line: {"stream": "...", "type": "<EventType>", "data": {...fields},
"expected_version": int | "no_stream" | "any" (optional, default "any"),
"event_id": "<uuid>" (optional: a retry with the same id and content is a no-op)}.
Every line is validated before anything is written; then all lines go in one atomic batch.
"""

from __future__ import annotations

import codecs
import difflib
import itertools
import sys
import uuid
from typing import Any, Literal

import click
import msgspec

from eventlog import codec
from eventlog.cli.interrupts import Interrupted
from eventlog.cli.output import json_line
from eventlog.cli.stdout import StdoutError
from eventlog.cli.targets import open_log, require_existing
from eventlog.errors import EventLogError, InvalidEventError
from eventlog.events import Event, event_types
from eventlog.ids import new_event_id
from eventlog.log import EventLog, check_stream
from eventlog.records import (
    ANY,
    NO_STREAM,
    AppendRequest,
    AppendResult,
    ExpectedVersion,
    Proposed,
)


class AppendLine(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One input line as written by a script."""

    stream: str
    type: str
    data: dict[str, Any] = msgspec.field(default_factory=dict)
    expected_version: int | Literal["no_stream", "any"] = "any"
    event_id: uuid.UUID | None = None


_line_decoder = msgspec.json.Decoder(AppendLine)


def parse_line(number: int, text: bytes) -> AppendRequest:
    """One JSON line as an append request; InvalidEventError names the line and the field."""
    try:
        line = _line_decoder.decode(text)
    except msgspec.ValidationError as exc:
        raise InvalidEventError(f"line {number}: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise InvalidEventError(f"line {number}: invalid JSON: {exc}") from exc
    except RecursionError:
        raise InvalidEventError(f"line {number}: JSON nested too deeply") from None
    if not line.stream:
        raise InvalidEventError(f"line {number}: stream must not be empty")
    try:
        check_stream(line.stream)
    except InvalidEventError as exc:
        raise InvalidEventError(f"line {number}: {exc}") from exc
    cls = event_types().get(line.type)
    if cls is None:
        close = difflib.get_close_matches(line.type, event_types(), n=3)
        raise InvalidEventError(
            f"line {number}: unknown event type {line.type!r}",
            hint=(
                f"did you mean {', '.join(close)}?"
                if close
                else "import the module that defines it with --events-module"
            ),
        )
    event = _convert(number, cls, line.data)
    try:  # what only encoding finds (an int beyond msgpack's): named by its line here
        codec.encode(event)
    except InvalidEventError as exc:
        raise InvalidEventError(f"line {number}: {exc}") from exc
    if line.expected_version == "no_stream":
        expected: ExpectedVersion = NO_STREAM
    elif line.expected_version == "any":
        expected = ANY
    elif line.expected_version < 0:
        raise InvalidEventError(
            f"line {number}: expected_version must be >= 0, found {line.expected_version}"
        )
    else:
        expected = line.expected_version
    item: Event | Proposed = event if line.event_id is None else Proposed(event, line.event_id)
    return AppendRequest(line.stream, [item], expected)


def _convert(number: int, cls: type[Event], data: dict[str, Any]) -> Event:
    """The event `data` gives, by its fields' encoded names (as `replay --json` prints
    them; an array_like type's too), dict keys from JSON's text."""
    config, names = cls.__struct_config__, cls.__struct_encode_fields__
    unknown = sorted(set(data) - set(names) - {config.tag_field})
    if unknown:
        raise InvalidEventError(
            f"line {number}: {cls.__name__} has no field {unknown[0]!r} "
            f"(fields: {', '.join(names)})"
        )
    given: Any = data
    if config.array_like:  # [tag, the values in field order]: none missing before the last
        values = [data[n] for n in itertools.takewhile(data.__contains__, names)]
        if len(values) < len(set(data) - {config.tag_field}):
            raise InvalidEventError(
                f"line {number}: {cls.__name__}: field {names[len(values)]!r} is missing, "
                "and a field after it is given (its fields are stored in order)"
            )
        given = ([] if config.tag_field is None else [config.tag]) + values
    try:
        event = msgspec.convert(given, cls, strict=True, str_keys=True)
    except msgspec.ValidationError as exc:
        where = str(exc).replace("`$", "`data", 1)
        if " - at `" not in where:
            where += " - at `data`"
        raise InvalidEventError(f"line {number}: {cls.__name__}: {where}") from exc
    dropped = _dropped_key(given, event, "data")
    if dropped is not None:
        raise InvalidEventError(
            f"line {number}: {cls.__name__}: {dropped} is no field (it would be dropped)"
        )
    return event


def _dropped_key(given: Any, built: Any, at: str) -> str | None:
    """The first key of `given` (JSON) that `built` (what msgspec made of it) has no place
    for: a nested struct ignores unknown keys, so a typo there was stored without it."""
    if isinstance(built, msgspec.Struct) and isinstance(given, dict):
        config = built.__struct_config__
        names = dict(zip(built.__struct_encode_fields__, built.__struct_fields__, strict=True))
        for key, value in given.items():
            if key == config.tag_field:
                continue
            if key not in names:
                return f"{at}.{key}"
            found = _dropped_key(value, getattr(built, names[key]), f"{at}.{key}")
            if found is not None:
                return found
    elif isinstance(built, list | tuple) and isinstance(given, list) and len(built) == len(given):
        for index, (value, inner) in enumerate(zip(given, built, strict=True)):
            found = _dropped_key(value, inner, f"{at}[{index}]")
            if found is not None:
                return found
    return None


class _Lines(click.File):
    """`click.File` that names a closed stdin (`append LOG <&-`: click's RuntimeError was
    exit 70)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value == "-" and sys.stdin is None:
            self.fail("stdin is closed: give the lines on stdin or with -i FILE", param, ctx)
        return super().convert(value, param, ctx)


@click.command()
@click.argument("target")
@click.option(
    "-i",
    "--input",
    "source",
    type=_Lines("rb"),
    default="-",
    show_default=True,
    help="JSON lines file to read ('-' is stdin).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per appended event.")
def append(target: str, source: Any, as_json: bool) -> None:
    """Append the events given as JSON lines on stdin to TARGET, atomically.

    \b
    Each line: {"stream": "group/g1", "type": "GroupAdmitted", "data": {...},
                "expected_version": 3 | "no_stream" | "any", "event_id": "<uuid>"}
    A bad line appends nothing; the error names the line and the field.
    """
    require_existing(target)  # before reading stdin: a typo should not wait for input
    requests = []
    for number, raw in enumerate(source, start=1):
        if number == 1:  # RFC 8259 lets a reader ignore a BOM; Windows editors write one
            raw = raw.removeprefix(codecs.BOM_UTF8)
        if raw.strip():
            requests.append(parse_line(number, raw))
    if not requests:
        with open_log(target):  # a file that is no log says so, with lines or without
            pass
        click.echo("nothing to append", err=True)
        return
    requests[0] = _with_first_id(requests[0])
    with open_log(target, write=True) as log:
        try:
            results = log.append_batch(requests)
        except KeyboardInterrupt as exc:  # at any point, the commit included: did it land?
            raise _stopped(exc, log, requests) from None
    try:
        for request, result in zip(requests, results, strict=True):
            for item, seq, version, event_id in zip(
                request.events, result.seqs, result.versions, result.event_ids, strict=True
            ):
                event = item.event if isinstance(item, Proposed) else item
                type_name = str(type(event).__struct_config__.tag)
                if as_json:
                    click.echo(
                        json_line(
                            {
                                "seq": seq,
                                "stream": result.stream,
                                "version": version,
                                "event_id": str(event_id),
                                "type": type_name,
                            }
                        )
                    )
                else:
                    click.echo(f"{seq}\t{result.stream}\tv{version}\t{type_name}\t{event_id}")
    except StdoutError as exc:  # after the commit: say so, or a script's retry appends twice
        raise StdoutError(f"{_appended(results)}; {exc}", hint=_IN_THE_LOG) from exc
    except KeyboardInterrupt as exc:
        stopped = f"{_appended(results)}, then stopped while printing them"
        raise Interrupted.of(exc, stopped, hint=_IN_THE_LOG) from None


_IN_THE_LOG = "they are in the log: do not append them again"


def _appended(results: list[AppendResult]) -> str:
    seqs = sorted(seq for result in results for seq in result.seqs)
    span = f"seq {seqs[0]}" if len(seqs) == 1 else f"seq {seqs[0]}..{seqs[-1]}"
    return f"{_were(len(seqs))} appended ({span})"


def _were(count: int) -> str:
    return "1 event was" if count == 1 else f"{count} events were"


def _with_first_id(request: AppendRequest) -> AppendRequest:
    """The request with an event id chosen here for its first event, if it has none: a batch
    lands whole or not at all, so that one id tells a stopped append's outcome."""
    first = request.events[0]
    if isinstance(first, Proposed):
        return request
    chosen = Proposed(first, new_event_id())
    return AppendRequest(request.stream, [chosen, *request.events[1:]], request.expected_version)


def _stopped(stop: KeyboardInterrupt, log: EventLog, requests: list[AppendRequest]) -> Interrupted:
    """The stop, saying whether the batch was committed before it (Ctrl-C during COMMIT
    ended with the events in the log and a bare "interrupted": a retry appended them twice)."""
    first = requests[0].events[0]
    assert isinstance(first, Proposed)  # _with_first_id
    try:
        seq = log.seq_of(first.event_id)
    except EventLogError:
        return Interrupted.of(stop, "whether the events were appended is unknown")
    if seq is None:
        return Interrupted.of(stop, "nothing was appended")
    count = sum(len(request.events) for request in requests)
    return Interrupted.of(stop, f"{_were(count)} appended, from seq {seq}", hint=_IN_THE_LOG)
