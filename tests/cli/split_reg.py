"""Registers `split_defs.SplitNote`: the module a user names with --events-module."""

from __future__ import annotations

from eventlog.events import event_type
from tests.cli.split_defs import SplitNote

event_type(SplitNote)
