"""MemoryTimeline: the memory plan of a method, one panel per memory id (plotly).

Top of each panel: x = runtime instruction, y = arena offset, one rectangle per planned tensor
from the instruction that writes it to the last one that reads it (hover: tensor, producing op,
shape, size, those instructions, source line). Below: the live bytes during each instruction
with the lower bound (the most bytes live at once) and the arena size. Given a run with allocation
events (`MemoryTimeline(program, inspector=ins)`), a last panel draws what was observed on the same
instruction axis (`Inspector.memory_summary().timeline`): at each instruction of the run with the
tracked peak, what it added above the bytes held since load (those in the title): the bytes accumulated
so far in the run (unplanned tensors) and the instruction's own temporaries and delegate work, stacked;
the other runs as points.
"""

from __future__ import annotations

import os
import zlib

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from etlab.visualizer import _html
from etlab.visualizer._plot_view import PlotView
from etlab.visualizer._text import TextForm, frame_lines, wrap

TENSOR_COLORS = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#ff9da6", "#9d755d"]


def _plan_frame(program_manager, method: str) -> pd.DataFrame:
    from etlab.devtools import memory_plan_dataframe

    if isinstance(program_manager, pd.DataFrame):
        return program_manager
    return memory_plan_dataframe(program_manager, method)


def pte_plan_frame(pte, method: str = "forward") -> pd.DataFrame:
    """The memory plan of a `.pte`'s method (a path or a PteFile) as a memory_plan_dataframe() table, from
    the file alone (etlab.facts.pte_memory): tensors named by value index ("v12"), the producing op the
    instruction that first names a tensor runs (its kernel, or the delegate's backend), no module or
    source line (a .pte keeps none). Tensors at one offset whose steps overlap are one storage (a view
    and its base), counted once by the live-bytes curve."""
    from etlab.errors import FormatError
    from etlab.facts.pte_memory import instructions, memory_plan
    from etlab.schema import load_file
    from etlab.schema.program import DelegateCall, KernelCall, PteFile

    if not isinstance(pte, PteFile):
        loaded = load_file(pte)
        if not isinstance(loaded, PteFile):
            raise FormatError(f"{pte}: not a .pte (a {type(loaded).__name__})")
        pte = loaded
    plans = {str(p.name): p for p in pte.program.execution_plan or ()}
    if method not in plans:
        raise ValueError(f"the .pte has no method {method!r}; methods are {sorted(plans)}")
    plan = plans[method]
    ops = [f"{o.name}.{o.overload}" if o.overload else str(o.name) for o in plan.operators or ()]
    backends = [str(d.id) for d in plan.delegates or ()]

    def runs(ins) -> str:
        a = ins.instr_args
        if isinstance(a, KernelCall) and 0 <= a.op_index < len(ops):
            return ops[a.op_index]
        if isinstance(a, DelegateCall) and 0 <= a.delegate_index < len(backends):
            return f"delegate {backends[a.delegate_index]}"
        return type(a).__name__

    steps = [runs(ins) for ins in instructions(plan)]
    inputs = {int(i) for i in plan.inputs or ()}
    rows, storage_end = [], {}
    for b in sorted(memory_plan(plan), key=lambda b: (b.memory_id, b.offset, b.first, b.value)):
        name = f"v{b.value}"
        key = (b.memory_id, b.offset)
        owner, end = storage_end.get(key, (None, -1))
        storage = owner if owner is not None and b.first <= end else name
        storage_end[key] = (storage, max(end, b.last) if storage == owner else b.last)
        producing = "placeholder" if b.value in inputs else (steps[b.first] if b.first < len(steps) else "")
        rows.append({"tensor": name, "mem_id": b.memory_id, "offset": b.offset, "size": b.size,
                     "first_step": b.first, "last_step": b.last, "producing_op": producing, "debug_handle": None,
                     "dtype": b.dtype, "shape": tuple(b.shape), "storage": storage, "module": "", "source": ""})
    df = pd.DataFrame(rows, columns=["tensor", "mem_id", "offset", "size", "first_step", "last_step", "producing_op",
                                     "debug_handle", "dtype", "shape", "storage", "module", "source"])
    df = df.astype({"mem_id": "int64", "offset": "int64", "size": "int64", "first_step": "int64",
                    "last_step": "int64", "debug_handle": "Int64"})
    df.attrs.update(method=method, num_steps=len(steps), instructions=steps,
                    buffer_sizes=[int(n) for n in plan.non_const_buffer_sizes or ()])
    return df


def _live_bytes(df: pd.DataFrame, mem_id: int) -> pd.Series:
    from etlab.devtools import live_bytes_per_step

    return live_bytes_per_step(df, mem_id)


