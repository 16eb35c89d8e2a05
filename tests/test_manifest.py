"""The manifest is honest: every third-party module the code imports is declared in pyproject.

A package that only arrives because another one depends on it today can leave with that
package's next release, and a clean install of the extra that needs it breaks.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIRST_PARTY = {"eventlog", "projections", "bench", "tests", "migrations", "__future__"}
SCANNED = ("eventlog", "projections", "bench", "tests", "migrations")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared_distributions() -> set[str]:
    """Names in `dependencies` and every extra of pyproject.toml, canonicalised."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        specs.extend(extra)
    names = set()
    for spec in specs:
        found = re.match(r"[A-Za-z0-9._-]+", spec)
        assert found, spec
        names.add(_canonical(found.group()))
    return names


def third_party_imports() -> Iterator[tuple[str, str]]:
    """(top-level module, where) for every absolute import of a non-stdlib, non-project module."""
    for package in SCANNED:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in FIRST_PARTY and top not in sys.stdlib_module_names:
                        yield top, f"{path.relative_to(ROOT)}:{node.lineno}"


def test_every_imported_third_party_module_is_declared_in_pyproject() -> None:
    declared = declared_distributions()
    providers = metadata.packages_distributions()
    undeclared = sorted(
        f"{where} imports {module} (from {providers.get(module, ['nothing installed'])})"
        for module, where in third_party_imports()
        if not any(_canonical(d) in declared for d in providers.get(module, []))
    )
    assert undeclared == []
