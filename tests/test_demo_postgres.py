"""`eventlog demo` on PostgreSQL with Ray-actor workers: the whole loop against a real server.

One run of the installed command: TransferQueue on the controller's Ray, rollout workers as
Ray actors (one vLLM engine each) appending their attempt streams straight to PostgreSQL,
the controller SIGKILLed mid-step (the parent stops its Ray processes by PID) and a second
controller restoring from the newest checkpoint. The demo's own checks must pass; here the
log is read back to see that the attempts really ran in actors and that the restore happened.

Like tests/test_demo.py it runs engines in subprocesses only, never beside the session's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from eventlog import EventLog
from eventlog.demo.runner import DemoOptions, DemoRunner
from eventlog.recovery.errors import DemoError
from eventlog.recovery.vocabulary import GenerationStarted, RestoreCompleted
from tests.fixtures.vllm import _unavailable

EVENTLOG = Path(sys.executable).with_name("eventlog")
REPO = Path(__file__).resolve().parents[1]
ARGS = [
    "--steps", "3", "--groups", "2", "--siblings", "2", "--max-tokens", "8", "--slots", "4",
    "--kill-after-seals", "1", "--no-faults",
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.tq
@pytest.mark.postgres
def test_demo_on_postgresql_with_ray_actor_workers_restores_after_a_sigkill_and_passes(
    fresh_postgres_url: str, tmp_path: Path
) -> None:
    try:
        import vllm  # noqa: F401
    except Exception as exc:
        _unavailable(f"import vllm failed: {type(exc).__name__}: {exc}")
    env = {
        **os.environ,
        "EVENTLOG_TINY_MODEL_DIR": os.environ.get(
            "EVENTLOG_TINY_MODEL_DIR", str(REPO / ".cache" / "tiny-model")
        ),
        "TORCHINDUCTOR_CACHE_DIR": os.environ.get(
            "TORCHINDUCTOR_CACHE_DIR", str(REPO / ".cache" / "torchinductor")
        ),
    }
    command = [
        str(EVENTLOG), "demo", "--db", fresh_postgres_url, "--run-dir", str(tmp_path),
        "--data-plane", "transferqueue", "--workers", "ray", *ARGS,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env, cwd=REPO)

    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    assert "eventlog demo passed" in done.stdout
    assert "SIGKILLed at seq" in done.stdout
    with EventLog.open(fresh_postgres_url, create=False) as log:
        records = list(log.read())
        assert log.verify().problems == []
    assert any(isinstance(r.event, RestoreCompleted) for r in records)
    workers = {r.event.worker for r in records if isinstance(r.event, GenerationStarted)}
    assert workers and all(w.startswith("demo-actor") for w in workers)


class _Quiet:
    def phase(self, message: str) -> None:
        pass

    def record(self, record: object) -> None:
        pass


def test_ray_workers_without_transferqueue_are_refused_before_anything_starts(
    tmp_path: Path,
) -> None:
    options = DemoOptions(
        target=str(tmp_path / "run.db"),
        run_dir=tmp_path,
        model_dir=tmp_path / "no-model",
        workers="ray",
    )
    with pytest.raises(DemoError, match=r"--workers ray.*TransferQueue"):
        DemoRunner(options, _Quiet()).run()
    assert not (tmp_path / "run.db").exists()
