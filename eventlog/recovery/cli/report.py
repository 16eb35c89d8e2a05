"""`eventlog report TARGET -o run.html`: one self-contained HTML page of plots of a run.

Group lifecycles (a Gantt of attempts per group), retries and failures per step, tokens
trained vs thrown away, the staleness distribution and the append rate, with every restore
marked on every time axis. Drawn with matplotlib as inline SVG: the file opens with no
network. Figures come from the same folds as `stats` (projections.audit_stats) and one pass
over the log; the Gantt shows the first groups reserved (a page cannot hold a million bars).
"""

from __future__ import annotations

import contextlib
import html
import importlib.util
import io
import os
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Literal

import click

from eventlog.cli.exits import CliUsageError
from eventlog.cli.numbers import number
from eventlog.cli.output import printable, stdout_console
from eventlog.cli.targets import (
    OutputPath,
    open_log,
    refuse_writing_onto_log,
    shown_target,
    writing_output,
)
from eventlog.cli.times import format_ns
from eventlog.cli.workers import Workers, default_jobs, portable_vocabulary
from eventlog.log import EventLog
from eventlog.recovery.cli.runlog import RunLog, audit_pass
from eventlog.recovery.vocabulary import (
    AttemptFailed,
    GenerationFailed,
    GenerationFinished,
    GenerationStarted,
    GroupAbandoned,
    GroupDiscarded,
    GroupFinalized,
    GroupReserved,
    GroupSealed,
    SiblingSealed,
    UnsealedAbandoned,
)
from projections.audit_stats import (
    AuditReport,
    AuditState,
    FinishedView,
    SealedView,
    StartedView,
    StepReport,
    TimeBins,
    Watch,
    report,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

GANTT_GROUPS = 60
WIDTH_IN = 11.0
STALENESS_SERIES = 8
RATE_BINS = 120
COLORS = {
    "counts": "#2b8a3e",
    "failed": "#c92a2a",
    "abandoned": "#e67700",
    "rolled back": "#868e96",
    "in flight": "#1c7ed6",
}


@dataclass
class _Bar:
    group: str
    start: int
    end: int | None = None
    """When the worker finished or failed; else when the ledger decided (a killed worker)."""
    decided_at: int | None = None
    verdict: str | None = None
    rolled_back_verdict: bool = False


@dataclass
class RunPicture:
    """What the plots need, gathered in one pass."""

    first_ns: int = 0
    last_ns: int = 0
    records: int = 0
    rate: list[int] = field(default_factory=lambda: [0] * RATE_BINS)
    groups: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    """Gantt rows: group -> (reserved at, left the ledger at)."""
    bars: dict[str, _Bar] = field(default_factory=dict)
    restores: list[int] = field(default_factory=list)
    checkpoints: list[tuple[int, int]] = field(default_factory=list)
    """(recorded_at, step) of the effective checkpoints."""
    stats: AuditReport | None = None


def gather(log: EventLog, run: RunLog) -> RunPicture:
    """The run's picture as of the run's head."""
    pic = RunPicture()
    head = run.head
    if head == 0:
        raise CliUsageError("the log is empty: nothing to plot")
    ends = [row[6] for row in log.read_rows(1, 1)] + [row[6] for row in log.read_rows(head, head)]
    pic.first_ns, pic.last_ns = ends[0], ends[-1]
    first, span = pic.first_ns, max(pic.last_ns - pic.first_ns, 1)
    at_seq = {r.seq: r.recorded_at for r in run.controller}
    pic.checkpoints = [(at_seq[seq], ev.step) for seq, ev in run.checkpoints]
    pic.restores = [r.recorded_at for r, _ in run.restores]
    state = AuditState(skipped=run.skipped, step_ends=run.step_ends())
    times = TimeBins(first, span, pic.rate)
    audit_pass(log, state, head, "report", watch=_gantt(pic), times=times)
    pic.records = state.records
    pic.stats = report(state)
    return pic


def _gantt(pic: RunPicture) -> dict[type, Watch]:
    """What the Gantt takes of each event class the fold reads (by class: the frequent
    TokensStaged is not looked at)."""

    def decide(rid: str, verdict: str, at: int, effective: bool) -> None:
        bar = pic.bars.get(rid)
        if bar is None:
            return
        if bar.decided_at is None:
            bar.decided_at = at
        if effective:
            bar.verdict = verdict
        elif bar.verdict is None:
            bar.rolled_back_verdict = True

    def reserved(ev: GroupReserved, at: int, effective: bool) -> None:
        if ev.group_id not in pic.groups and len(pic.groups) < GANTT_GROUPS:
            pic.groups[ev.group_id] = (at, None)

    def started(ev: StartedView | GenerationStarted, at: int, effective: bool) -> None:
        if ev.group_id in pic.groups:
            pic.bars[ev.rollout_id] = _Bar(group=ev.group_id, start=at)

    def ended(
        ev: FinishedView | GenerationFinished | GenerationFailed, at: int, effective: bool
    ) -> None:
        bar = pic.bars.get(ev.rollout_id)
        if bar is not None:
            bar.end = at

    def sealed(ev: SealedView | SiblingSealed, at: int, effective: bool) -> None:
        decide(ev.rollout_id, "counts", at, effective)

    def group_sealed(ev: GroupSealed, at: int, effective: bool) -> None:
        for result in ev.results:
            decide(result.rollout_id, "counts", at, effective)

    def failed(ev: AttemptFailed, at: int, effective: bool) -> None:
        decide(ev.rollout_id, "failed", at, effective)

    def abandoned(ev: UnsealedAbandoned | GroupAbandoned, at: int, effective: bool) -> None:
        for ref in ev.attempts:
            decide(ref.rollout_id, "abandoned", at, effective)

    def left(ev: GroupFinalized | GroupDiscarded, at: int, effective: bool) -> None:
        found = pic.groups.get(ev.group_id)
        if found is not None and effective:
            pic.groups[ev.group_id] = (found[0], at)

    return {
        GroupReserved: reserved,
        StartedView: started,
        GenerationStarted: started,
        FinishedView: ended,
        GenerationFinished: ended,
        GenerationFailed: ended,
        SealedView: sealed,
        SiblingSealed: sealed,
        GroupSealed: group_sealed,
        AttemptFailed: failed,
        UnsealedAbandoned: abandoned,
        GroupAbandoned: abandoned,
        GroupFinalized: left,
        GroupDiscarded: left,
    }


# -- drawing ----------------------------------------------------------------------------------


def _matplotlib() -> ModuleType:
    """matplotlib, imported whatever MPLBACKEND says: the page is drawn to SVG by the figure
    itself, through no backend, and an MPLBACKEND matplotlib refuses failed its import
    (exit 70)."""
    os.environ.pop("MPLBACKEND", None)
    import matplotlib

    return matplotlib


def _painting() -> None:
    """Set matplotlib up as every plot is drawn: text stays text (smaller, searchable), and
    the SVG's ids and metadata depend on the plot alone, so the same log gives the same
    page, byte for byte. Text is drawn as it is: `$` starts no formula (a group id
    `cost_$5_to_$10` was a parse error, exit 70), and a character the font lacks is no
    warning on stderr (which printed the group id raw)."""
    matplotlib = _matplotlib()

    matplotlib.rcParams["svg.fonttype"] = "none"
    matplotlib.rcParams["svg.hashsalt"] = "eventlog report"
    matplotlib.rcParams["text.parse_math"] = False
    warnings.filterwarnings("ignore", r"Glyph \d+ .* missing from", UserWarning)


def _figure(height: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(WIDTH_IN, height))


def _place(fig: Figure, chars: int, *, points: float = 10.0, ylabel: bool = False) -> None:
    """Margins in inches, set here rather than by a layout engine (which measured every text
    and was half the drawing): on the left, room for tick labels of `chars` characters at
    `points` (DejaVu Sans, at most ~0.6 em each; 4 in at most) and for a y label; above, a
    title; below, tick labels and an x label."""
    left = 0.2 + min(chars * points * 0.6 / 72, 4.0) + (0.3 if ylabel else 0.0)
    height = fig.get_figheight()
    fig.subplots_adjust(
        left=left / WIDTH_IN, right=1 - 0.2 / WIDTH_IN, bottom=0.55 / height, top=1 - 0.4 / height
    )


def _number_chars(values: Iterable[float]) -> int:
    """Characters of the widest tick label of an axis up to max(values): a million and more
    is written scaled, its power of ten above the axis; an axis of zeros reads ±0.04."""
    top = max(values, default=0)
    return 4 if top >= 1e6 else max(len(str(int(top))) + 2, 5)


def _svg(fig: Figure) -> str:
    out = io.StringIO()
    fig.savefig(out, format="svg", metadata={"Date": None})
    text = out.getvalue()
    return text[text.index("<svg") :]  # drop the XML prologue: inline in HTML


def _seconds(pic: RunPicture, ns: int) -> float:
    return (ns - pic.first_ns) / 1e9


def _mark(ax: Axes, xs: Sequence[float], label: str) -> None:
    """A line across the axes at each of `xs`, all one artist: a weeks-long run has
    thousands of checkpoints, and an `axvline` each took seconds per plot."""
    if xs:
        color, width, style = MARKS[label]
        ax.vlines(
            xs,
            0,
            1,
            transform=ax.get_xaxis_transform(),  # x in data, y across the whole axes
            colors=color,
            linewidths=width,
            linestyles=style,
            label=label,
        )


MARKS: dict[str, tuple[str, float, Literal["--", ":"]]] = {
    "restore": ("#c92a2a", 1.5, "--"),
    "step with a restore": ("#c92a2a", 1.5, "--"),
    "checkpoint": ("#495057", 0.6, ":"),
}
"""How each kind of marked moment is drawn: (color, line width, line style)."""


def _mark_time_axis(ax: Axes, pic: RunPicture) -> None:
    _mark(ax, [_seconds(pic, at) for at in pic.restores], "restore")
    _mark(ax, [_seconds(pic, at) for at, _step in pic.checkpoints], "checkpoint")


def plot_gantt(pic: RunPicture) -> Figure:
    from matplotlib.collections import LineCollection, PolyCollection

    rows = list(pic.groups)
    fig = _figure(max(2.5, 0.28 * len(rows) + 1.2))
    ax = fig.add_subplot()
    index = {g: i for i, g in enumerate(rows)}
    lifetimes = [
        [(_seconds(pic, start), index[gid]), (_seconds(pic, end or pic.last_ns), index[gid])]
        for gid, (start, end) in pic.groups.items()
    ]
    ax.add_collection(LineCollection(lifetimes, colors="#ced4da", linewidths=1, zorder=1))
    # One collection of every bar, drawn in the order they started (a collection per bar
    # cost seconds to draw).
    boxes: list[list[tuple[float, float]]] = []
    colors: list[str] = []
    per_row: dict[str, int] = {}
    for bar in pic.bars.values():
        verdict = bar.verdict or ("rolled back" if bar.rolled_back_verdict else "in flight")
        lane = per_row.get(bar.group, 0)
        per_row[bar.group] = lane + 1
        y = index[bar.group] - 0.35 + 0.7 * ((lane % 4) / 4)
        end = bar.end or (bar.decided_at if verdict != "in flight" else None) or pic.last_ns
        x = _seconds(pic, bar.start)
        right = x + max(_seconds(pic, end) - x, 0.01)
        boxes.append([(x, y), (right, y), (right, y + 0.16), (x, y + 0.16)])
        colors.append(COLORS[verdict])
    ax.add_collection(PolyCollection(boxes, facecolors=colors, zorder=2))
    ax.autoscale_view()
    for verdict, color in COLORS.items():
        ax.plot([], [], color=color, linewidth=6, label=verdict)
    _mark_time_axis(ax, pic)
    ax.set_yticks(range(len(rows)), list(map(printable, rows)), fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the first record")
    ax.set_title("Group lifecycles: attempts per group (bar = worker run, color = verdict)")
    ax.legend(loc="upper right", fontsize=7, ncols=4)
    _place(fig, max((len(printable(r)) for r in rows), default=1), points=7)
    return fig


def plot_steps(pic: RunPicture) -> Figure:
    """Per step, drawn as step lines and filled steps (one artist per series) on an axis of
    at most a dozen integer ticks: a bar and a tick label per step took 2.5 s to draw at 400
    steps and ran the labels into one band (now 0.2 s; 10^4 steps, 1.8 s)."""
    from matplotlib.ticker import MaxNLocator

    assert pic.stats is not None
    by_number = {s.step: s for s in pic.stats.by_step}
    # A bin per step the report has; steps it lacks (or none at all) are one bin of 0: the
    # drawing follows the steps in the log, not the span of their numbers (a run that
    # jumped from step 1 to 10^6 drew 10^6 bins, for minutes).
    steps: list[StepReport | None] = []
    edges: list[float] = []
    for n in sorted(by_number) or [0]:
        if not edges or edges[-1] < n - 0.5:
            if edges:
                steps.append(None)
            edges.append(n - 0.5)
        steps.append(by_number.get(n))
        edges.append(n + 0.5)

    def series(name: str) -> list[int]:
        return [getattr(s, name) if s is not None else 0 for s in steps]

    fig = _figure(3.2)
    left, right = fig.subplots(1, 2)
    retries, failed = series("retries"), series("failed")
    left.stairs(retries, edges, label="retries", linewidth=1.2)
    left.stairs(failed, edges, label="failed", color=COLORS["failed"], linewidth=1.2)
    left.set_title("Retries and failures per step")
    trained, thrown = series("tokens_trained"), series("tokens_thrown_away")
    stacked = [t + w for t, w in zip(trained, thrown, strict=True)]  # thrown away on top
    right.stairs(trained, edges, fill=True, label="trained", color=COLORS["counts"])
    right.stairs(
        stacked,
        edges,
        baseline=trained,
        fill=True,
        label="thrown away",
        color=COLORS["rolled back"],
    )
    right.set_title("Tokens per step: trained vs thrown away")
    restored = [s.step for s in steps if s is not None and s.restores]
    for ax in (left, right):
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(nbins=12, integer=True, min_n_ticks=1))
        _mark(ax, restored, "step with a restore")
        ax.legend(fontsize=7)
    _place(fig, _number_chars([*retries, *failed]))
    return fig


def plot_staleness(pic: RunPicture) -> Figure:
    assert pic.stats is not None
    fig = _figure(3.0)
    ax = fig.add_subplot()
    lags = sorted({lag for s in pic.stats.by_step for lag in s.staleness})
    steps = [s for s in pic.stats.by_step if s.staleness]
    series = [(f"step {s.step}", s.staleness) for s in steps]
    if len(series) > STALENESS_SERIES:  # one bar per step would not be readable: add up
        total: dict[int, int] = {}
        for s in steps:
            for lag, n in s.staleness.items():
                total[lag] = total.get(lag, 0) + n
        series = [(f"steps {steps[0].step}-{steps[-1].step}", total)]
    bottom = [0] * len(lags)
    for label, found in series:
        heights = [found.get(lag, 0) for lag in lags]
        ax.bar(lags, heights, bottom=bottom, label=label)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set_xlabel("staleness (trained step - weight version)")
    ax.set_ylabel("siblings trained")
    ax.set_xticks(lags)
    ax.set_title("Staleness of trained siblings")
    if lags:
        ax.legend(fontsize=7)
    _place(fig, _number_chars(bottom), ylabel=True)
    return fig


def plot_rate(pic: RunPicture) -> Figure:
    fig = _figure(3.0)
    ax = fig.add_subplot()
    ax.set_title("Append rate")
    if pic.last_ns <= pic.first_ns:  # e.g. a generated log, all at one time: 1e13/s was drawn
        ax.text(
            0.5,
            0.5,
            "no rate to draw: the last record is not timed after the first (first "
            f"{format_ns(pic.first_ns)}, last {format_ns(pic.last_ns)})",
            transform=ax.transAxes,
            ha="center",
            va="center",
        )
        ax.set_axis_off()
        return fig
    span = (pic.last_ns - pic.first_ns) / 1e9
    width = span / RATE_BINS
    rates = [n / width for n in pic.rate]
    ax.plot(
        [(i + 0.5) * width for i in range(RATE_BINS)],
        rates,
        color="#1c7ed6",
        label="records/s",
    )
    _mark_time_axis(ax, pic)
    ax.set_xlabel("seconds since the first record")
    ax.set_ylabel("records per second")
    ax.legend(fontsize=7)
    _place(fig, _number_chars(rates), ylabel=True)
    return fig


PLOTS = (
    ("lifecycles", plot_gantt),
    ("steps", plot_steps),
    ("staleness", plot_staleness),
    ("append-rate", plot_rate),
)
"""The plots of the page, in its order (the costliest first: painters take them in turn)."""
_PLOT_BY_NAME = dict(PLOTS)

WORTH_PAINTERS = 250_000
"""Records from which `report` draws in painter processes unless told: they start (about a
second of CPU each, importing matplotlib) while the log is read; on a shorter read they
would not be ready when it ends."""

_CHECK = """
<script>
// Self-check for people and for the test: every plot drew (an SVG with a visible box and
// drawn paths), no text of a plot lies outside its picture (a label cut off by too narrow
// a margin), and no script error happened.
window.__errors = [];
window.addEventListener("error", (e) => window.__errors.push(String(e.message)));
window.addEventListener("load", () => {
  const plots = [...document.querySelectorAll("figure.plot")];
  const drawn = plots.filter((f) => {
    const svg = f.querySelector("svg");
    if (!svg) return false;
    const box = svg.getBoundingClientRect();
    return box.width > 0 && box.height > 0 && svg.querySelectorAll("path").length > 0;
  });
  const outside = (f) => {
    const svg = f.querySelector("svg");
    if (!svg) return 0;
    const box = svg.getBoundingClientRect();
    return [...svg.querySelectorAll("text")].filter((t) => {
      const r = t.getBoundingClientRect();
      return r.width > 0 && (r.left < box.left - 1 || r.right > box.right + 1 ||
        r.top < box.top - 1 || r.bottom > box.bottom + 1);
    }).length;
  };
  document.body.dataset.clipped = String(plots.reduce((n, f) => n + outside(f), 0));
  document.body.dataset.plots = String(plots.length);
  document.body.dataset.drawn = String(drawn.length);
  document.body.dataset.errors = String(window.__errors.length);
});
</script>
"""

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1150px; color: #212529; }
h1 { font-size: 1.4em; } figure { margin: 1.5em 0; } figure svg { width: 100%; height: auto; }
table { border-collapse: collapse; } td { padding: 0.15em 1em 0.15em 0; }
"""


def draw(name: str, pic: RunPicture) -> str:
    """One plot of PLOTS as SVG text."""
    _painting()
    return _svg(_PLOT_BY_NAME[name](pic))


def _draw_task(state: None, job: tuple[str, RunPicture]) -> str:
    """`draw`, as a painter's task."""
    return draw(*job)


def _painter_setup() -> None:
    """A painter imports matplotlib's figure while the command's process reads the log."""
    _matplotlib()
    import matplotlib.figure  # noqa: F401


def render(target: str, pic: RunPicture, drawn: Iterable[str] | None = None) -> str:
    """The page, with `drawn` (the SVG of each plot of PLOTS, in order) or drawn here."""
    assert pic.stats is not None
    svgs = list(drawn) if drawn is not None else [draw(name, pic) for name, _ in PLOTS]
    total = pic.stats.total
    facts = [
        ("log", shown_target(target)),
        ("records", f"{pic.records:,} ({pic.stats.rolled_back_records:,} rolled back)"),
        ("from", format_ns(pic.first_ns)),
        ("to", format_ns(pic.last_ns)),
        ("groups", f"{total.groups:,} reserved, {total.finalized:,} finalized"),
        (
            "attempts",
            f"{total.started:,} started, {total.failed:,} failed, {total.retries:,} retries",
        ),
        ("restores", f"{pic.stats.restores}"),
        ("tokens", f"{total.tokens_staged:,} staged, {total.tokens_discarded:,} discarded"),
    ]
    rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in facts)
    figures = [
        f'<figure class="plot" data-plot="{name}">{svg}</figure>'
        for (name, _), svg in zip(PLOTS, svgs, strict=True)
    ]
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>eventlog report: {html.escape(shown_target(target))}</title>"
        f"<style>{_STYLE}</style>{_CHECK}</head><body>"
        f"<h1>Run report</h1><table>{rows}</table>"
        f"{''.join(figures)}</body></html>"
    )


