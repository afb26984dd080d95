"""The numeric-gap table names the runtime event of a delegated op by its backend (it said "0": a backend
logs its outputs under its delegate debug identifier)."""

from __future__ import annotations

from etlab.inspector import numeric_gaps
from etlab.visualizer import NumericGapView


def test_delegated_rows_name_their_backend(mlp_inspector):
    rows = numeric_gaps(mlp_inspector)
    delegated = [r for r in rows if any(op.startswith("addmm") for op in r.aot_ops)]
    portable = [r for r in rows if r.aot_ops and r.aot_ops[0].startswith("relu")]
    assert len(delegated) == 3 and len(portable) == 2
    assert all(r.runtime_ops == ["DemoBackend event 0"] for r in delegated), [r.runtime_ops for r in delegated]
    assert all(r.runtime_ops == ["native_call_relu.out"] for r in portable)
    # the upstream-shaped DataFrame keeps the event's own name
    df = mlp_inspector.calculate_numeric_gap("MSE")
    assert ["0"] in [list(x) for x in df.runtime_ops]
    table = NumericGapView(mlp_inspector, show_graph=False).table
    assert "0" not in {r["runtime_ops"] for r in table.rows}
    assert sum(r["runtime_ops"] == "DemoBackend event 0" for r in table.rows) == 3
