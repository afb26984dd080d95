"""A/B diff: the planted regression is found and nothing else is flagged; statistics checked directly."""

from __future__ import annotations

import numpy as np
import pytest

from etlab.fleet import FleetSpec, Regression, diff, generate_fleet, holm, ingest, parse_selector
from etlab.fleet._cli import fleet_main
from etlab.fleet._diff import bootstrap_median_ratio, compare_samples


def test_planted_regression_found_and_nothing_else(store, fleet):
    d = diff(store[0], {"build": "A"}, {"build": "B"})
    flagged = d.table[d.table["flag"] != ""]
    assert flagged["op"].tolist() == ["convolution.out"] and flagged["flag"].tolist() == ["regression"]
    r = flagged.iloc[0]
    assert r["ci_low"] < fleet.spec.regression.factor - 1 < r["ci_high"]
    assert d.exit_code == 1
    assert len(d.table) == 10  # 7 kernels ops + DELEGATE_CALL + 2 backend ops, all compared


def test_per_device_class_and_per_instruction(store):
    d = diff(store[0], "build=A", "build=B", strata=["device_class"], key=["op", "debug_handle"])
    flagged = d.table[d.table["flag"] != ""]
    assert set(flagged["flag"]) == {"regression"}
    assert set(flagged["op"]) == {"convolution.out"}
    # both convolutions (instructions 0 and 2) on every device class
    assert sorted(zip(flagged["device_class"], flagged["debug_handle"])) == sorted(
        (c, h) for c in ("flagship", "mid", "low") for h in (0, 2))


def test_same_build_flags_nothing(store):
    d = diff(store[0], "build=A", "build=A")
    assert (d.table["flag"] == "").all() and d.exit_code == 0


def test_no_regression_fleet_passes_the_gate(tmp_path):
    fl = generate_fleet(tmp_path / "t", FleetSpec(devices_per_class=1, sessions=2, runs=8, regression=None, seed=2))
    ingest(fl.root, tmp_path / "s", workers=1)
    assert fleet_main(["diff", str(tmp_path / "s"), "--base", "build=A", "--head", "build=B"]) == 0


def test_improvement_is_not_a_regression(tmp_path):
    spec = FleetSpec(devices_per_class=1, sessions=2, runs=8, regression=Regression("B", "addmm.out", 0.7), seed=4)
    ingest(generate_fleet(tmp_path / "t", spec).root, tmp_path / "s", workers=1)
    d = diff(tmp_path / "s", "build=A", "build=B")
    assert d.table.loc[d.table["flag"] != "", "op"].tolist() == ["addmm.out"]
    assert d.improvements["op"].tolist() == ["addmm.out"] and d.exit_code == 0


def test_cli_diff_gate_and_html(store, tmp_path, capsys):
    html = tmp_path / "diff.html"
    code = fleet_main(["diff", str(store[0]), "--base", "build=A", "--head", "build=B", "--per", "device_class",
                       "--html", str(html)])
    assert code == 1
    out = capsys.readouterr().out
    assert "3 regression(s)" in out and out.count("regression") == 4 and "relu.out" not in out
    text = html.read_text()
    assert "convolution.out" in text and "plotly" in text and "etlab-tv" in text  # the sortable table
    assert fleet_main(["diff", str(store[0]), "--base", "nosuch=1", "--head", "build=B"]) == 2


def test_label_selector(store):
    d = diff(store[0], "build=A,label.session=0", "build=B,label.session=0")
    assert d.table["n_base"].max() == 48   # 6 devices x 1 of 2 sessions x 8 runs
    assert d.regressions["op"].tolist() == ["convolution.out"]


def test_holm_matches_definition():
    p = np.array([0.01, 0.04, np.nan, 0.03, 0.2])
    # sorted: 0.01*4, 0.03*3, 0.04*2, 0.2*1 -> 0.04, 0.09, 0.09 (monotone), 0.2
    np.testing.assert_allclose(holm(p), [0.04, 0.09, np.nan, 0.09, 0.2])


def test_bootstrap_interval_covers_a_known_shift():
    rng = np.random.default_rng(0)
    base = rng.lognormal(10, 0.1, 400)
    lo, hi = bootstrap_median_ratio(base, base * 1.2, n_boot=500, level=0.95, rng=np.random.default_rng(1))
    assert lo < 0.2 < hi and hi - lo < 0.1


def test_small_samples_are_not_tested():
    t = compare_samples({("x",): (np.array([1, 2]), np.array([5, 6]))}, threshold=0.05, alpha=0.05, n_boot=50,
                        level=0.95, seed=0)
    assert np.isnan(t["p_value"].iloc[0]) and t["flag"].iloc[0] == ""


def test_selector_parsing():
    assert parse_selector("build=B, device_class=mid") == {"build": "B", "device_class": "mid"}
    with pytest.raises(ValueError):
        parse_selector("build")


def test_view_builds_and_saves(store, tmp_path):
    v = diff(store[0], "build=A", "build=B").view()
    assert v.rows[0]["op"] == "convolution.out" and v.rows[0]["flag"] == "regression"   # sorted by change
    assert len(v.figure.data[0].y) == 10
    path = v.save_html(tmp_path / "v.html")
    assert "convolution.out" in path.read_text()


def test_view_is_the_visualizers_sortable_table_and_chart(store):
    """FleetDiff.view() is etlab.visualizer's FleetDiffView (fleet sits below the views): the shared
    TableView (sortable, filterable) with one row per op, largest change first, and the chart."""
    from etlab.visualizer import FleetDiffView, PlotView, TableView

    v = diff(store[0], "build=A", "build=B").view()
    assert isinstance(v, FleetDiffView) and isinstance(v.table, TableView)
    assert isinstance(v.children[1], PlotView)
    assert [r["op"] for r in v.table.rows] == [r["op"] for r in v.rows]
    changes = [r["change_pct"] for r in v.rows]
    assert changes == sorted(changes, reverse=True)
