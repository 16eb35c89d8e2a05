"""The import-layer contract: the log core stands alone, folds stay pure, no private reach-through.

Run by `make lint` too. The layers, top to bottom:
- domain: eventlog.recovery, eventlog.dataplane, eventlog.rollout, eventlog.demo, integrations;
- projections: pure folds over the vocabulary (eventlog.events, eventlog.recovery.vocabulary);
- core: everything else under eventlog/ (events base, codec, store, writer, log, verify, CLI).
Arrows point down only.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOMAIN = ("eventlog.recovery", "eventlog.dataplane", "eventlog.rollout", "eventlog.demo")
PLUGINS = ("eventlog.integrations",)
PURE_FOLD_IMPORTS = ("eventlog.events", "eventlog.recovery.vocabulary", "projections", "msgspec")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files(package: str) -> Iterator[Path]:
    yield from sorted((ROOT / package).rglob("*.py"))


def imports_of(path: Path) -> Iterator[tuple[int, str]]:
    """Every module a file imports (absolute names), with its line."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
            for alias in node.names:
                yield node.lineno, f"{node.module}.{alias.name}"


def within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def core_files() -> Iterator[Path]:
    for path in source_files("eventlog"):
        if not within(module_name(path), DOMAIN + PLUGINS):
            yield path


def test_the_log_core_imports_nothing_of_the_domain() -> None:
    offences = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in core_files()
        for line, name in imports_of(path)
        if within(name, (*DOMAIN, *PLUGINS, "projections", "yaml"))
    ]
    assert offences == []


def test_projections_import_only_the_vocabulary() -> None:
    offences = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in source_files("projections")
        for line, name in imports_of(path)
        if name.split(".")[0] in {"eventlog", "sqlalchemy", "yaml", "torch", "ray"}
        and not within(name, PURE_FOLD_IMPORTS)
    ]
    assert offences == []


def test_importing_eventlog_loads_only_the_log() -> None:
    probe = (
        "import eventlog, sys; "
        "loaded = set(sys.modules); "
        "print(sorted(m for m in loaded if m == 'yaml' or m.startswith("
        "('projections', 'eventlog.recovery', 'eventlog.rollout', 'eventlog.dataplane'))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert done.stdout.strip() == "[]"


def _private_members_defined(tree: ast.Module) -> set[str]:
    """Private names a module defines on its own classes (methods and `self._x = …`)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("_"):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def private_reach_through(path: Path) -> Iterator[str]:
    """`obj._member` where `_member` is not defined by a class of the same module."""
    tree = ast.parse(path.read_text(), filename=str(path))
    own = _private_members_defined(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        attr = node.attr
        if not attr.startswith("_") or attr.startswith("__") or attr in own:
            continue
        if isinstance(node.value, ast.Name) and node.value.id in {"self", "cls", "sys", "os"}:
            continue
        yield f"{path.relative_to(ROOT)}:{node.lineno} .{attr}"


@pytest.mark.parametrize("package", ["eventlog", "projections", "bench"])
def test_no_module_reaches_into_another_class_private_members(package: str) -> None:
    offences = [hit for path in source_files(package) for hit in private_reach_through(path)]
    assert offences == []


@pytest.mark.parametrize("module", ["checkpoint", "restore", "replay_ownership"])
def test_what_the_ledger_commits_does_not_import_the_ledger(module: str) -> None:
    """No circle: checkpoint, restore and replay ownership return events; the ledger commits."""
    path = ROOT / "eventlog" / "recovery" / f"{module}.py"
    assert [n for _, n in imports_of(path) if within(n, ("eventlog.recovery.ledger",))] == []
