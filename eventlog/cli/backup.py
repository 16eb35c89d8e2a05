"""`eventlog backup`: a consistent copy of a log, taken while writers go on, checked after.

SQLite: the online backup API copies the file in one read transaction. PostgreSQL: the
documented `pg_dump --format=custom` recipe (restore with `pg_restore --dbname=NEW DEST`).
The SQLite copy is verified and its anchor printed; keep the anchor: `eventlog verify COPY
--anchor SEQ:CHAIN` then proves a restore is this backup, untruncated.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from eventlog.cli.exits import CliUsageError, ExitCode
from eventlog.cli.targets import open_log, refuse_writing_onto_log, shown_target, writing_output


@click.command()
@click.argument("target")
@click.argument("dest", type=click.Path(dir_okay=False))
@click.pass_context
def backup(ctx: click.Context, target: str, dest: str) -> None:
    """Copy TARGET's log to DEST (a new file), consistently, while writers go on.

    \b
    SQLite: DEST is a log itself (restore: copy it back); it is verified after the copy.
    PostgreSQL: DEST is a pg_dump archive; restore it with
      createdb NEW && pg_restore --no-owner --dbname=postgresql://.../NEW DEST
    then check the restore: eventlog verify postgresql://.../NEW --anchor SEQ:CHAIN
    """
    if not dest:  # Path("") is ".", which "already exists"
        raise CliUsageError("DEST is empty: name the new file to write the backup to")
    copy_to = Path(dest)
    refuse_writing_onto_log(target, copy_to)  # its -journal: every command then failed
    with writing_output(copy_to):  # a folder this user may not search: exit 70
        if copy_to.exists():
            raise CliUsageError(f"{dest}: already exists; a backup never overwrites a file")
        if not copy_to.parent.is_dir():
            raise CliUsageError(f"{dest}: folder {copy_to.parent} does not exist")
    with open_log(target) as log, _staged(copy_to) as staged:
        # Taken before the copy: records are only appended, so the copy holds this anchor.
        seq, chain = log.tail_chain()
        log.backup(staged)
        archive = log.backend != "sqlite"  # (an sqlite:/// URL is a file like a path)
        # Checked before it takes DEST's name: a copy stopped while being verified (Ctrl-C)
        # left a DEST never checked, which a second try then refused to overwrite.
        if not archive:
            with open_log(str(staged)) as copy:
                report = copy.verify()
                held = next(iter(copy.read_records(seq, seq)), None) if seq else None
    anchor = f"{seq}:{chain.hex()}"
    if archive:
        click.echo(f"{dest}: pg_dump archive of {shown_target(target)}; anchor {anchor}")
        return
    if not report.ok or (seq and (held is None or held.chain != chain)):
        click.echo(
            f"{dest}: copied, but the copy fails verify (first bad seq {report.first_bad_seq})",
            err=True,
        )
        ctx.exit(ExitCode.INTEGRITY)
    if not seq:  # no record to anchor to (`verify --anchor` takes a seq of 1 or more)
        click.echo(f"{dest}: 0 records (an empty log: no anchor to check a restore against)")
        return
    click.echo(
        f"{dest}: {report.records} records, head seq {report.head}, anchor {anchor} "
        f"(check a restore with `eventlog verify COPY --anchor {anchor}`)"
    )


@contextmanager
def _staged(dest: Path) -> Iterator[Path]:
    """Where to copy: a new folder beside DEST, so a copy that fails leaves nothing behind
    and one that completes takes DEST's name at once, by a hard link (a DEST made meanwhile
    is not overwritten; a rename where the file system has no links). A DEST that cannot be
    written is one line naming it (the driver's error named the source log)."""
    with writing_output(dest):
        folder = Path(tempfile.mkdtemp(prefix=".eventlog-backup-", dir=dest.parent))
    try:
        yield folder / dest.name
        try:
            os.link(folder / dest.name, dest)
        except FileExistsError:
            raise CliUsageError(
                f"{dest}: already exists; a backup never overwrites a file"
            ) from None
        except OSError:
            with writing_output(dest):
                (folder / dest.name).rename(dest)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
