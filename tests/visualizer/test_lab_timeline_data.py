"""The Lab dashboard's timeline data (etlab.jupyter._runs, issue 25 item 6): each span names its kind
(the legend), a backend's per-op events are nested (depth 1) inside their DELEGATE_CALL (depth 0) of the
same run, and the summary gives the run lengths in the Inspector's unit."""

from __future__ import annotations

from etlab.inspector import DELEGATE_CALL, execute_timings, op_timings, time_unit
from etlab.jupyter._runs import run_summary, timeline_spans


def test_delegate_events_nest_inside_their_call(mlp_inspector):
    timings = execute_timings(op_timings(mlp_inspector))
    spans = timeline_spans(timings)
    calls = [s for s in spans if s["name"] == DELEGATE_CALL]
    inner = [s for s in spans if s["depth"] == 1]
    assert calls and inner and all(s["depth"] == 0 for s in calls)
    assert {s["kind"] for s in calls} == {"DemoBackend call"}
    assert all(s["kind"].endswith("(delegated)") for s in inner)
    for s in inner:
        (call,) = [c for c in calls if c["run"] == s["run"] and c["instruction"] == s["instruction"]]
        assert call["start"] <= s["start"] and s["start"] + s["dur"] <= call["start"] + call["dur"] + 1e-9
    assert {s["kind"] for s in spans if not s["delegated"]} == {"relu"}


def test_summary_is_each_runs_length(mlp_inspector):
    timings = execute_timings(op_timings(mlp_inspector))
    summary = run_summary(timings, time_unit(mlp_inspector))
    spans = timeline_spans(timings)
    ends = {}
    for s in spans:
        ends[s["run"]] = max(ends.get(s["run"], 0.0), s["start"] + s["dur"])
    assert summary["unit"] == "ms" and summary["runs"] == len(ends)
    assert summary["min"] == min(ends.values()) and summary["max"] == max(ends.values())
    assert summary["min"] <= summary["p50"] <= summary["max"]
