"""A plotly figure drawn as a small standalone SVG: the chart in a view's static copy (saved notebooks
reopened without a kernel, nbconvert, GitHub), where plotly.js is not there to draw it.

Bars (vertical or horizontal, grouped) and scatter traces (lines, markers) on one category or numeric
axis and one value axis, with the figure's colors, title and legend. Other trace kinds (box, treemap)
are named under the picture, for the interactive view to show.
"""

from __future__ import annotations

import math
from html import escape

PALETTE = ["#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3", "#ff6692", "#b6e880"]
MAX_POINTS = 4000  # points drawn per chart: the notebook's size budget


def _num(v) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _items(x) -> list | None:
    """A trace's array (tuple, list or numpy array) as a list; None for a scalar or nothing."""
    if x is None or isinstance(x, (str, bytes)) or not hasattr(x, "__len__"):
        return None
    return list(x)


def _color(trace, j: int, default: str) -> str:
    c = getattr(getattr(trace, "marker", None), "color", None)
    if isinstance(c, str):
        return c
    colors = _items(c)
    if colors and j < len(colors) and isinstance(colors[j], str):
        return colors[j]
    line = getattr(getattr(trace, "line", None), "color", None)
    return line if isinstance(line, str) else default


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    step = 10 ** math.floor(math.log10((hi - lo) / n))
    for m in (1, 2, 5, 10):
        if (hi - lo) / (step * m) <= n:
            step *= m
            break
    first = math.ceil(lo / step) * step
    return [first + k * step for k in range(int((hi - first) / step) + 1)]


def _fmt(v: float) -> str:
    return f"{v:.3g}"


