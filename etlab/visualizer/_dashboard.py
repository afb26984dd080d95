"""The dashboard: every view of a run in tabs (`show(inspector)`), and the same as one offline HTML report."""

from __future__ import annotations

import html
import os

import ipywidgets as widgets
from torch.fx import GraphModule

from etlab.errors import FormatError
from etlab.visualizer import _html
from etlab.visualizer._analysis_views import DelegationView, NumericGapView, ProfileView
from etlab.visualizer._graph_view import GraphView
from etlab.visualizer._memory_view import MemoryTimeline
from etlab.visualizer._phase_view import PhaseView
from etlab.visualizer._quant_view import QuantizationView
from etlab.visualizer._reprs import inspector_summary_html
from etlab.visualizer._sources import ProgramSources, resolve_sources
from etlab.visualizer._text import TextForm, wrap


class _PlannedProgram:
    """The little of an ExecutorchProgramManager memory_plan_dataframe needs, over a recorded planned graph."""

    def __init__(self, planned, method: str):
        self._planned, self.methods, self.buffer = planned, {method}, None
        gm = planned if isinstance(planned, GraphModule) else planned.graph_module
        plan = gm.meta.get("memory_plan")
        self.memory_plans = {method: plan} if plan is not None else {}

    def exported_program(self, method_name: str = "forward"):
        return self._planned


def _memory_source(sources):
    if sources.manager is not None:
        return sources.manager
    if sources.runtime is not None:
        return _PlannedProgram(sources.runtime, sources.method)
    return None


# Tabs of the report page (the focus glue in _html.page opens the graph tab through etlabShowTab).
_GLUE = """<script>
window.etlabShowTab = function (name) {
  document.querySelectorAll('.etlab-tabs > button').forEach(function (b) {
    b.classList.toggle('active', b.dataset.tab === name); });
  document.querySelectorAll('.etlab-tab').forEach(function (t) {
    t.style.display = t.dataset.tab === name ? '' : 'none'; });
  if (window.Plotly) document.querySelectorAll('.etlab-tab[data-tab="' + name + '"] .js-plotly-plot')
    .forEach(function (p) {  // drawn while hidden at a default width: take the tab's width
      requestAnimationFrame(function () { window.Plotly.relayout(p, { autosize: true, width: null }); }); });
  window.dispatchEvent(new Event('resize'));
};
</script>"""

_TAB_CSS = """<style>
.etlab-tabs { display: flex; gap: 2px; border-bottom: 1px solid var(--etlab-border); margin-bottom: 10px; }
.etlab-tabs > button { border: 1px solid var(--etlab-border); border-bottom: none; background: var(--etlab-bg-alt);
  color: var(--etlab-fg); padding: 6px 14px; cursor: pointer; border-radius: 5px 5px 0 0; font: inherit; }
.etlab-tabs > button.active { background: var(--etlab-bg); font-weight: 600; position: relative; top: 1px; }
</style>"""


_TITLES = {"summary": "Summary", "graph": "Graph", "memory": "Memory", "delegation": "Delegation",
           "gap": "Numeric gap", "profile": "Profile", "phases": "Phases", "quantization": "Quantization"}


def _missing_html(missing: dict[str, str]) -> str:
    items = "".join(f"<li><b>{html.escape(_TITLES.get(k, k))}</b>: {html.escape(v)}</li>" for k, v in missing.items())
    return f"<div class='etlab-note etlab-theme' data-role='missing-tabs'><p>Tabs not shown:</p><ul>{items}</ul></div>"


