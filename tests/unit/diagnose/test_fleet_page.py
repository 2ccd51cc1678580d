"""The fleet's page is self-contained (nothing fetched, no script) and says what the
picture holds: a cell per GPU with its state, the claim and pod in its title, the
stranded total and its cost at the top. (tests/e2e/test_fleet_picture.py opens it in a
real browser.)"""

from __future__ import annotations

import re
from html.parser import HTMLParser

from dradriver.diagnose.fleet_page import page
from dradriver.diagnose.fleet_picture import picture
from tests.support.fleet import twelve


class Cells(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.cells: list[dict[str, str]] = []
        self.tags: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        a = {k: v or "" for k, v in attrs}
        if "cell" in a.get("class", "").split():
            self.cells.append(a)


def test_the_page_holds_every_gpu_and_fetches_nothing() -> None:
    f = twelve()
    html = page(picture(f.world, f.report, f.claims), f.report)
    parsed = Cells()
    parsed.feed(html)
    assert len(parsed.cells) == 96
    assert sum(c["data-state"] == "stranded" for c in parsed.cells) == 24
    assert "team/n03-b" in parsed.cells[3 * 8 + 4]["title"]
    assert "team/n03-train-b" in parsed.cells[3 * 8 + 4]["title"]
    assert "24 stranded GPUs, 60.00 an hour" in html
    assert not {"script", "img", "link", "iframe"} & parsed.tags
    assert not re.search(r"(src|href)=|url\(|@import|https?:", html)