def memory_figure(df: pd.DataFrame, *, title: str = "", observed=None) -> go.Figure:
    """The timeline figure of a memory_plan_dataframe() table (one bar per planned tensor); `observed`: a
    `MemorySummary` (Inspector.memory_summary()) whose run timeline is drawn below, on the same axis.

    The lower bound drawn is the peak of the live-bytes curve on the same axis (what
    `memory_lower_bound` returns), so the two never disagree on the chart.
    """
    mem_ids = sorted(int(m) for m in df["mem_id"].unique()) if len(df) else []
    buffer_sizes = list(df.attrs.get("buffer_sizes") or [])
    instructions = list(df.attrs.get("instructions") or [])

    def at(step: int) -> str:
        return f"{step}: {instructions[step]}" if 0 <= step < len(instructions) else str(step)

    seen = observed if observed is not None and len(observed.timeline) else None
    rows = max(len(mem_ids), 1) * 2 + (seen is not None)
    titles = []
    lives = {m: _live_bytes(df, m) for m in mem_ids}
    for m in mem_ids:
        arena = buffer_sizes[m] if m < len(buffer_sizes) else None
        bound = int(lives[m].max()) if len(lives[m]) else 0
        used = f" = {bound / arena:.0%} of the arena" if arena else ""
        titles += [f"memory id {m}: planned tensors" + (f" (arena {arena:,} bytes)" if arena is not None else ""),
                   f"memory id {m}: live bytes (peak, the lower bound: {bound:,} bytes{used})"]
    heights = [0.7, 0.3] * max(len(mem_ids), 1)
    if not titles:
        titles = ["no planned tensors", ""]
    if seen is not None:
        heights.append(0.4)
        where = (f" at run {seen.peak_run}, instruction {seen.peak_instruction}"
                 if seen.peak_run is not None and seen.peak_instruction is not None else "")
        titles.append(f"observed: bytes above load per instruction (tracked peak {seen.peak_bytes:,}{where}; "
                      f"{seen.load_bytes:,} held since load)")
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=False, vertical_spacing=0.14 / max(len(mem_ids), 1),
                        row_heights=heights, subplot_titles=titles)
    fig.update_annotations(x=0, xanchor="left")  # subplot titles left-aligned
    for i, m in enumerate(mem_ids):
        part = df.loc[df["mem_id"] == m]
        first, last = part["first_step"].to_numpy(), part["last_step"].to_numpy()
        width = last - first + 1
        hover = [
            f"<b>{r['tensor']}</b><br>op: {r['producing_op']}<br>{r['dtype']} {list(r['shape'])} · {r['size']:,} "
            f"bytes · offset {r['offset']:,}<br>"
            + ("input, before instruction 0" if r["producing_op"] == "placeholder"
               else f"written by {at(r['first_step'])}")
            + f"<br>last read by {at(r['last_step'])}"
            + (f"<br>module: {r['module']}" if r["module"] else "") + (f"<br>{r['source']}" if r["source"] else "")
            for r in part.to_dict("records")
        ]
        colors = [TENSOR_COLORS[zlib.crc32(str(r).encode()) % len(TENSOR_COLORS)] for r in part["storage"]]
        fig.add_trace(go.Bar(
            x=first + width / 2, y=part["size"].clip(lower=1), base=part["offset"], width=width,
            name=f"mem {m} tensors",
            marker={"color": colors, "line": {"color": "rgba(0,0,0,.45)", "width": 0.6}}, opacity=0.85,
            hovertext=hover, hoverinfo="text", customdata=part["tensor"], showlegend=False,
            meta={"etlab": "tensors", "mem_id": m},
        ), row=2 * i + 1, col=1)
        kv = part[part["tensor"].isin(df.attrs.get("kv_cache") or [])]  # an LLM's KV cache: its own band
        if len(kv):
            fig.add_trace(go.Bar(x=kv["first_step"] + (kv["last_step"] - kv["first_step"] + 1) / 2, y=kv["size"],
                                 base=kv["offset"], width=kv["last_step"] - kv["first_step"] + 1, hoverinfo="skip",
                                 name=f"KV cache ({int(kv['size'].sum()):,} bytes)", legendgroup="kv", opacity=0.5,
                                 marker={"color": "#b279a2", "pattern": {"shape": "/"}}, meta={"etlab": "kv_cache"}),
                          row=2 * i + 1, col=1)
        live = lives[m]
        arena = buffer_sizes[m] if m < len(buffer_sizes) else None
        bound = int(live.max()) if len(live) else 0
        # steps drawn as [i, i + 1): a point at each edge so the step curve covers the bars' extent
        xs = [x for step in live.index for x in (step, step + 1)]
        ys = [int(v) for v in live.values for _ in range(2)]
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line={"color": "#4c78a8"}, name="live bytes",
                                 showlegend=i == 0, legendgroup="live",
                                 hovertext=[f"instruction {at(step)}<br>{v:,} bytes live" for step, v in
                                            zip(live.index, live.values) for _ in range(2)],
                                 hoverinfo="text"), row=2 * i + 2, col=1)
        n = max(len(live), 1)
        fig.add_trace(go.Scatter(x=[0, n], y=[bound, bound], mode="lines",
                                 line={"dash": "dash", "color": "#54a24b"},
                                 name="lower bound", showlegend=i == 0, legendgroup="bound",
                                 hovertemplate=f"lower bound {bound:,} bytes<extra></extra>"), row=2 * i + 2, col=1)
        if arena is not None:
            fig.add_trace(go.Scatter(x=[0, n], y=[arena, arena], mode="lines",
                                     line={"dash": "dot", "color": "#e45756"},
                                     name="arena size", showlegend=i == 0, legendgroup="arena",
                                     hovertemplate=f"arena {arena:,} bytes<extra></extra>"), row=2 * i + 2, col=1)
            # plotly leaves row/col unannotated (default "all"), so a checker infers str; it takes subplot numbers
            fig.add_hline(y=arena, line={"dash": "dot", "color": "#e45756", "width": 1},
                          row=2 * i + 1, col=1)  # pyright: ignore[reportArgumentType]
        fig.update_yaxes(title_text="offset (bytes)", row=2 * i + 1, col=1)
        fig.update_yaxes(title_text="bytes", rangemode="tozero", row=2 * i + 2, col=1)
        fig.update_xaxes(title_text="runtime instruction (execution order)", row=2 * i + 2, col=1)
        fig.update_xaxes(matches=f"x{2 * i + 1 if i else ''}", row=2 * i + 2, col=1)
    if seen is not None:
        _observed_traces(fig, seen, rows, at, len(instructions) or int(df.attrs.get("num_steps") or 0))
    fig.update_layout(title=title or None, height=max(420, 460 * max(len(mem_ids), 1)) + 260 * (seen is not None),
                      bargap=0,
                      margin={"l": 70, "r": 20, "t": 90, "b": 90}, hovermode="closest", template="plotly_white",
                      # under the plots: above them it ran into the (left-aligned) subplot titles
                      legend={"orientation": "h", "x": 0, "xanchor": "left", "y": -0.08, "yanchor": "top"})
    return fig


