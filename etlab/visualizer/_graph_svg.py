"""A GraphModel drawn as a standalone SVG from its Python layout: the picture in a view's static
fallback (saved notebooks, nbconvert, GitHub), so the graph is seen where no script runs."""

from __future__ import annotations

import math
from html import escape

from etlab.visualizer._layout import compose, initial_expanded, layout_kit, node_label, shape_text

# The same pastels as graph_common.js (node text stays dark on them in every theme).
FILL = {"op": "#e8eef7", "control_flow": "#f3e9f7", "delegate": "#fdecec", "input": "#eef3e8", "output": "#eef3e8"}
MAX_BOXES = 2500  # above this the SVG would outweigh the notebook's size budget: groups are drawn collapsed


# The overlay ramps of graph_common.js (sequential; diverging about a ratio's center), same stops.
RAMP = [(255, 247, 188), (254, 196, 79), (236, 112, 20), (204, 76, 2), (140, 45, 4)]
DIVERGING = [(33, 102, 172), (146, 197, 222), (247, 247, 247), (244, 165, 130), (178, 24, 43)]
OVERLAY_VALUES = {"latency": lambda n: n.latency["p50"] if n.latency else None, "gap": lambda n: n.gap,
                  "bytes": lambda n: n.bytes}


def _luminance(rgb: tuple[float, float, float]) -> float:
    """WCAG relative luminance of an sRGB color (0-255 channels)."""
    lin = [c / 255 / 12.92 if c / 255 <= 0.03928 else ((c / 255 + 0.055) / 1.055) ** 2.4 for c in rgb]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def light_ink(rgb: tuple[float, float, float]) -> bool:
    """Whether white text contrasts more than black on this fill (graph_common.js's lightInk): either
    keeps >= 4.58:1 on any fill, where a near-black would fall to 4.3:1 on mid oranges."""
    lum = _luminance(rgb)
    return 1.05 / (lum + 0.05) > (lum + 0.05) / 0.05


def _rgb(stops, t: float) -> tuple[int, int, int]:
    t = min(1.0, max(0.0, t))
    x = t * (len(stops) - 1)
    i = min(int(x), len(stops) - 2)
    f = x - i
    return tuple(round(a + (b - a) * f) for a, b in zip(stops[i], stops[i + 1]))


def _lerp(stops, t: float) -> str:
    return "rgb({},{},{})".format(*_rgb(stops, t))


def overlay_fills(models, overlay: str) -> list[dict[int, tuple[str, bool]]]:
    """Per model, node id -> (its overlay color, whether its text goes white on it), on the scale the
    browser uses (log over every pane's values; a ratio's split at its center), so a saved graph keeps
    its coloring."""
    value = OVERLAY_VALUES.get(overlay)
    vals = [v for m in models for n in m.nodes if (v := value(n)) is not None and v > 0] if value else []
    if value is None or not vals:
        return [{} for _ in models]
    center = next((m.latency_center for m in models if m.latency_center), None) if overlay == "latency" else None
    if center:
        span = max(1e-6, *(abs(math.log10(v / center)) for v in vals))
        stops = DIVERGING
        place = lambda v: 0.5 + 0.5 * math.log10(v / center) / span
    else:
        a, b = math.log10(min(vals)), math.log10(max(vals))
        stops = RAMP
        place = lambda v: (math.log10(v) - a) / (b - a) if b > a else 1.0
    out = []
    for m in models:
        ts = {n.id: place(v) for n in m.nodes if (v := value(n)) is not None and v > 0}
        out.append({i: (_lerp(stops, t), light_ink(_rgb(stops, t))) for i, t in ts.items()})
    return out


def graph_svg(model, *, collapse_threshold: int = 400, max_width: int = 1100,
              fills: dict[int, tuple[str, bool]] | None = None) -> str:
    """The graph as an inline <svg> (groups boxed, delegates outlined in their backend's color; nodes
    filled with their overlay color from `fills`, else by kind)."""
    expanded = initial_expanded(model, collapse_threshold)
    if len(model.nodes) > MAX_BOXES:
        expanded = set()
    kit = layout_kit(model)
    laid = compose(kit, model, expanded)
    groups = {g.id: g for g in model.groups}
    w, h = laid["size"]
    scale = min(1.0, max_width / max(w, 1.0))
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="etlab-graph-svg" data-role="graph-image" '
           f'viewBox="0 0 {w:.0f} {h:.0f}" width="{w * scale:.0f}" height="{h * scale:.0f}" '
           f'font-family="system-ui, sans-serif" font-size="11">'
           f'<title>{escape(model.title)}</title>'
           '<defs><marker id="etlab-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
           'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#8a96a6"/></marker></defs>']
    colors = model.backend_colors
    ordered = sorted(laid["boxes"].items(), key=lambda kv: (not kv[0].startswith("g:"), kv[1][1]))
    for item, (x, y, bw, bh) in ordered:
        if not item.startswith("g:"):
            continue
        g = groups[item[2:]]
        collapsed = g.id not in expanded
        stroke = colors.get(g.backend or "", "#a9b4c2")
        fill = "#e9edf3" if collapsed else "rgba(120,140,170,.08)"
        dash = ' stroke-dasharray="5 3"' if collapsed and g.kind != "delegate" else ""
        width = 2.5 if g.kind == "delegate" else 1
        out.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{bw:.1f}" height="{bh:.1f}" rx="6" fill="{fill}" '
                   f'stroke="{stroke}" stroke-width="{width}"{dash}/>'
                   f'<text x="{x + 8:.1f}" y="{y + 15:.1f}" fill="#1b1b1b">{"▸" if collapsed else "▾"} '
                   f'{escape(g.label)}</text>')
    for _, _, pts in laid["edges"]:
        d = " ".join(f"{'L' if i else 'M'}{px},{py}" for i, (px, py) in enumerate(pts))
        out.append(f'<path d="{d}" fill="none" stroke="#8a96a6" stroke-width="1.1" marker-end="url(#etlab-arrow)"/>')
    for item, (x, y, bw, bh) in ordered:
        if not item.startswith("n"):
            continue
        n = model.nodes[int(item[1:])]
        stroke = f'stroke="{colors[n.backend]}" stroke-width="2"' if n.backend in colors else \
            'stroke="#7a8899" stroke-width="1"'
        colored = (fills or {}).get(n.id)
        fill, light = colored or (FILL.get(n.kind, FILL["op"]), False)
        # on an overlay color both lines take black or white; on the pastels, dark and muted
        ink, sub = ("#ffffff", "#ffffff") if light else ("#000000", "#000000") if colored else ("#1b1b1b", "#4a4f57")
        out.append(f'<g><title>{escape(n.name)}: {escape(n.op)}</title>'
                   f'<rect x="{x:.1f}" y="{y:.1f}" width="{bw:.1f}" height="{bh:.1f}" rx="4" '
                   f'fill="{fill}" {stroke}/>'
                   f'<text x="{x + 8:.1f}" y="{y + 14:.1f}" fill="{ink}">{escape(node_label(n))}</text>'
                   f'<text x="{x + 8:.1f}" y="{y + 27:.1f}" fill="{sub}" font-size="10">'
                   f'{escape(shape_text(n))}</text></g>')
    out.append("</svg>")
    return "".join(out)
