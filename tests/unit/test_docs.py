"""The README stays a user's page, and every page under docs/ is in the MkDocs nav."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _nav_pages(nav: list) -> set[str]:
    pages: set[str] = set()
    for entry in nav:
        for value in (entry.values() if isinstance(entry, dict) else [entry]):
            pages |= _nav_pages(value) if isinstance(value, list) else {value}
    return pages


def test_readme_is_short() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


def test_every_docs_page_is_in_the_nav_and_every_nav_entry_exists() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = _nav_pages(config["nav"])
    on_disk = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert nav == on_disk


def test_every_builtin_policy_is_documented() -> None:
    page = (ROOT / "docs" / "policies.md").read_text()
    for path in (ROOT / "policy_engine" / "builtin").glob("*.yaml"):
        for document in yaml.safe_load_all(path.read_text()):
            assert f"`{document['name']}`" in page, document["name"]


def test_readme_links_resolve() -> None:
    text = (ROOT / "README.md").read_text()
    for target in {part.split(")")[0].split("#")[0] for part in text.split("](")[1:]}:
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target
