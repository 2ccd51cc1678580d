"""The README and docs/ hold together: every relative link names a file that exists and,
where it names a heading, a heading that exists (GitHub's anchors), and the README stays
what a newcomer reads first (under 300 lines; the rest is in docs/)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def headings(page: Path) -> set[str]:
    return {
        anchor(re.sub(r"^#+ ", "", line))
        for line in page.read_text().splitlines()
        if re.match(r"^#{1,4} ", line)
    }


def test_every_relative_link_resolves() -> None:
    broken = []
    for page in PAGES:
        for link in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if link.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, frag = link.partition("#")
            target = (page.parent / path).resolve() if path else page
            if not target.exists():
                broken.append(f"{page.name}: {link} (no such file)")
            elif frag and target.suffix == ".md" and frag not in headings(target):
                broken.append(f"{page.name}: {link} (no such heading)")
    assert broken == []


def test_the_readme_is_short_and_points_at_each_page() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) < 300
    for page in PAGES[1:]:
        assert f"(docs/{page.name})" in readme, page.name