@click.command("report")
@click.argument("target")
@click.option(
    "-o",
    "--output",
    required=True,
    type=OutputPath(dir_okay=False, path_type=Path),
    help="The HTML file to write.",
)
@click.option(
    "-j",
    "--jobs",
    type=number(min=1),
    default=None,
    metavar="N",
    help="Processes that draw the plots, started while this one reads the log (default: "
    f"this host's CPUs, at most 2, for {WORTH_PAINTERS:,} records or more; 1: all here).",
)
def report_command(target: str, output: Path, jobs: int | None) -> None:
    """Write one self-contained HTML page of plots of TARGET's run: group lifecycles (a
    Gantt of attempts per group), retries and failures per step, tokens trained vs thrown
    away, staleness, append rate; restores marked on every time axis. Opens offline.
    The page is the same whatever --jobs is.

    Needs matplotlib (the `audit` extra).
    """
    if importlib.util.find_spec("matplotlib") is None:
        raise CliUsageError(
            "report needs matplotlib, which is not installed",
            hint="pip install 'eventlog[audit]'",
        )
    refuse_writing_onto_log(target, output)
    with contextlib.ExitStack() as stack:
        log = stack.enter_context(open_log(target))
        run = RunLog(log)  # the one head read: a writer may append meanwhile
        painters = _painters(stack, run.head, jobs)
        pic = gather(log, run)
        if pic.stats is None or not pic.stats.by_agent_task:
            raise CliUsageError(f"{shown_target(target)}: no rollout-recovery records to plot")
        drawn = None if painters is None else painters.map([(n, pic) for n, _ in PLOTS])
        page = render(target, pic, drawn)
    with writing_output(output):
        output.write_text(page, encoding="utf-8")
    stdout_console().print(f"wrote {output} ({len(page) / 1024:,.0f} KiB, {len(PLOTS)} plots)")


def _painters(stack: contextlib.ExitStack, records: int, jobs: int | None) -> Workers[str] | None:
    """Painter processes, started now, or None: drawn here (asked to, a short log, one CPU,
    or event types no other process can import by name: a painter checks it decodes as
    this process does, as every worker does)."""
    wanted = min(default_jobs(), 2) if jobs is None and records >= WORTH_PAINTERS else jobs
    vocabulary = portable_vocabulary()
    if wanted is None or wanted < 2 or vocabulary is None:
        return None
    painters = stack.enter_context(Workers(min(wanted, 2), vocabulary, _painter_setup, _draw_task))
    painters.start()
    return painters
