"""Rich notebook reprs (HTML) for the Inspector, an EventBlock and delegation info.

The classes live below the visualizer: importing etlab.visualizer hands these to
`etlab.facts.display`, which their `_repr_html_` and `Inspector.show` ask.
"""

from __future__ import annotations

import html

import pandas as pd

from etlab.inspector import event_label
from etlab.visualizer._html import theme_css


def _style() -> str:
    """The reprs' CSS: the theme's variables (so tables stay readable on dark themes) and the table rules."""
    return (f"<style>{theme_css()}.etlab-repr{{font:12px system-ui,sans-serif;color:var(--etlab-fg)}}"
            ".etlab-repr table{border-collapse:collapse}"
            ".etlab-repr td,.etlab-repr th{padding:2px 8px;border-bottom:1px solid var(--etlab-border);"
            "text-align:left;color:var(--etlab-fg)}"
            ".etlab-repr th{background:var(--etlab-bg-alt)}.etlab-repr .n{text-align:right}</style>")


_MAX_ROWS = 30


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return html.escape(str(v))


def _table(df: pd.DataFrame, max_rows: int = _MAX_ROWS) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    body = []
    for r in df.head(max_rows).itertuples(index=False):
        cells = "".join(f"<td class='{'n' if isinstance(v, (int, float)) else ''}'>{_fmt(v)}</td>" for v in r)
        body.append(f"<tr>{cells}</tr>")
    more = f"<p>… {len(df) - max_rows} more rows</p>" if len(df) > max_rows else ""
    return f"<table><tr>{head}</tr>{''.join(body)}</table>{more}"


def event_block_html(block) -> str:
    """An EventBlock: its name, runs and one row per event with p50 / avg and the ops it ran."""
    unit = getattr(getattr(block, "target_time_scale", None), "value", "")
    rows = []
    for e in block.events:
        p = e.perf_data
        rows.append({"event": event_label(e), "ops": ", ".join(e.op_types or []), f"p50 ({unit})": p.p50 if p else None,
                     f"avg ({unit})": p.avg if p else None, "delegated": bool(e.is_delegated_op),
                     "backend": e.delegate_backend_name or "", "debug handles": e.debug_handles})
    df = pd.DataFrame(rows).fillna("")
    return (f"{_style()}<div class='etlab-repr etlab-theme'><b>EventBlock {html.escape(block.name)!s}</b> · "
            f"{len(block.events)} "
            f"events · {block.num_runs} run(s){_table(df)}</div>")


def inspector_html(inspector) -> str:
    """The Inspector: what it read, then each event block's table."""
    blocks = inspector.event_blocks
    parts = [f"{_style()}<div class='etlab-repr etlab-theme'><b>{html.escape(repr(inspector))}</b>"]
    for block in blocks:
        parts.append(event_block_html(block).replace(_style(), ""))
    parts.append("<p>Views: <code>etlab.visualizer.show(inspector)</code></p></div>")
    return "".join(parts)


def inspector_summary_html(inspector) -> str:
    """The dashboard's first tab: totals per block and the 10 slowest ops."""
    from etlab.inspector import execute_timings, op_timings, time_unit, timings_counted_once

    timings = timings_counted_once(execute_timings(op_timings(inspector)))  # a delegate call, not also its insides
    unit = time_unit(inspector)
    slow = sorted(timings, key=lambda t: -t.p50)[:10]
    df = pd.DataFrame([{"event": t.name, "ops": ", ".join(t.op_types), "module": t.module,
                        f"p50 ({unit})": t.p50, "source": t.source} for t in slow])
    blocks = "".join(f"<li>{html.escape(b.name)}: {len(b.events)} events over {b.num_runs} run(s)</li>"
                     for b in inspector.event_blocks)
    total = sum(t.p50 for t in timings)
    return (f"{_style()}<div class='etlab-repr etlab-theme' data-etlab-view='summary'>"
            f"<p><b>{html.escape(repr(inspector))}</b></p>"
            f"<ul>{blocks}</ul><p>sum of op p50: {total:.4g} {unit}</p><p><b>slowest ops</b></p>"
            f"{_table(df) if len(df) else '<p>no timed ops</p>'}</div>")


def refusal_groups_html(info, max_nodes: int = 3) -> str:
    """Why nodes were left out, one row per category: how many nodes, the first few with their
    reasons and the hint ("" when every operator node was delegated)."""
    groups = info.refusal_groups()
    unexplained = info.unexplained
    if not groups and not unexplained:
        return ""
    rows = []
    for g in groups:
        shown = "".join(f"<li><code>{html.escape(n.node)}</code> ({html.escape(n.op)}): {html.escape(n.reason)}"
                        f"{' <i>' + html.escape(n.source) + '</i>' if n.source else ''}</li>"
                        for n in g.nodes[:max_nodes])
        more = f"<li>… {g.count - max_nodes} more</li>" if g.count > max_nodes else ""
        hints = sorted({n.hint for n in g.nodes if n.hint})
        rows.append(f"<tr data-category='{html.escape(g.category)}'><td>{html.escape(g.category)}</td>"
                    f"<td>{g.count}</td><td><ul>{shown}{more}</ul></td>"
                    f"<td>{'<br>'.join(html.escape(h) for h in hints[:3])}</td></tr>")
    if unexplained:
        names = ", ".join(html.escape(n.node) for n in unexplained[:max_nodes])
        rows.append(f"<tr data-category=''><td>no reason recorded</td><td>{len(unexplained)}</td>"
                    f"<td>{names}{' …' if len(unexplained) > max_nodes else ''}</td><td></td></tr>")
    total = sum(g.count for g in groups) + len(unexplained)
    return (f"<div data-etlab-view='delegation-refusals'><p class='etlab-note'>Left out of delegation: {total} "
            f"operator node(s), by reason</p><table class='etlab-table'><tr><th>category</th><th>nodes</th>"
            f"<th>nodes and reasons</th><th>what you can do</th></tr>{''.join(rows)}</table></div>")


def delegation_info_html(info) -> str:
    """DelegationInfo: the summary per backend, the operator table and why nodes were left out
    (by category with counts)."""
    backends = pd.DataFrame([{"backend": b.backend_id, "subgraphs": b.num_subgraphs, "delegated nodes": b.num_nodes}
                             for b in info.delegation_by_backend.values()])
    return (f"{_style()}<div class='etlab-repr etlab-theme'><p>{info.num_delegated_subgraphs} delegated subgraph(s), "
            f"{info.num_delegated_nodes} delegated node(s), {info.num_non_delegated_nodes} not delegated</p>"
            f"{_table(backends) if len(backends) else ''}{_table(info.get_operator_delegation_dataframe())}"
            f"{refusal_groups_html(info)}</div>")


def repr_mimebundle(obj, include=None, exclude=None) -> dict:
    """{'text/html', 'text/plain'} for an Inspector, EventBlock or DelegationInfo."""
    if hasattr(obj, "event_blocks"):
        text = inspector_html(obj)
    elif hasattr(obj, "events") and hasattr(obj, "num_runs"):
        text = event_block_html(obj)
    elif hasattr(obj, "delegation_by_operator"):
        text = delegation_info_html(obj)
    else:
        raise TypeError(f"no rich repr for {type(obj).__name__}")
    return {"text/html": text, "text/plain": repr(obj)}

