"""One trace drawn as a waterfall (SVG) from the spans an OTLP receiver kept: the picture in
docs/operations.md ("Tracing"), drawn by the end-to-end tracing test."""

from __future__ import annotations

from html import escape
from pathlib import Path

from tests.support.otlp import Span

#: A colour per service, in the order they first appear.
COLOURS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#76b7b2")
ROW, LABEL, BARS, TOP = 26, 360, 560, 64


def waterfall(spans: list[Span], trace_id: str, title: str, path: Path) -> list[Span]:
    """Draw the spans of ``trace_id`` and those linking to it, in order of start, to ``path``;
    returns the spans drawn."""
    drawn = sorted(
        (s for s in spans if s.trace_id == trace_id or any(t == trace_id for t, _ in s.links)),
        key=lambda s: (s.start, s.end),
    )
    ids = {s.span_id: s for s in drawn}

    def depth(s: Span) -> int:
        parent, d = ids.get(s.parent_span_id), 0
        while parent is not None:
            d, parent = d + 1, ids.get(parent.parent_span_id)
        linked = next((ids[span] for t, span in s.links if t == trace_id and span in ids), None)
        return d if linked is None else depth(linked) + 1

    services = list(dict.fromkeys(s.service for s in drawn))
    colour = {name: COLOURS[i % len(COLOURS)] for i, name in enumerate(services)}
    first, last = min(s.start for s in drawn), max(s.end for s in drawn)
    scale = BARS / max(last - first, 1)
    height = TOP + ROW * len(drawn) + 40
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{LABEL + BARS + 100}" height="{height}" '
        'font-family="Helvetica, Arial, sans-serif" font-size="12">',
        f'<rect width="100%" height="100%" fill="white"/><text x="10" y="22" font-size="15" '
        f'font-weight="bold">{escape(title)}</text>',
        f'<text x="10" y="44" fill="#555">trace {trace_id} — {(last - first) / 1e9:.2f} s from the '
        "request to the worker; ⤷ marks a span that links to this trace (a batch of many)</text>",
    ]
    for i, s in enumerate(drawn):
        y = TOP + i * ROW
        linked = s.trace_id != trace_id
        label = ("⤷ " if linked else "") + f"{s.service}: {s.name}"
        x = LABEL + (s.start - first) * scale
        width = max((s.end - s.start) * scale, 2)
        took = (s.end - s.start) / 1e6
        faded = ' fill-opacity="0.55"' if linked else ""
        out.append(
            f'<text x="{10 + 14 * depth(s)}" y="{y + 16}">{escape(label)}</text>'
            f'<rect x="{x:.1f}" y="{y + 5}" width="{width:.1f}" height="{ROW - 10}" rx="2" '
            f'fill="{colour[s.service]}"{faded}/>'
            f'<text x="{x + width + 4:.1f}" y="{y + 16}" fill="#555">{took:,.1f} ms</text>'
        )
    x = 10
    for name in services:
        y = height - 16
        out.append(
            f'<rect x="{x}" y="{y - 10}" width="12" height="12" fill="{colour[name]}"/>'
            f'<text x="{x + 16}" y="{y}">{escape(name)}</text>'
        )
        x += 30 + 8 * len(name)
    out.append("</svg>")
    path.write_text("\n".join(out) + "\n")
    return drawn
