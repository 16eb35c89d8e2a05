"""What an audit command loads on start: only what it uses.

A command's start is most of `inspect group` and `state --at` (issue 10: under 1 s on a
10^6-record log), and most of that start was imports of libraries the command never ran:
alembic (with mako and pygments) to compare one revision string. Each command runs in a
fresh interpreter here, and the modules it loaded are listed when it is done.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from eventlog.recovery.vocabulary import GroupReserved
from tests.cli.audited_run import AuditedRun
from tests.cli.helpers import REPO

PROBE = """
import json, sys
from eventlog.cli.main import main
sys.argv = ["eventlog", *sys.argv[1:]]
try:
    main()
except SystemExit as exit:
    code = exit.code
sys.stdout.flush()
print("\\nMODULES " + json.dumps(sorted(sys.modules)), file=sys.stderr)
sys.exit(code)
"""


def probed(*args: str) -> subprocess.CompletedProcess[str]:
    """`eventlog ARGS` in a fresh interpreter that lists its loaded modules on stderr."""
    return subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )


def loaded_by(*args: str) -> set[str]:
    """The modules `eventlog ARGS` had loaded when it finished (it must succeed)."""
    done = probed(*args)
    assert done.returncode == 0, done.stderr
    marker = done.stderr.rindex("MODULES ")
    return set(json.loads(done.stderr[marker + len("MODULES ") :]))


def packages(modules: set[str]) -> set[str]:
    return {name.partition(".")[0] for name in modules}


def a_group(run: AuditedRun) -> str:
    for record in run.h.log.read():
        if isinstance(record.event, GroupReserved):
            return record.event.group_id
    raise AssertionError("the audited run reserves no group")


NOT_AT_START = {"alembic", "mako", "pygments"}
"""Schema migration tooling: a log found at head needs none of it."""


@pytest.mark.parametrize("command", ["inspect group", "state --at", "replay --json", "stats"])
def test_audit_commands_at_head_load_no_migration_tooling(run: AuditedRun, command: str) -> None:
    args = {
        "inspect group": ["inspect", "group", run.path, a_group(run)],
        "state --at": ["state", run.path, "--at", str(run.checkpoint_1)],
        "replay --json": ["replay", run.path, "--json"],
        "stats": ["stats", run.path],
    }[command]
    assert packages(loaded_by(*args)) & NOT_AT_START == set()


def test_a_log_off_head_is_still_judged_by_alembic(run: AuditedRun) -> None:
    """The fast path decides only "at head"; anything else goes to alembic as before."""
    import sqlite3

    run.h.log.close()
    with sqlite3.connect(run.path) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '0003'")
    done = probed("stats", run.path)
    assert done.returncode == 3, done.stderr
    assert "schema revision 0003, this eventlog needs 0004" in done.stderr
    assert '"alembic"' in done.stderr
