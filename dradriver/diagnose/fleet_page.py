"""The fleet's picture as one self-contained HTML page (pure): no script, no font, no
image, nothing fetched, so it opens from a file, an air-gapped laptop or the controller's
port alike. One row per node, one cell per GPU coloured by its state; a GPU split into MIG
partitions shows each partition in use as a band; hovering a cell (its title) names the
device, its state, and the claims and pods holding it. The stranded total and its cost an
hour are at the top, as `dradriver fleet` prints them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from html import escape

from dradriver.diagnose.fleet_picture import STATES, Cell, Row
from dradriver.diagnose.fleet_report import FleetReport

# Colours a colour-blind reader can tell apart (Okabe and Ito's palette), named by state.
COLOURS = {
    "allocated": "#0072B2",
    "shared": "#56B4E9",
    "carved": "#009E73",
    "tainted": "#000000",
    "stranded": "#D55E00",
    "free": "#E8E8E8",
    "mig": "#CC79A7",
}
STYLE = """
body{font:14px system-ui,sans-serif;margin:16px;color:#222}
h1{font-size:18px;margin:0 0 4px}
.sum{margin:0 0 12px}
.legend span{display:inline-block;margin-right:12px}
.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-1px}
table{border-collapse:collapse}
td.node{padding:2px 8px 2px 0;font-family:monospace;white-space:nowrap}
.cell{display:inline-flex;flex-direction:column;width:22px;height:22px;margin:1px;
border:1px solid #999;box-sizing:border-box;vertical-align:middle}
.part{flex:1;border-top:1px solid #fff}
""" + "".join(f".{s}{{background:{c}}}" for s, c in COLOURS.items())


def _title(c: Cell) -> str:
    lines = [f"{c.device} ({c.product or 'GPU'}): {c.state}"]
    if c.claims:
        lines.append("claims: " + ", ".join(c.claims))
    if c.pods:
        lines.append("pods: " + ", ".join(c.pods))
    for p in c.parts:
        held = ", ".join(p.claims) + (f" (pods {', '.join(p.pods)})" if p.pods else "")
        lines.append(f"{p.profile} {p.device}: {held}")
    return "\n".join(lines)


def _cell(c: Cell) -> str:
    parts = "".join(
        f'<span class="part carved" title="{escape(p.profile)}: {escape(", ".join(p.claims))}">'
        "</span>"
        for p in c.parts
    )
    return (
        f'<span class="cell {c.state}" data-device="{escape(c.device)}" '
        f'data-state="{c.state}" title="{escape(_title(c))}">{parts}</span>'
    )


def page(rows: Sequence[Row], report: FleetReport, *, title: str = "GPU fleet") -> str:
    counts = Counter(c.state for r in rows for c in r.cells)
    total = sum(counts.values())
    cost = report.cost_per_hour()
    stranded = f"{report.stranded_gpus} stranded GPUs" + (
        f", {cost:.2f} an hour" if cost is not None else ""
    )
    legend = "".join(
        f'<span><i class="{s}"></i>{s} {counts.get(s, 0)}</span>' for s in STATES if counts.get(s)
    )
    body = "".join(
        f'<tr data-node="{escape(r.node)}"><td class="node">{escape(r.node)}</td>'
        f"<td>{''.join(_cell(c) for c in r.cells)}</td></tr>"
        for r in rows
    )
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
        f"<style>{STYLE}</style></head><body>"
        f"<h1>{escape(title)}</h1>"
        f'<p class="sum" id="summary">{total} GPUs on {len(rows)} nodes: '
        f'<b id="stranded">{escape(stranded)}</b></p>'
        f'<p class="legend">{legend}</p>'
        f'<table id="fleet">{body}</table></body></html>\n'
    )
