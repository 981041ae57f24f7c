"""pyproject.toml declares every distribution the library imports, and pins exactly the ones
whose internals infra/faust_app.py relies on."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYERS = (
    "schemas", "infra", "ingest", "stream_jobs", "policy_engine", "actuators", "dsec", "bench",
)
PINNED_EXACTLY = ("faust-streaming", "mode-streaming", "aiokafka")


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _imported_top_levels() -> set[str]:
    names: set[str] = set()
    for layer in LAYERS:
        for path in (ROOT / layer).rglob("*.py"):
            if any(part.is_symlink() for part in (path, *path.parents) if part != ROOT):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split(".")[0])
    return {name for name in names if name not in sys.stdlib_module_names and name != "dsec"}


def test_every_imported_distribution_is_declared() -> None:
    project = _project()
    declared = {_name(r) for r in project["dependencies"]}
    for extra in project["optional-dependencies"].values():
        declared |= {_name(r) for r in extra}
    distributions = importlib.metadata.packages_distributions()
    missing = sorted(
        f"{module} ({', '.join(distributions.get(module, ['?']))})"
        for module in _imported_top_levels()
        if not {_name(d) for d in distributions.get(module, [module])} & declared
    )
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"


def test_faust_mode_and_aiokafka_are_pinned_to_the_installed_versions() -> None:
    requirements = {_name(r): r for r in _project()["dependencies"]}
    for distribution in PINNED_EXACTLY:
        requirement = requirements[distribution]
        assert "==" in requirement, f"{distribution} must be pinned exactly: {requirement}"
        pinned = requirement.split("==", 1)[1].strip()
        assert importlib.metadata.version(distribution) == pinned
