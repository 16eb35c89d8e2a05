"""The package root: its public names load on first use, each from its home module."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

import eventlog


def test_every_public_name_resolves_from_its_home() -> None:
    """A name in __all__ that the lazy table lacks fails `from eventlog import *`."""
    namespace: dict[str, object] = {}
    exec("from eventlog import *", namespace)
    assert set(eventlog.__all__) <= set(namespace)
    for name in eventlog.__all__:
        home = getattr(namespace[name], "__module__", "eventlog.records")  # ANY, NO_STREAM
        assert home.startswith("eventlog.") and name in vars(sys.modules[home]), name


def test_submodules_and_public_names_are_attributes_of_a_fresh_import() -> None:
    """`import eventlog; eventlog.codec` worked when the root imported its modules eagerly;
    dir() lists the public names before any is used (help(), completion)."""
    probe = "import eventlog; print([eventlog.codec.__name__, 'EventLog' in dir(eventlog)])"
    assert printed_by(probe) == "['eventlog.codec', True]"
    for name in ("no_such_name", ".", "..x", "cli.db"):  # only an identifier names a module
        with pytest.raises(AttributeError, match=f"has no attribute '{re.escape(name)}'"):
            getattr(eventlog, name)


def test_importing_the_root_loads_no_database_library() -> None:
    """What lets the console script catch Ctrl-C before SQLAlchemy loads."""
    libraries = ("sqlalchemy", "msgspec", "click")
    probe = (
        f"import sys, eventlog; print(sorted(m for m in sys.modules if m.startswith({libraries})))"
    )
    assert printed_by(probe) == "[]"


def printed_by(code: str) -> str:
    """What `code` prints in a fresh interpreter (no module of this session loaded)."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return done.stdout.strip()