class Dashboard(TextForm, widgets.Tab):
    """Tabs: Summary, Graph (compare mode when several graphs are known; the first two shown), Memory, Delegation,
    Numeric gap, Profile; tabs whose data is missing are left out (see `.missing`). `memory_plan`: the Memory
    tab's table when the program manager is not at hand (`_memory_view.pte_plan_frame` of the .pte)."""

    TEXT_TOP = 10  # events in the text form's table

    def text_lines(self, width: int) -> list[str]:
        """The dashboard outside a notebook (TextForm: a plain REPL's `repr`, IPython's terminal): the run, the tabs
        and why any is missing, the slowest events and the numeric gap in a line. The widgets' own repr is kilobytes
        of HTML."""
        from etlab.inspector import compact_table

        lines = [wrap(f"Dashboard of {self.inspector!r}", width),
                 wrap("tabs: " + ", ".join(self._titles[k] for k in self.views), width)]
        lines += [wrap(f"not shown: {_TITLES.get(k, k)}: {why}", width) for k, why in self.missing.items()]
        table = compact_table(self.inspector.to_dataframe(), width, self.TEXT_TOP).rstrip("\n")
        lines.append(table.replace("--all: every event, --wide: every column", "all: inspector.to_dataframe()"))
        gap = self.views.get("gap")
        if isinstance(gap, NumericGapView):
            lines.append(wrap(f"numeric gap: {gap.summary_text()}", width))
        return lines

    def __init__(self, inspector, program=None, *, method: str = "forward", quantization=None, memory_plan=None,
                 **kwargs):
        try:
            sources = resolve_sources(program if program is not None else inspector, method, inspector)
        except FormatError:  # a defective record (a program member that does not decode): said, not hidden
            raise
        except ValueError:  # an Inspector without ETRecord: timings only
            sources = ProgramSources(method=method)
        sources.inspector = inspector
        self.inspector = inspector
        self.views: dict[str, object] = {}
        self.missing: dict[str, str] = {}
        kinds = sources.available()
        summary = self.views["summary"] = widgets.HTML(inspector_summary_html(inspector))
        if kinds:
            # two panes at most to start with (ATen and Edge when all three are known): three side by
            # side with the details panel leave each too narrow to read; the toolbar adds the third
            self.views["graph"] = GraphView(program if program is not None else inspector,
                                            graph=kinds if len(kinds) > 1 else kinds[0], inspector=inspector,
                                            method=method, overlay="latency", shown=kinds[:2])
        else:
            self.missing["graph"] = "no graph: give the Inspector an ETRecord (or pass the program)"
        memory = memory_plan if memory_plan is not None else _memory_source(sources)  # a plan table (a .pte's)
        try:
            if memory is None:
                raise ValueError("no planned program: pass the ExecutorchProgramManager, as in "
                                 "inspector.show(et) or show(inspector, et)")
            self.views["memory"] = MemoryTimeline(memory, method, inspector=inspector)  # with what the run observed
        except (ValueError, TypeError, KeyError) as e:
            self.missing["memory"] = str(e)
        if sources.edge is not None:
            self.views["delegation"] = DelegationView(sources.edge, method, show_graph=False)
        else:
            self.missing["delegation"] = "no edge graph"
        self.views["gap"] = NumericGapView(inspector, show_graph=False)
        self.views["profile"] = ProfileView(inspector, program, method)
        if PhaseView.applies(program):  # an LLM's prefill and decode methods: the Phases tab
            try:
                self.views["phases"] = PhaseView(inspector, program)
            except (ValueError, TypeError) as e:
                self.missing["phases"] = str(e)
        if quantization is not None:  # a QuantReport (etlab.devtools.quantization_report)
            self.views["quantization"] = QuantizationView(quantization)
        titles = _TITLES
        if self.missing:  # say on the first tab, not only in `.missing`, why a tab is not there
            summary.value += _missing_html(self.missing)
        summary.value += self.views["gap"].dropped_html()  # dropped intermediates, where one looks first
        super().__init__(children=list(self.views.values()), **kwargs)
        self.add_class("etlab-dashboard")  # theme.css: its tab labels keep the text color (contrast)
        for i, key in enumerate(self.views):
            self.set_title(i, titles[key])
        self._titles = titles
        self._link_views()

    def _link_views(self) -> None:
        graph = self.views.get("graph")
        if not isinstance(graph, GraphView):
            return
        keys = list(self.views)

        def focus(change):
            target = (change["new"] or {}).get("row", {}).get("focus")
            if target:
                try:
                    graph.focus(target.get("name"), handles=target.get("handles"), kind=target.get("kind"))
                    self.selected_index = keys.index("graph")
                except KeyError:
                    pass

        for key in ("delegation", "gap", "profile"):
            table = getattr(self.views.get(key), "table", None)
            if table is not None:
                table.observe(focus, names="clicked")

    def page(self, title: str = "etlab report") -> str:
        """The dashboard as one offline HTML document."""
        buttons, frags = [], []
        for i, (key, view) in enumerate(self.views.items()):
            buttons.append(f'<button data-tab="{key}" class="{"active" if i == 0 else ""}" '
                           f'onclick="etlabShowTab(\'{key}\')">{self._titles[key]}</button>')
            parts = [_html.Fragment(view.value)] if isinstance(view, widgets.HTML) else _html.view_fragments(view)
            style = "" if i == 0 else ' style="display:none"'
            frags.append(_html.Fragment(f'<section class="etlab-tab" data-tab="{key}"{style}>'))
            frags.extend(parts)
            frags.append(_html.Fragment("</section>"))
        frags.insert(0, _html.Fragment(f'<nav class="etlab-tabs">{"".join(buttons)}</nav>', scripts=[_GLUE]))
        return _html.page(title, frags, extra_head=_TAB_CSS)

    def save_html(self, path: str | os.PathLike, title: str = "etlab report") -> os.PathLike:
        """Writes every tab as one offline HTML page (tab buttons switch sections without a kernel) atomically to `path`
        and returns it: the report to attach to a bug or share."""
        return _html.write_page(path, self.page(title))


def show(inspector, program=None, *, method: str = "forward", quantization=None) -> Dashboard:
    """The tabbed dashboard of every view of an Inspector (and its program, when given; with
    `quantization=` a QuantReport, a Quantization tab)."""
    return Dashboard(inspector, program, method=method, quantization=quantization)