# The observed panel: what a run added above the bytes held since load (stated in its title: next to the
# load bytes, often the method allocator's megabytes, the run's kilobytes would not show).
OBSERVED_PARTS = (("accumulated", "accumulated in the run (unplanned), held until the next instruction with events",
                   "#f58518"),
                  ("transient", "the instruction's temporaries and delegate work", "#e45756"))


def _observed_traces(fig: go.Figure, seen, row: int, at, steps: int) -> None:
    """The observed panel: the peak run's bytes above load per instruction (accumulated bytes as a band up to
    the next instruction with events, the instruction's own on top), the other runs' totals above load as
    points (all from the MemorySummary; nothing computed here but where to draw it)."""
    t = seen.timeline[seen.timeline["instruction"] >= 0]
    peak_run = seen.peak_run if seen.peak_run is not None else int(t["run"].iloc[0]) if len(t) else 0
    mine = t[t["run"] == peak_run].sort_values("instruction")
    first = mine["instruction"].to_numpy()
    n = max(steps, int(first.max()) + 1 if len(first) else 1)
    last = [*first[1:].tolist(), n]
    acc, trans = mine["accumulated"].clip(lower=0).tolist(), mine["transient"].clip(lower=0).tolist()
    hover = [f"instruction {at(int(i))}<br>run {peak_run}: {b:,} bytes tracked ({b - seen.load_bytes:,} above load)"
             for i, b in zip(first, mine["bytes"])]
    (_, acc_label, acc_color), (_, trans_label, trans_color) = OBSERVED_PARTS
    fig.add_trace(go.Bar(x=[(a + b) / 2 for a, b in zip(first, last)], y=acc, base=[0] * len(acc),
                         width=[b - a for a, b in zip(first, last)], name=acc_label, marker={"color": acc_color},
                         opacity=0.8, hovertext=[f"{h}<br>accumulated: {v:,} bytes" for h, v in zip(hover, acc)],
                         hoverinfo="text", meta={"etlab": "observed_accumulated"}), row=row, col=1)
    fig.add_trace(go.Bar(x=first + 0.5, y=trans, base=acc, width=0.9, name=trans_label, marker={"color": trans_color},
                         hovertext=[f"{h}<br>its own: {v:,} bytes" for h, v in zip(hover, trans)], hoverinfo="text",
                         meta={"etlab": "observed_transient"}), row=row, col=1)
    others = t[t["run"] != peak_run]
    if len(others):
        fig.add_trace(go.Scatter(x=others["instruction"] + 0.5, y=others["bytes"] - seen.load_bytes, mode="markers",
                                 marker={"color": "#4c78a8", "size": 5, "opacity": 0.6}, name="other runs",
                                 hovertext=[f"run {r}, instruction {at(int(i))}: {b:,} bytes tracked" for r, i, b in
                                            zip(others["run"], others["instruction"], others["bytes"])],
                                 hoverinfo="text", meta={"etlab": "observed_runs"}), row=row, col=1)
    fig.update_yaxes(title_text="bytes above load", rangemode="tozero", row=row, col=1)
    fig.update_xaxes(title_text="runtime instruction (execution order)", matches="x", row=row, col=1)


