"""The fleet's picture in a real browser (Debian's Chromium, headless, from `make
chromium`): the issue's twelve-node fleet as `dradriver fleet --html` writes it, laid out
and painted by the browser. The DOM it builds has a row per node and a cell per GPU with
the claim and pod in its title; the screenshot has the stranded GPUs' colour over 24
cells' area and the allocated GPUs' over 72."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from dradriver.diagnose.fleet_page import COLOURS, page
from dradriver.diagnose.fleet_picture import picture
from tests.support.fleet import twelve
from tests.support.png import colours

from .helpers import debian_package

CELL = 22  # the page's cell size in CSS pixels (its border is grey)


@dataclass(frozen=True)
class Chromium:
    root: Path

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Chromium headless with its libraries from the unpacked packages (for it alone:
        nothing else this process starts should load them)."""
        libs = (
            f"{self.root}/usr/lib/x86_64-linux-gnu:{self.root}/usr/lib/x86_64-linux-gnu/pulseaudio"
        )
        # --no-sandbox: the tests run as root, where Chromium's sandbox will not start.
        return subprocess.run(
            [
                str(self.root / "usr/lib/chromium/chromium"),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "LD_LIBRARY_PATH": libs},
        )


@pytest.fixture(scope="module")
def chromium() -> Chromium:
    return Chromium(debian_package("chromium"))


def rgb(hex_colour: str) -> tuple[int, int, int]:
    return (int(hex_colour[1:3], 16), int(hex_colour[3:5], 16), int(hex_colour[5:7], 16))


def test_the_twelve_node_fleet_in_a_browser(chromium: Chromium, tmp_path: Path) -> None:
    f = twelve()
    html = tmp_path / "fleet.html"
    html.write_text(page(picture(f.world, f.report, f.claims), f.report))
    dom = chromium.run("--dump-dom", html.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert dom.stdout.count('<tr data-node="') == 12
    assert dom.stdout.count('class="cell ') == 96
    assert dom.stdout.count('data-state="stranded"') == 24
    assert 'title="gpu-' in dom.stdout and "team/n11-train-b" in dom.stdout
    assert "24 stranded GPUs, 60.00 an hour" in dom.stdout
    shot = tmp_path / "fleet.png"
    done = chromium.run(
        f"--screenshot={shot}", "--window-size=800,520", "--hide-scrollbars", html.as_uri()
    )
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    seen = colours(shot)
    inner = (CELL - 2) ** 2  # a cell's painted area inside its border
    stranded, allocated = seen[rgb(COLOURS["stranded"])], seen[rgb(COLOURS["allocated"])]
    # The legend's swatch adds a little of each colour; the cells are the rest.
    assert 24 * inner <= stranded < 24 * inner + 400, stranded
    assert 72 * inner <= allocated < 72 * inner + 400, allocated
