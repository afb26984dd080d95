"""A GraphModel drawn as a standalone SVG from its Python layout: the picture in a view's static
fallback (saved notebooks, nbconvert, GitHub), so the graph is seen where no script runs."""

from __future__ import annotations

from html import escape

from etlab.visualizer._layout import compose, initial_expanded, layout_kit, node_label, shape_text

# The same pastels as graph_common.js (node text stays dark on them in every theme).
FILL = {"op": "#e8eef7", "control_flow": "#f3e9f7", "delegate": "#fdecec", "input": "#eef3e8", "output": "#eef3e8"}
MAX_BOXES = 2500  # above this the SVG would outweigh the notebook's size budget: groups are drawn collapsed


def graph_svg(model, *, collapse_threshold: int = 400, max_width: int = 1100) -> str:
    """The graph as an inline <svg> (groups boxed, delegates outlined in their backend's color)."""
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
        out.append(f'<g><title>{escape(n.name)}: {escape(n.op)}</title>'
                   f'<rect x="{x:.1f}" y="{y:.1f}" width="{bw:.1f}" height="{bh:.1f}" rx="4" '
                   f'fill="{FILL.get(n.kind, FILL["op"])}" {stroke}/>'
                   f'<text x="{x + 8:.1f}" y="{y + 14:.1f}" fill="#1b1b1b">{escape(node_label(n))}</text>'
                   f'<text x="{x + 8:.1f}" y="{y + 27:.1f}" fill="#4a4f57" font-size="10">'
                   f'{escape(shape_text(n))}</text></g>')
    out.append("</svg>")
    return "".join(out)