def memory_summary_html(summary) -> str:
    """The notebook repr of a MemorySummary (Inspector.memory_summary()): the tracked peak, bytes by owner,
    load against run, and planned against observed when the plan was given."""
    import html

    from etlab.visualizer._reprs import _style, _table

    parts = [f"<p>{html.escape(repr(summary))}</p>", _table(summary.owners), _table(summary.phases)]
    if len(summary.arenas):
        parts.append(_table(summary.arenas))
    if len(summary.tensors):
        parts.append(_table(summary.tensors))
    return f"{_style()}<div class='etlab-repr etlab-theme' data-etlab-view='memory-summary'>{''.join(parts)}</div>"


class MemoryTimeline(TextForm, widgets.VBox):
    """The memory plan of one method of an ExecutorchProgramManager (or a memory_plan_dataframe()), and with
    `inspector` (a run with allocation events) what the run observed on the same axis.

    `.data` is the table (one row per planned tensor), `.observed` the run's `MemorySummary` (or None),
    `.figure` the plotly figure;
    `save_html(path)` writes it as a standalone offline page.
    """

    def __init__(self, program_manager, method: str = "forward", inspector=None, **kwargs):
        from etlab.devtools import with_kv_cache

        self.data = with_kv_cache(_plan_frame(program_manager, method), program_manager, method)
        self.method = method
        # what a run observed (Inspector.memory_summary()), drawn under the plan; None without allocation events
        summary = inspector.memory_summary() if inspector is not None else None
        self.observed = summary if summary is not None and len(summary.timeline) else None
        steps = int(self.data.attrs.get("num_steps") or 0)
        self.figure = memory_figure(self.data, title=f"memory plan of {method!r}: {len(self.data)} planned tensors "
                                                     f"over {steps} instructions", observed=self.observed)
        super().__init__([PlotView(self.figure)], **kwargs)

    def text_lines(self, width: int) -> list[str]:
        """The plan per memory id (arena, lower bound) and what the run observed (TextForm: a plain REPL's repr)."""
        steps = int(self.data.attrs.get("num_steps") or 0)
        lines = [wrap(f"memory plan of {self.method!r}: {self.num_tensors} planned tensors over {steps} "
                      "instructions", width)]
        lines += frame_lines(self.summary(), width, title="per memory id (bytes; efficiency: lower bound / arena)")
        if self.observed is not None:
            lines.append(wrap(f"observed in the run: {self.observed!r}", width))
        return lines

    @property
    def num_tensors(self) -> int:
        """How many planned tensors the timeline draws (rows of the plan table)."""
        return len(self.data)

    def summary(self) -> pd.DataFrame:
        """Per memory id: tensors, arena bytes, lower bound, and how much of the arena the bound is."""
        rows = []
        sizes = list(self.data.attrs.get("buffer_sizes") or [])
        mem_ids = self.data["mem_id"].to_numpy()
        for m in sorted(int(x) for x in self.data["mem_id"].unique()):
            bound = int(_live_bytes(self.data, m).max())
            arena = sizes[m] if m < len(sizes) else None
            rows.append({"mem_id": m, "tensors": int((mem_ids == m).sum()), "arena_bytes": arena,
                         "lower_bound": bound, "efficiency": bound / arena if arena else None})
        return pd.DataFrame(rows)

    def html_fragment(self) -> _html.Fragment:
        """The timeline as a page piece: the plotly chart in an element that names the view and its tensor count."""
        frag = _html.plotly_fragment(self.figure, element_id=_html.new_id("memory"))
        frag.body = f'<div data-etlab-view="memory" data-tensors="{self.num_tensors}">{frag.body}</div>'
        return frag

    def save_html(self, path: str | os.PathLike, title: str | None = None) -> os.PathLike:
        """Writes the timeline as one offline HTML page atomically to `path` (title: the method's memory plan) and
        returns it."""
        return _html.write_page(path, _html.page(title or f"Memory plan of {self.method!r}", [self.html_fragment()]))
