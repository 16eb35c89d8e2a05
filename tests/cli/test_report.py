"""`eventlog report`: one self-contained HTML page whose every plot draws in a real browser.

The page is opened by headless Chromium (Debian's `chromium`, started here), offline (every
host name resolves to nothing); the page's own check counts the plots whose SVG has a
visible box and drawn paths, and Chromium's log must hold no console message at all.
"""

from __future__ import annotations

import gc
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sized
from pathlib import Path
from typing import Any, cast

import msgspec
import pytest
from matplotlib.axes import Axes
from matplotlib.collections import LineCollection
from matplotlib.patches import StepPatch

from eventlog.recovery.cli.report import RunPicture, plot_gantt, plot_rate, plot_steps
from projections.audit_stats import AuditReport, KeyReport, LatencySummary, StepReport
from tests.cli.audited_run import AuditedRun, train, work
from tests.cli.helpers import cli, collector_states_at_fold, run_installed
from tests.fixtures.ledger import Harness

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def chromium() -> str:
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("CI must have chromium (.ci/run installs Debian's package)")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return CHROMIUM


def page_check(page: Path, tmp_path: Path) -> dict[str, str]:
    """What the page's own check found in Chromium (plots, drawn, clipped, errors); no
    console message either."""
    dom, log = open_in_chromium(page, tmp_path)
    body = re.search(r"<body([^>]*)>", dom)
    assert body is not None, dom[:500]
    assert ":CONSOLE" not in log, [line for line in log.splitlines() if ":CONSOLE" in line]
    return dict(re.findall(r'data-(\w+)="(\d+)"', body.group(1)))


