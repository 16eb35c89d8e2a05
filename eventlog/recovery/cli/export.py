"""`eventlog export` with rolled-back records marked: `records.rolled_back_by` holds the seq
of the restore that rolled a record back (null for records that count)."""

from __future__ import annotations

from eventlog.cli.export import make_export
from eventlog.recovery.cli.replay import RolledBackMarker

export = make_export(RolledBackMarker())
