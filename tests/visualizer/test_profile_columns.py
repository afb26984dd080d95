"""The notebook profile table puts the event and its p50 first (issue 25 item 6: p50 sat far right,
past the long ops/module columns, and was cut off in a notebook cell), then its share of the run."""

from __future__ import annotations

import pytest

from etlab.inspector import timings_counted_once
from etlab.visualizer import ProfileView


def test_p50_and_share_come_first(mlp_inspector):
    view = ProfileView(mlp_inspector)
    keys = [c["key"] for c in view.table.columns]
    assert keys[:4] == ["name", "p50", "share", "runs"]
    assert keys.index("ops") > keys.index("share") and keys[-1] == "source"
    once = {id(t) for t in timings_counted_once(view.timings)}
    counted = [r for r, t in zip(view.table.rows, view.timings) if id(t) in once]
    assert sum(r["share"] for r in counted) == pytest.approx(100.0, abs=0.1)
    assert all(0 <= r["share"] <= 100 for r in view.table.rows)