def open_in_chromium(page: Path, tmp_path: Path) -> tuple[str, str]:
    """The DOM after the page loaded, and Chromium's log (console messages included)."""
    done = subprocess.run(
        [
            chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            f"--user-data-dir={tmp_path / 'chromium-profile'}",
            "--host-resolver-rules=MAP * ~NOTFOUND",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=5000",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, done.stderr


def test_report_is_self_contained_and_every_plot_draws_in_chromium(
    run: AuditedRun, tmp_path: Path
) -> None:
    page = tmp_path / "run.html"
    result = cli("report", run.path, "-o", str(page))
    assert result.exit_code == 0, result.stderr
    text = page.read_text()
    assert not re.search(r"<(script|link|img|iframe)[^>]*\s(src|href)=", text)
    assert "url(http" not in text and "@import" not in text
    figures = re.findall(r'<figure class="plot" data-plot="([a-z-]+)"><svg', text)
    assert figures == ["lifecycles", "steps", "staleness", "append-rate"]
    assert text.count("restore") >= 3  # marked on the plots' legends

    assert page_check(page, tmp_path) == {"plots": "4", "drawn": "4", "clipped": "0", "errors": "0"}


def test_no_text_of_a_plot_is_cut_off_by_a_long_group_id(harness: Harness, tmp_path: Path) -> None:
    """The margins are sized from what the axes hold (no layout engine measures the texts):
    a long group id on the Gantt's axis still fits in the picture."""
    group_id = "rollout-group-with-a-rather-long-name-0000000017"
    harness.reserve(group_id, n=2, agent="math_agent", task="math", target_step=1)
    harness.dispatch(group_id)
    for index in range(2):
        work(harness, group_id, index)
    train(harness, group_id, 1)
    harness.checkpoint(1)
    page = tmp_path / "run.html"
    result = cli("report", str(harness.path), "-o", str(page))
    assert result.exit_code == 0, result.stderr
    assert group_id in page.read_text()
    assert page_check(page, tmp_path) == {"plots": "4", "drawn": "4", "clipped": "0", "errors": "0"}


def test_the_same_log_gives_the_same_page_byte_for_byte(run: AuditedRun, tmp_path: Path) -> None:
    """No date and no random ids in the plots: an auditor can compare two reports' bytes."""
    pages = [tmp_path / "a.html", tmp_path / "b.html"]
    for page in pages:
        result = cli("report", run.path, "-o", str(page))
        assert result.exit_code == 0, result.stderr
    assert pages[0].read_bytes() == pages[1].read_bytes()


@pytest.fixture
def painters(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of painters of each pool `report` starts."""
    return _painters_and_when(monkeypatch)[0]


def _painters_and_when(monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], list[str]]:
    """The painters of each pool `report` starts, and the order of what it does
    ("pool", "start", "pass")."""
    from eventlog.cli import workers
    from eventlog.recovery.cli import report as module

    started: list[int] = []
    steps: list[str] = []

    class Counted(workers.Workers[Any]):
        def __init__(self, jobs: int, *args: Any) -> None:
            started.append(jobs)
            steps.append("pool")
            super().__init__(jobs, *args)

        def start(self) -> None:
            steps.append("start")
            super().start()

    def gather(*args: Any) -> RunPicture:
        steps.append("pass")
        return module_gather(*args)

    module_gather = module.gather
    monkeypatch.setattr(module, "Workers", Counted)
    monkeypatch.setattr(module, "gather", gather)
    return started, steps


@pytest.mark.parametrize("jobs", ["2", "3"])
def test_painters_draw_the_page_one_process_draws_byte_for_byte(
    run: AuditedRun, tmp_path: Path, painters: list[int], jobs: str
) -> None:
    """Plots drawn in other processes (matplotlib set up there as here) make the same page;
    more than two painters would find nothing to draw."""
    pages = {n: tmp_path / f"{n}.html" for n in ("1", jobs)}
    for n, page in pages.items():
        result = cli("report", run.path, "-o", str(page), "--jobs", n)
        assert result.exit_code == 0, result.stderr
    assert painters == [2]
    assert pages["1"].read_bytes() == pages[jobs].read_bytes()


def test_painters_start_before_the_log_is_read(
    run: AuditedRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """They import matplotlib while this process reads the log, not after."""
    started, steps = _painters_and_when(monkeypatch)
    result = cli("report", run.path, "-o", str(tmp_path / "r.html"), "--jobs", "2")
    assert result.exit_code == 0, result.stderr
    assert (started, steps) == ([2], ["pool", "start", "pass"])


def test_event_types_no_painter_can_import_are_drawn_here(
    run: AuditedRun, tmp_path: Path, painters: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A painter checks it decodes as this process does, as every worker does: where the
    vocabulary cannot be named for it (a type defined in __main__), none is started."""
    from eventlog.recovery.cli import report as module

    monkeypatch.setattr(module, "portable_vocabulary", lambda: None)
    result = cli("report", run.path, "-o", str(tmp_path / "r.html"), "--jobs", "2")
    assert result.exit_code == 0, result.stderr
    assert painters == []


def test_painters_are_started_for_a_long_log_unless_told_not_to(
    run: AuditedRun, tmp_path: Path, painters: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Painters cost a second of CPU each to start: from WORTH_PAINTERS records on, where
    the log's read outlasts that, and never on one CPU."""
    from eventlog.recovery.cli import report as module

    def report(*args: str) -> None:
        result = cli("report", run.path, "-o", str(tmp_path / "r.html"), *args)
        assert result.exit_code == 0, result.stderr

    report()
    assert painters == []
    monkeypatch.setattr(module, "WORTH_PAINTERS", 1)
    report()
    report("--jobs", "1")
    assert painters == [2]
    monkeypatch.setattr(module, "default_jobs", lambda: 1)
    report()
    assert painters == [2]


def test_report_of_a_log_without_recovery_records_is_a_usage_error(
    tmp_path: Path, log_file: str
) -> None:
    from tests.cli.helpers import append_notes

    append_notes(log_file, 2)
    result = cli("report", log_file, "-o", str(tmp_path / "x.html"))
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0].endswith("no rollout-recovery records to plot")
    assert not (tmp_path / "x.html").exists()


def test_report_without_matplotlib_is_a_usage_error_naming_the_extra(
    run: AuditedRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an import then finds: none
    result = cli("report", run.path, "-o", str(tmp_path / "r.html"))
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0].endswith("report needs matplotlib, which is not installed")
    assert "eventlog[audit]" in result.stderr
    assert not (tmp_path / "r.html").exists()


def test_report_refuses_to_write_over_the_log(run: AuditedRun) -> None:
    before = Path(run.path).read_bytes()
    result = cli("report", run.path, "-o", run.path)
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0].endswith("a read command never writes to the log it reads")
    assert Path(run.path).read_bytes() == before


def test_the_gantt_ends_a_group_only_when_its_leaving_counts() -> None:
    """A group that left the ledger in records a restore rolled back is still open."""
    from eventlog.recovery.cli.report import RunPicture, _gantt
    from eventlog.recovery.vocabulary import GroupDiscarded, GroupFinalized

    pic = RunPicture(groups={"g1": (10, None), "g2": (11, None)})
    watch = _gantt(pic)
    finalized = GroupFinalized(
        group_id="g1",
        owner="o",
        prompt_id="p",
        target_step=1,
        canonical_row_ids=["r"],
        min_weight_version=0,
    )
    watch[GroupFinalized](finalized, 20, False)
    assert pic.groups == {"g1": (10, None), "g2": (11, None)}
    watch[GroupFinalized](finalized, 30, True)
    assert pic.groups == {"g1": (10, 30), "g2": (11, None)}
    assert watch[GroupDiscarded] is watch[GroupFinalized]


def test_a_report_path_that_cannot_be_written_is_one_line_naming_it(
    run: AuditedRun, tmp_path: Path
) -> None:
    out = tmp_path / "missing" / "run.html"
    result = cli("report", run.path, "-o", str(out))
    assert result.exit_code == 2, result.stderr
    assert result.stderr.splitlines()[0] == (
        f"error: {out}: cannot write it: No such file or directory"
    )


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_backend_matplotlib_refuses_in_the_environment_draws_the_page_all_the_same(
    run: AuditedRun, tmp_path: Path, jobs: str
) -> None:
    """The page is drawn to SVG through no backend: MPLBACKEND=nonsense failed matplotlib's
    import, exit 70 (in the command's process, or in every painter)."""
    page = tmp_path / "run.html"
    done = run_installed("report", run.path, "-o", str(page), "--jobs", jobs, MPLBACKEND="nonsense")
    assert done.returncode == 0, done.stderr
    assert page.read_text().count('<figure class="plot"') == 4


def test_an_empty_report_path_is_refused(run: AuditedRun) -> None:
    """Path('') is the current folder: `-o ''` (an unset variable in a script) failed only
    when writing, naming '.'."""
    result = cli("report", run.path, "-o", "")
    assert result.exit_code == 2 and "is empty" in result.output


def test_the_report_s_pass_runs_with_the_cyclic_collector_paused(
    run: AuditedRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As for `stats` (the same fold); the collector is on again afterwards."""
    seen = collector_states_at_fold(monkeypatch)
    assert gc.isenabled()
    result = cli("report", run.path, "-o", str(tmp_path / "run.html"))
    assert result.exit_code == 0, result.stderr
    assert seen == [False]
    assert gc.isenabled()


def test_margins_leave_room_for_what_an_axis_holds_and_no_more() -> None:
    """The left margin grows with the tick labels and a y label, up to 4 in (a group id of
    any length leaves the plot most of the width); numbers from a million on are written
    scaled (short labels); an axis of zeros is labelled ±0.04."""
    from eventlog.recovery.cli import report

    def left(chars: int, **kw: Any) -> float:
        fig = report._figure(3.0)
        report._place(fig, chars, **kw)
        return float(fig.subplotpars.left) * report.WIDTH_IN

    assert left(5, ylabel=True) > left(5) + 0.25
    assert left(20) > left(5)
    assert left(10_000, points=7) == pytest.approx(4.2)
    assert report._number_chars([3_000_000]) < report._number_chars([999_999])
    assert report._number_chars([0]) == len("−0.04")


def _zeros(cls: type[msgspec.Struct], **given: Any) -> Any:
    """A report struct with every field not given 0."""
    values = {f.name: 0 for f in msgspec.structs.fields(cls) if f.name not in given}
    return cls(**values, **given)


def _picture(steps: list[StepReport]) -> RunPicture:
    latency = LatencySummary(count=0, p50_ms=None, p90_ms=None, p99_ms=None, max_ms=None)
    total = _zeros(KeyReport, agent_name=None, task_name=None, generation_latency=latency)
    return RunPicture(stats=_zeros(AuditReport, by_agent_task=[], total=total, by_step=steps))


def test_the_steps_plot_of_a_long_run_draws_one_artist_per_series_and_a_dozen_ticks() -> None:
    """A weeks-long run trains thousands of steps: a bar and a tick label per step took
    seconds to draw from 400 steps on, and the labels ran into one black band. A step the
    report lacks draws as zero."""
    numbers = [n for n in range(2000) if n != 5]
    steps = [
        _zeros(
            StepReport,
            step=n,
            staleness={},
            retries=n % 3,
            failed=n % 2,
            tokens_trained=10 * n,
            tokens_thrown_away=n,
            restores=int(n == 700),
        )
        for n in numbers
    ]
    fig = plot_steps(_picture(steps))
    left, right = fig.axes
    for ax in (left, right):
        assert 2 <= len(ax.get_xticks()) <= 13
        assert ax.get_ylim()[0] == 0  # counts: no margin below zero
        assert [type(p) for p in ax.patches] == [StepPatch, StepPatch]  # one per series
        assert _marks(ax, "step with a restore") == [700]
    patches = [p for ax in (left, right) for p in ax.patches if isinstance(p, StepPatch)]
    (retries, _, _), _, (trained, _, _), (_, _, stacked_on) = (p.get_data() for p in patches)
    assert list(trained) == [0 if n == 5 else 10 * n for n in range(2000)]
    assert list(cast(Iterable[float], stacked_on)) == list(trained)
    assert list(retries)[4:7] == [1, 0, 0]  # step 5 lacks: zero


def test_thousands_of_checkpoints_and_restores_are_one_artist_each_on_a_time_axis() -> None:
    """An `axvline` per checkpoint: 5,000 checkpoints took 11 s to draw the rate plot alone."""
    picture = _picture([])
    picture.first_ns, picture.last_ns = 0, 10**12
    picture.checkpoints = [(i * 2 * 10**8, i) for i in range(5000)]
    picture.restores = [i * 10**10 for i in range(50)]
    for fig in (plot_rate(picture), plot_gantt(picture)):
        (ax,) = fig.axes
        assert _marks(ax, "checkpoint") == [i * 2 * 10**8 / 1e9 for i in range(5000)]
        assert _marks(ax, "restore") == [i * 10.0 for i in range(50)]
        assert not [line for line in ax.lines if len(cast(Sized, line.get_xydata())) == 2]
        legend = ax.get_legend()
        assert legend is not None
        assert {"checkpoint", "restore"} <= {text.get_text() for text in legend.get_texts()}


def _marks(ax: Axes, label: str) -> list[float]:
    """Where the one collection labelled `label` marks the axes (one artist per kind)."""
    (marks,) = [c for c in ax.collections if c.get_label() == label]
    assert isinstance(marks, LineCollection)
    return [float(segment[0][0]) for segment in marks.get_segments()]


def test_a_log_whose_records_share_one_timestamp_draws_no_rate() -> None:
    """The rate was the record count over 1 ns: 10^13 records/s, drawn as if measured."""
    picture = _picture([])
    picture.first_ns = picture.last_ns = 1_800_000_000 * 10**9
    picture.rate = [0] * len(picture.rate)
    picture.rate[0] = 1000
    (ax,) = plot_rate(picture).axes
    assert not ax.lines
    (said,) = [text.get_text() for text in ax.texts]
    assert said.startswith("no rate to draw: the last record is not timed after the first")


@pytest.mark.parametrize("numbers", [[7], []])
def test_a_run_of_one_step_or_none_has_whole_step_ticks(numbers: list[int]) -> None:
    """(Found by review: with fewer than two whole steps in view the axis read 6.4 ... 7.6.)"""
    steps = [_zeros(StepReport, step=n, staleness={}, retries=1) for n in numbers]
    for ax in plot_steps(_picture(steps)).axes:
        low, high = ax.get_xlim()
        shown = [float(t) for t in ax.get_xticks() if low <= t <= high]
        assert shown and all(t.is_integer() for t in shown), shown


def _one_group_run(h: Harness, group_id: str, steps: tuple[int, ...] = (1,)) -> None:
    """`group_id` trained in the first of `steps`, then a group per further step."""
    for i, step in enumerate(steps):
        gid = group_id if i == 0 else f"later{i}"
        h.reserve(gid, n=1, agent="math_agent", task="math", target_step=step)
        h.dispatch(gid)
        work(h, gid, 0)
        train(h, gid, step)
        h.checkpoint(step)


@pytest.mark.parametrize("group_id", ["cost_$5_to_$10", "g$x^2$"])
def test_a_dollar_in_a_group_id_is_drawn_as_it_is_not_as_a_formula(
    harness: Harness, tmp_path: Path, group_id: str
) -> None:
    """matplotlib reads text between two `$` as a formula: a parse error (exit 70), or the
    id drawn as math."""
    _one_group_run(harness, group_id)
    page = tmp_path / "run.html"
    result = cli("report", str(harness.path), "-o", str(page))
    assert result.exit_code == 0, result.stderr
    assert f">{group_id}<" in page.read_text()


def test_a_control_character_in_a_group_id_reaches_neither_page_nor_terminal(
    harness: Harness, tmp_path: Path
) -> None:
    """Drawn quoted as JSON text, as the other commands print it; matplotlib's warning of a
    glyph its font lacks printed the id raw on stderr."""
    _one_group_run(harness, "g\x1b[31mred\x07")
    page = tmp_path / "run.html"
    result = run_installed("report", str(harness.path), "-o", str(page))
    assert result.returncode == 0, result.stderr
    text = page.read_text()
    assert "\x1b" not in text + result.stderr and "\x07" not in text + result.stderr
    assert "g\\u001b[31mred\\u0007" in text
    assert "Warning" not in result.stderr


def test_the_steps_plot_follows_the_steps_in_the_log_not_the_span_of_their_numbers(
    harness: Harness, tmp_path: Path
) -> None:
    """A run that jumped from step 1 to step 100,000 drew a bin per step between (12 MB of
    SVG and seconds per 10^5 steps; minutes at 10^6)."""
    _one_group_run(harness, "g1", steps=(1, 100_000))
    page = tmp_path / "run.html"
    result = cli("report", str(harness.path), "-o", str(page))
    assert result.exit_code == 0, result.stderr
    steps = re.search(r'data-plot="steps">(.*?)</figure>', page.read_text(), re.S)
    assert steps is not None and len(steps.group(1)) < 100_000


def test_a_character_the_font_lacks_is_no_warning_on_stderr(
    harness: Harness, tmp_path: Path
) -> None:
    """matplotlib warns of each glyph its font lacks, printing the text it drew."""
    _one_group_run(harness, "g中文")
    page = tmp_path / "run.html"
    result = run_installed("report", str(harness.path), "-o", str(page))
    assert result.returncode == 0, result.stderr
    assert "Warning" not in result.stderr and "中" not in result.stderr
    assert ">g中文<" in page.read_text()