def figure_svg(fig, width: int = 760) -> str:
    """The figure as an inline <svg data-role="chart-image">, or a caption when it has nothing drawable."""
    title = str(fig.layout.title.text or "chart").split("<br>")[0]
    drawable = [t for t in fig.data if t.type in ("bar", "scatter")]
    others = sorted({t.type for t in fig.data if t.type not in ("bar", "scatter")})
    horizontal = any(t.type == "bar" and t.orientation == "h" for t in drawable)
    axis = fig.layout.xaxis if horizontal else fig.layout.yaxis
    log = axis.type == "log"
    series = []  # (trace, kind, [(category or x, start, end)]): a bar spans start..end (its base to base + value)
    for t in drawable:
        cats, vals = (t.y, t.x) if horizontal else (t.x, t.y)
        vals = _items(vals) or []
        cats = _items(cats) or list(range(len(vals)))
        base = getattr(t, "base", None) if t.type == "bar" else None  # a bar's start (a timeline's offsets)
        bases = _items(base) or [base] * len(vals)
        pts = []
        for j, (c, raw) in enumerate(list(zip(cats, vals))[:MAX_POINTS]):
            v = _num(raw)
            if v is None or (log and v <= 0):
                continue
            b = _num(bases[j]) if j < len(bases) and bases[j] is not None else None
            start = (b or 0.0) if t.type == "bar" and not log else None
            pts.append((c, start, v + (b or 0.0) if start is not None else v))
        series.append((t, t.type, pts))
    tf = math.log10 if log else float
    values = [tf(v) for _, _, pts in series for _, a, b in pts for v in (a, b) if v is not None]
    if not values:
        extra = f" ({', '.join(others)})" if others else ""
        return f"<p><i>chart: {escape(title)}{escape(extra)}</i></p>"
    categorical = any(_num(c) is None for _, _, pts in series for c, _, _ in pts)
    cats: list = []
    for _, _, pts in series:
        for c, _, _ in pts:
            if c not in cats:
                cats.append(c)
    xs = [] if categorical else [x for c in cats if (x := _num(c)) is not None]  # every one a number
    lo, hi = (min(values), max(values)) if log else (min(0.0, min(values)), max(0.0, max(values)))
    hi = hi if hi > lo else lo + 1.0
    n_cat = max(len(cats), 1)
    longest = max((len(str(c)[:40]) for c in cats), default=4) if categorical else 4
    left, top, right = (min(300, 12 + 6 * longest), 44, 20) if horizontal else (60, 44, 20)
    bottom = 30 if horizontal else (110 if categorical else 40)
    plot_len = max(160, min(18 * n_cat, 900)) if horizontal else 300
    height = top + plot_len + bottom
    pw, ph = width - left - right, plot_len

    def val_pos(v: float) -> float:  # along the value axis
        f = (v - lo) / (hi - lo)
        return left + f * pw if horizontal else top + ph - f * ph

    def cat_pos(i: int, c) -> float:  # center along the category axis
        if not categorical:
            a, b, x = min(xs), max(xs), _num(c)
            f = 0.5 if b == a or x is None else (x - a) / (b - a)
            return left + f * pw if not horizontal else top + f * ph
        return (top + (i + 0.5) * ph / n_cat) if horizontal else (left + (i + 0.5) * pw / n_cat)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" data-role="chart-image" viewBox="0 0 {width} {height}" '
           f'width="{width}" height="{height}" font-family="system-ui, sans-serif" font-size="10">'
           f'<title>{escape(title)}</title><rect width="{width}" height="{height}" fill="#ffffff"/>'
           f'<text x="{left}" y="16" font-size="12" fill="#1b1b1b">{escape(title)}</text>']
    for tv in _ticks(lo, hi):  # value grid and labels
        p = val_pos(tv)
        tv = 10 ** tv if log else tv
        if horizontal:
            out.append(f'<line x1="{p:.1f}" y1="{top}" x2="{p:.1f}" y2="{top + ph}" stroke="#e5e8ec"/>'
                       f'<text x="{p:.1f}" y="{top + ph + 14}" text-anchor="middle" fill="#4a4f57">{_fmt(tv)}</text>')
        else:
            out.append(f'<line x1="{left}" y1="{p:.1f}" x2="{left + pw}" y2="{p:.1f}" stroke="#e5e8ec"/>'
                       f'<text x="{left - 4}" y="{p + 3:.1f}" text-anchor="end" fill="#4a4f57">{_fmt(tv)}</text>')
    index = {c: i for i, c in enumerate(cats)}
    grouped = fig.layout.barmode != "overlay"
    n_bars = sum(1 for s in series if s[1] == "bar")
    band = (ph if horizontal else pw) / n_cat * 0.8
    width_bar = band / max(n_bars, 1) if grouped else band
    k = -1  # the bar trace's slot in a group
    for si, (t, kind, pts) in enumerate(series):
        default = PALETTE[si % len(PALETTE)]
        if kind == "bar":
            k = k + 1 if grouped else 0
            for j, (c, start, end) in enumerate(pts):
                center = cat_pos(index.get(c, 0), c) - band / 2 + (k + 0.5) * width_bar
                a, b = sorted((val_pos(lo if start is None else tf(start)), val_pos(tf(end))))
                color = escape(_color(t, j, default))
                if horizontal:
                    out.append(f'<rect class="bar" x="{a:.1f}" y="{center - width_bar / 2:.1f}" width="{b - a:.1f}" '
                               f'height="{width_bar:.1f}" fill="{color}"/>')
                else:
                    out.append(f'<rect class="bar" x="{center - width_bar / 2:.1f}" y="{a:.1f}" '
                               f'width="{width_bar:.1f}" height="{b - a:.1f}" fill="{color}"/>')
        else:
            pos = [(cat_pos(index.get(c, 0), c), val_pos(tf(v))) for c, _, v in pts]
            pos = [(y, x) for x, y in pos] if horizontal else pos
            color = escape(_color(t, 0, default))
            mode = t.mode or "lines+markers"
            if "lines" in mode and len(pos) > 1:
                d = " ".join(f"{'L' if i else 'M'}{x:.1f},{y:.1f}" for i, (x, y) in enumerate(pos))
                out.append(f'<path d="{d}" fill="none" stroke="{color}" stroke-width="1.5"/>')
            if "markers" in mode:
                out.extend(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{color}"/>' for x, y in pos)
    if categorical and n_cat <= 80:  # category labels
        for i, c in enumerate(cats):
            label = escape(str(c)[:40])
            p = cat_pos(i, c)
            if horizontal:
                out.append(f'<text x="{left - 4}" y="{p + 3:.1f}" text-anchor="end" fill="#1b1b1b">{label}</text>')
            else:
                out.append(f'<text transform="translate({p:.1f},{top + ph + 8}) rotate(-45)" text-anchor="end" '
                           f'fill="#1b1b1b">{label}</text>')
    out.append(f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" stroke="#8a96a6"/>'
               f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}" stroke="#8a96a6"/>')
    x = left
    for si, (t, _, _) in enumerate(series):  # legend
        if not t.name:
            continue
        color = escape(_color(t, 0, PALETTE[si % len(PALETTE)]))
        out.append(f'<rect x="{x}" y="26" width="10" height="10" fill="{color}"/>'
                   f'<text x="{x + 14}" y="35" fill="#1b1b1b">{escape(str(t.name)[:40])}</text>')
        x += 24 + 6 * min(len(str(t.name)), 40)
    out.append("</svg>")
    note = f"<p><i>also in the interactive chart: {escape(', '.join(others))}</i></p>" if others else ""
    return "".join(out) + note
