"""Every relative link of README.md and docs/**/*.md names a file that exists, and a
``#fragment`` names a heading of that page (as GitHub and mkdocs spell them)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])

_CODE = re.compile(r"^```.*?^```[ \t]*$|`[^`\n]*`", re.M | re.S)
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*$", re.M)


def slug(heading: str) -> str:
    """A heading's anchor: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]", "", heading).strip().lower()
    text = re.sub(r"[^\w\s-]", "", text)
    return re.sub(r"\s", "-", text)


def anchors(page: Path) -> set[str]:
    text = _CODE.sub("", page.read_text())
    return {slug(h) for h in _HEADING.findall(text)}


def links(page: Path) -> list[str]:
    text = _CODE.sub("", page.read_text())  # a link shown as code is not one
    return [t for t in _LINK.findall(text) if not re.match(r"[a-z]+:", t)]


def test_the_slugs_are_github_s_and_mkdocs_s() -> None:
    assert slug("Stores and what each promises") == "stores-and-what-each-promises"
    assert slug("Your own app: `inline`") == "your-own-app-inline"
    assert slug("FastAPI and Starlette") == "fastapi-and-starlette"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_each_relative_link_names_a_file_and_heading_that_exist(page: Path) -> None:
    broken = []
    for target in links(page):
        path, _, fragment = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif fragment and file.suffix == ".md" and fragment not in anchors(file):
            broken.append(f"{target}: no heading #{fragment} in {file.relative_to(ROOT)}")
    assert broken == []
