"""A small SVG chart of `make bench`'s ratios against their targets, for people who would rather
look than read the table: one bar per figure, its length the ratio as a share of the target."""

from __future__ import annotations

from html import escape

LABEL_W, PLOT_W, NOTE_W, ROW_H, TOP = 230, 300, 150, 26, 46
CAP = 2.0  # bars stop at twice the target (a miss that large reads as "far off" anyway)
COLOURS = {True: "#2e8540", False: "#c0392b", None: "#9e9e9e"}


def share(ratio: float, target: float) -> float:
    """The ratio as a share of its target, 1 at the target (a target of 0: met only at 0)."""
    if target <= 0:
        return 0.0 if ratio <= 0 else CAP
    return min(ratio / target, CAP)


def svg(rows: list[tuple[str, float | None, float, bool | None]], title: str) -> str:
    """rows: (figure, ratio or None when skipped, target ratio, passed or None)."""
    width = LABEL_W + PLOT_W + NOTE_W
    height = TOP + ROW_H * len(rows) + 30
    x0, x_target = LABEL_W, LABEL_W + PLOT_W / CAP
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="10" y="20" font-size="14" font-weight="bold">{escape(title)}</text>',
           f'<text x="{x0}" y="38" fill="#555">ratio / target (the line: the target; bars '
           f'stop at {CAP:g}x)</text>']
    for i, (name, ratio, target, passed) in enumerate(rows):
        y = TOP + i * ROW_H
        out.append(f'<text x="10" y="{y + 17}">{escape(name)}</text>')
        if ratio is None:
            out.append(f'<text x="{x0 + 4}" y="{y + 17}" fill="#777">skipped</text>')
            continue
        length = share(ratio, target) * PLOT_W / CAP
        out.append(f'<rect x="{x0}" y="{y + 5}" width="{max(length, 1.5):.1f}" height="16" '
                   f'fill="{COLOURS[passed]}"/>')
        verdict = "pass" if passed else "MISS"
        out.append(f'<text x="{x0 + PLOT_W + 8}" y="{y + 17}">{ratio:.2f} (≤ {target:g}) '
                   f'{verdict}</text>')
    bottom = TOP + ROW_H * len(rows)
    out.append(f'<line x1="{x_target:.1f}" y1="{TOP}" x2="{x_target:.1f}" y2="{bottom}" '
               'stroke="black" stroke-dasharray="4 3"/>')
    out.append(f'<text x="{x_target - 18:.1f}" y="{bottom + 16}" fill="#555">target</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
