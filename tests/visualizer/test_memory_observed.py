"""The memory view with a run's observed allocations under the plan (MemoryTimeline(program, inspector=...)):
the panel's numbers are the MemorySummary's, on the plan's instruction axis, in the figure, its HTML page
and the dashboard's Memory tab."""

from __future__ import annotations

from etlab.inspector import Inspector
from etlab.schema import serialize_etdump
from etlab.visualizer import MemoryTimeline
from tests.inspector._memory_dumps import Planted, memory_dump

P = Planted()


def _observed(fig, key):
    return next(t for t in fig.data if (t.meta or {}).get("etlab") == key)


def test_observed_panel_stacks_the_peak_run_on_the_plan_axis(mlp_run, tmp_path):
    ins = Inspector(etdump_data=serialize_etdump(memory_dump(runs=3)))
    view = MemoryTimeline(mlp_run.manager, inspector=ins)
    fig = view.figure
    assert view.observed is not None and view.observed.peak_run == 1
    acc, trans = (_observed(fig, f"observed_{k}") for k in ("accumulated", "transient"))
    # bytes above load; instruction i drawn over [i, i + 1), as the planned tensors; accumulated bytes held
    # from their instruction to the next one with events (the last one to the plan's end: 5 steps)
    u = P.unplanned[1]
    assert list(trans.x) == [0.5, 1.5, 2.5, 3.5] and list(trans.y) == [P.temp, 0, P.workspace, 0]
    assert list(trans.base) == [0, u, u, 0]
    assert list(acc.y) == [0, u, u, 0] and list(acc.width) == [1, 1, 1, 2] and list(acc.x) == [0.5, 1.5, 2.5, 4.0]
    tops = [b + y + P.held for b, y in zip(trans.base, trans.y)]
    assert tops == [P.run_bytes(1)[i] for i in range(4)] and max(tops) == view.observed.peak_bytes
    others = _observed(fig, "observed_runs")
    assert len(others.x) == 8 and set(others.y) == {P.run_bytes(r)[i] - P.held for r in (0, 2) for i in range(4)}
    title = fig.layout.annotations[-1].text
    assert f"tracked peak {view.observed.peak_bytes:,} at run 1, instruction 2" in title
    assert f"{P.held:,} held since load" in title
    page = view.save_html(tmp_path / "memory.html").read_text()
    assert "bytes above load per instruction" in page and "held since load" in page


def test_a_run_without_allocation_events_draws_the_plan_alone(mlp_run, mlp_inspector):
    view = MemoryTimeline(mlp_run.manager, inspector=mlp_inspector)
    assert view.observed is None
    assert not [t for t in view.figure.data if str((t.meta or {}).get("etlab", "")).startswith("observed")]
    plain = MemoryTimeline(mlp_run.manager)
    assert len(view.figure.data) == len(plain.figure.data)


def test_the_dashboards_memory_tab_draws_what_the_run_observed(mlp_run):
    from etlab.visualizer import show

    ins = Inspector(etdump_data=serialize_etdump(memory_dump(runs=2)))
    dash = show(ins, mlp_run.manager)
    memory = dash.views["memory"]
    assert memory.observed is not None and memory.observed.peak_bytes == P.peak(2)[0]


def test_the_summary_shows_itself_as_tables():
    import etlab.visualizer  # noqa: F401  (registers the reprs)

    summary = Inspector(etdump_data=serialize_etdump(memory_dump(runs=2))).memory_summary()
    page = summary._repr_html_()
    assert "data-etlab-view='memory-summary'" in page and "tracked peak" in page
    assert "delegate:XnnpackBackend" in page and "load + run" in page
