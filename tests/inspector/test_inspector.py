"""Inspector on synthetic dumps: grouping, timings, delegates, ETRecord join, tables, trace, numerics."""

from __future__ import annotations

import io
import json

import numpy as np
import pandas as pd
import pytest
import torch

from etlab.inspector import Inspector, TimeScale, compare_results
from etlab.inspector import _frames as frames
from etlab.schema import etdump as s
from etlab.schema import serialize_etdump
from tests.inspector.conftest import NUMEL, OPS, RUNS, make_program_info

OPS_NAMES = ("addmm.out", "relu.out", "permute_copy.out", "convolution.out", "add.out")


def _kernel_ns(op: int, run: int) -> int:  # synthetic_etdump's kernel durations
    return 1000 + 37 * op + 11 * run


@pytest.fixture()
def inspector(synthetic_files):
    etdp, buf = synthetic_files
    return Inspector(etdump_path=etdp, debug_buffer_path=buf)


def test_blocks_events_and_timings(inspector):
    blocks = inspector.event_blocks
    assert [b.name for b in blocks] == ["Default", "Execute"]
    assert blocks[1].num_runs == RUNS
    names = [e.name for e in blocks[1].events]
    expected = []
    for i in range(OPS):
        expected += [f"native_call_{OPS_NAMES[i]}", "OPERATOR_CALL"]
    assert names == [*expected, "0", "conv_0", "DELEGATE_CALL", "Method::execute"]
    for i in range(OPS):
        kernel = blocks[1].events[2 * i]
        assert kernel.perf_data.raw == pytest.approx([_kernel_ns(i, r) / 1e6 for r in range(RUNS)])
        assert kernel.perf_data.p50 == pytest.approx(_kernel_ns(i, 1) / 1e6)
        assert kernel.instruction_id == i and kernel.chain_index == 0 and kernel.is_delegated_op is False
        assert kernel.start_time is not None and len(kernel.start_time) == RUNS
        # the op's output tensor, from the first run of the block
        assert torch.equal(kernel.debug_data[0], (i * 10 + torch.arange(NUMEL)).float())
        assert blocks[1].events[2 * i + 1].debug_data[0] is kernel.debug_data[0]
    out = blocks[1].run_output
    assert len(out) == 1 and torch.equal(out[0], (OPS * 10 + torch.arange(NUMEL)).float())


def test_delegate_events(inspector):
    ev = {e.name: e for e in inspector.event_blocks[1].events}
    assert ev["0"].delegate_debug_identifier == 0 and ev["0"].is_delegated_op
    assert ev["conv_0"].delegate_debug_identifier == "conv_0" and ev["conv_0"].is_delegated_op
    assert ev["conv_0"].perf_data.raw == pytest.approx([(300 + r) / 1e6 for r in range(RUNS)])
    assert ev["conv_0"].raw_delegate_debug_metadatas == [b"conv-meta"] * RUNS
    assert ev["DELEGATE_CALL"].is_delegated_op is False


def test_delegate_metadata_parser_and_columns(synthetic_files):
    def parse(metas: list[bytes]) -> dict:
        return {"meta_len": len(metas[0]), "meta_runs": len(metas)}

    ins = Inspector(etdump_path=synthetic_files[0], delegate_metadata_parser=parse)
    df = ins.to_dataframe(include_delegate_debug_data=True)
    row = df[df.event_name == "conv_0"].iloc[0]
    assert row["meta_len"] == len(b"conv-meta") and row["meta_runs"] == RUNS
    assert pd.isna(df[df.event_name == "OPERATOR_CALL"].iloc[0]["meta_len"])
    assert "meta_len" not in ins.to_dataframe().columns
    raw = Inspector(etdump_path=synthetic_files[0]).to_dataframe(include_delegate_debug_data=True)
    assert raw[raw.event_name == "0"].iloc[0]["delegate_debug_metadata"] == [b"\x01\x02"] * RUNS


def test_time_scales_and_delegate_clock(synthetic_files):
    us = Inspector(etdump_path=synthetic_files[0], target_time_scale="us")
    k = us.event_blocks[1].events[0]
    assert k.perf_data.raw == pytest.approx([_kernel_ns(0, r) / 1e3 for r in range(RUNS)])
    assert "p50 (us)" in us.to_dataframe().columns
    conv = Inspector(etdump_path=synthetic_files[0], delegate_time_scale_converter=lambda name, t: t * 2.0)
    d = {e.name: e for e in conv.event_blocks[1].events}
    assert d["conv_0"].perf_data.raw == pytest.approx([2.0 * (300 + r) for r in range(RUNS)])
    assert d["DELEGATE_CALL"].perf_data.raw == pytest.approx([500 / 1e6] * RUNS)  # not delegated: not converted
    with pytest.raises(ValueError, match="cycles"):
        Inspector(etdump_path=synthetic_files[0], source_time_scale=TimeScale.CYCLES)
    with pytest.raises(ValueError, match="target_time_scale"):
        Inspector(etdump_path=synthetic_files[0], target_time_scale="hours")


def _dump(*runs: list[s.Event], names=None) -> bytes:
    return serialize_etdump(s.ETDump(run_data=[
        s.RunData(name=(names[i] if names else "Execute"), events=ev) for i, ev in enumerate(runs)]))


def _p(name, instr, start, end, chain=0, **kw) -> s.Event:
    return s.Event(profile_event=s.ProfileEvent(name=name, chain_index=chain, instruction_id=instr, start_time=start,
                                                end_time=end, **kw))


def test_runs_group_by_signature_and_repeats_keep_last_data():
    a = [_p("op", 0, 0, 10), _p("op2", 1, 10, 30)]
    b = [_p("op", 0, 0, 12), _p("op2", 1, 12, 40)]
    loop = [_p("op", 0, 0, 5), _p("op2", 1, 5, 6), _p("op", 0, 6, 106)]  # "op" twice: first place, last data
    other = [_p("op", 0, 0, 3), _p("op3", 1, 3, 4)]
    ins = Inspector(etdump_data=_dump(a, b, other, loop), target_time_scale="ns")
    blocks = ins.event_blocks
    assert [(bl.name, bl.num_runs) for bl in blocks] == [("Execute", 3), ("Execute", 1)]
    assert [(e.name, e.perf_data.raw) for e in blocks[0].events] == [("op", [10, 12, 100]), ("op2", [20, 28, 1])]
    assert [e.name for e in blocks[1].events] == ["op", "op3"]


def test_clock_wraparound_and_impossible_times():
    ins = Inspector(etdump_data=_dump([_p("wrap", 0, (1 << 32) - 10, 5), _p("bad", 1, 1 << 40, 5)]),
                    target_time_scale="ns")
    wrap, bad = ins.event_blocks[0].events
    assert wrap.perf_data.raw == [15.0]
    assert np.isnan(bad.perf_data.raw[0])


def test_debug_names_and_outputs_follow_upstream():
    dbg = s.Event(debug_event=s.DebugEvent(chain_index=0, instruction_id=3, name="named_output", debug_entry=s.Value(
        val=s.ValueType.Int, int_value=s.Int(7))))
    only_dbg = s.Event(debug_event=s.DebugEvent(chain_index=0, instruction_id=4, debug_entry=s.Value(
        val=s.ValueType.Double, double_value=s.Double(0.5))))
    out = s.Event(debug_event=s.DebugEvent(instruction_id=0, debug_entry=s.Value(
        val=s.ValueType.Bool, bool_value=s.Bool(True), output=s.Bool(True))))
    ins = Inspector(etdump_data=_dump([dbg, _p("OPERATOR_CALL", 3, 0, 1), only_dbg, out]))
    e1, e2 = ins.event_blocks[0].events
    assert (e1.name, e1.debug_data, e1.perf_data is not None) == ("named_output", [7], True)
    assert (e2.name, e2.debug_data, e2.perf_data) == ("", [0.5], None)
    assert ins.event_blocks[0].run_output == [True]
    df = ins.to_dataframe()
    assert df["raw"].tolist()[1] is None and np.isnan(df["p50 (ms)"].iloc[1])


def test_fast_dataframe_equals_event_objects(inspector):
    fast = inspector.to_dataframe(include_delegate_debug_data=True)
    slow = pd.concat([b.to_dataframe(include_units=True, include_delegate_debug_data=True)
                      for b in inspector.event_blocks], ignore_index=True)
    assert list(fast.columns) == list(slow.columns)
    for col in fast.columns:
        for x, y in zip(fast[col], slow[col]):
            if isinstance(x, list) and x and isinstance(x[0], torch.Tensor):
                assert all(torch.equal(a, b) for a, b in zip(x, y))
            elif isinstance(x, float) and np.isnan(x):
                assert np.isnan(y)
            elif isinstance(x, float):
                assert x == pytest.approx(y, rel=1e-12)
            else:
                assert x == y, col


def test_frame_is_what_pandas_own_constructor_builds(inspector):
    """to_dataframe hands pandas typed columns without inference (etlab.inspector._frames._frame): the
    frame must be the one pandas' public constructor makes of the same cells (dtypes, labels, index)."""
    fast = inspector.to_dataframe()
    cells = {c: fast[c].tolist() for c in fast.columns}
    own = pd.DataFrame(cells)
    for c in ("delegate_debug_identifier", "delegate_backend_name"):  # kept objects, as upstream's
        own[c] = pd.Series(cells[c], dtype=object)
    assert type(fast).__name__ == "TensorFrame"
    pd.testing.assert_index_equal(fast.columns, own.columns, exact=True)
    pd.testing.assert_index_equal(fast.index, own.index, exact=True)
    assert fast.dtypes.tolist() == own.dtypes.tolist()
    assert fast.drop(columns=["debug_data"]).astype(str).equals(own.drop(columns=["debug_data"]).astype(str))
    fast.iloc[0, fast.columns.get_loc("raw")] = None  # a frame of its own: cells can be changed
    assert inspector.to_dataframe()["raw"].iloc[0] is not None


def test_no_debug_buffer_gives_meta_tensors(synthetic_files):
    ins = Inspector(etdump_path=synthetic_files[0])
    t = ins.event_blocks[1].events[0].debug_data[0]
    assert t.device.type == "meta" and t.shape == (NUMEL,) and t.dtype == torch.float32


def test_printing_and_tsv(inspector, tmp_path, monkeypatch):
    buf = io.StringIO()
    inspector.print_data_tabular(file=buf)
    text = buf.getvalue()
    assert "native_call_addmm.out" in text and "OPERATOR_CALL" not in text and "debug_data" not in text
    path = tmp_path / "out.tsv"
    inspector.save_data_to_tsv(path)
    tsv = pd.read_csv(path, sep="\t", index_col=0)
    assert len(tsv) == len(frames.printable(inspector.to_dataframe())) and "p50 (ms)" in tsv.columns
    shown = []

    class Kernel:  # a notebook: HTML instead of text
        kernel = object()

    monkeypatch.setattr(frames, "_notebook_shell", lambda: Kernel())
    monkeypatch.setattr("IPython.display.display", lambda obj: shown.append(obj))
    inspector.print_data_tabular()
    assert "<table" in shown[0].data


def test_etrecord_join(synthetic_files):
    ins = Inspector(etdump_path=synthetic_files[0], etrecord=make_program_info())
    ev = {e.name: e for e in ins.event_blocks[1].events}
    k = ev["native_call_relu.out"]
    assert k.debug_handles == 2 and k.op_types == ["aten.op1.default"]
    assert k.stack_traces == {"node_1": "model.py:11"}
    assert k.module_hierarchy["node_1"]["L__self___layers_fc1"] == ("layers.fc1", "torch.nn.Linear")
    assert ev["conv_0"].debug_handles == (11, 12) and ev["conv_0"].delegate_backend_name == "XnnpackBackend"
    assert ev["conv_0"].op_types == ["aten.convolution.default"] * 2
    assert ev["0"].debug_handles == (10,)
    assert ev["DELEGATE_CALL"].delegate_backend_name == "XnnpackBackend"
    assert ev["DELEGATE_CALL"].debug_handles == (10, 11, 12)
    assert ev["Method::execute"].debug_handles is None  # framework events belong to no node
    df = ins.to_dataframe()
    assert df[df.event_name == "native_call_relu.out"]["op_types"].iloc[0] == ["aten.op1.default"]
    # module totals: sums of average kernel times (OPERATOR_CALL excluded)
    avg = {i: np.mean([_kernel_ns(i, r) for r in range(RUNS)]) / 1e6 for i in range(OPS)}
    assert ins.find_total_for_module("layers.fc1") == pytest.approx(avg[0] + avg[1])
    assert ins.find_total_for_module("L__self___layers_fc2") == pytest.approx(avg[2] + avg[3])
    assert ins.find_total_for_module("layers") == pytest.approx(sum(avg.values()))
    assert ins.find_total_for_module("fc") == 0.0  # names match exactly, not as substrings
    ops = ins.get_op_list()
    assert [e.name for e in ops["aten.op0.default"]] == ["native_call_addmm.out"]
    assert [e.name for e in ops["aten.convolution.default"]] == ["0", "conv_0", "DELEGATE_CALL"]
    assert [e.name for e in ins.get_op_list(show_delegated_ops=False)["aten.convolution.default"]] == ["DELEGATE_CALL"]
    with pytest.raises(ValueError, match="etrecord"):
        Inspector(etdump_path=synthetic_files[0]).find_total_for_module("fc1")


def test_frame_dicts_are_new_at_each_call_and_shared_by_rows_of_one_handle_set(synthetic_files):
    """A frame's stack_traces / module_hierarchy cells are its own (changing one changes neither the Inspector's
    Events nor another frame); rows that ran the same nodes (a kernel and its OPERATOR_CALL) share one dict."""
    ins = Inspector(etdump_path=synthetic_files[0], etrecord=make_program_info())
    df = ins.to_dataframe()
    rows = df.index[df.event_name == "native_call_relu.out"].tolist()
    first = df.at[rows[0], "stack_traces"]
    assert first == {"node_1_": "model.py:11"}
    operator_call = df.at[rows[0] + 1, "stack_traces"]
    assert df.at[rows[0] + 1, "event_name"] == "OPERATOR_CALL" and operator_call is first
    first["planted_"] = "x"
    df.at[rows[0], "module_hierarchy"]["planted_"] = "x"
    again = ins.to_dataframe()
    assert again.at[rows[0], "stack_traces"] == {"node_1_": "model.py:11"}
    assert "planted_" not in again.at[rows[0], "module_hierarchy"]
    events = [e for b in ins.event_blocks for e in b.events]
    assert not any("planted_" in e.stack_traces or "planted_" in e.module_hierarchy for e in events)
    assert next(e for e in events if e.name == "native_call_relu.out").stack_traces == {"node_1": "model.py:11"}


def test_op_list_without_etrecord(inspector):
    ops = inspector.get_op_list("Execute")
    assert sorted(ops) == sorted(OPS_NAMES[:OPS]) and len(ops["addmm.out"]) == 1


def test_etrecord_argument_forms(synthetic_files):
    info = make_program_info()

    class Record:
        def program_info(self):
            return info

    assert Inspector(etdump_path=synthetic_files[0], etrecord=Record()).event_blocks[1].events[0].debug_handles == 1
    with pytest.raises(TypeError, match="ProgramInfo"):
        Inspector(etdump_path=synthetic_files[0], etrecord=42)
    with pytest.raises(ValueError, match="exactly one"):
        Inspector()


def test_allocations(inspector):
    a = inspector.allocations
    assert a["allocator_name"].tolist() == ["method_allocator", "temp", "method_allocator"]
    assert a["allocation_size"].tolist() == [64, 128, 192] and set(a["run_name"]) == {"Default"}


def test_chrome_trace(inspector, tmp_path):
    path = tmp_path / "trace.json"
    inspector.to_chrome_trace(path)
    trace = json.loads(path.read_text())
    x = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    per_run = OPS + 3 + 1  # kernels (their OPERATOR_CALL twins left out), the delegate's 3 events, execute
    assert len(x) == 2 + RUNS * per_run and not [e for e in x if e["name"] == "OPERATOR_CALL"]
    threads = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert threads == {1: "run 0: Default", **{2 * r + 1: f"run {r}: Execute" for r in range(1, RUNS + 1)}}
    kernel = [e for e in x if e["name"] == "native_call_addmm.out"]
    assert [e["dur"] for e in kernel] == pytest.approx([_kernel_ns(0, r) / 1e3 for r in range(RUNS)])
    assert min(e["ts"] for e in x) == 0.0
    for r in range(1, RUNS + 1):  # delegate events nest inside their DELEGATE_CALL on the run's track
        call = next(e for e in x if e["name"] == "DELEGATE_CALL" and e["tid"] == 2 * r + 1)
        inner = [e for e in x if e["cat"] == "delegate" and e["tid"] == 2 * r + 1]
        assert {e["name"] for e in inner} == {"0", "conv_0"}
        assert all(call["ts"] <= e["ts"] and e["ts"] + e["dur"] <= call["ts"] + call["dur"] for e in inner)


def test_compare_results():
    ref = [torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0.5]), "text"]
    out = [torch.tensor([1.0, 2.0, 4.0]), torch.tensor([0.5]), "text"]
    r = compare_results(ref, out)
    assert r["mse"][0] == pytest.approx(1 / 3) and r["l1"][0] == pytest.approx(1.0)
    assert r["snr"][0] == pytest.approx(10 * np.log10((14 / 3) / (1 / 3)))
    assert r["snr"][1] == float("inf") and r["mse"][1] == 0.0 and r["mse"][2] is None
    assert r["cosine_similarity"][1] == pytest.approx(1.0)
    assert list(compare_results(ref, out, metrics=["MSE"])) == ["mse"]
    with pytest.raises(ValueError, match="2 reference outputs but 3"):
        compare_results(ref[:2], out)
    with pytest.raises(ValueError, match="shapes differ"):
        compare_results([torch.zeros(2)], [torch.zeros(3)])


def test_numeric_gap_points_at_the_perturbed_op(synthetic_files):
    etdp, buf = synthetic_files
    aot = {(i + 1,): (i * 10 + torch.arange(NUMEL)).float() for i in range(OPS)}
    aot[(3,)] = aot[(3,)] + 0.5  # the graph disagrees with the runtime at op 2
    ins = Inspector(etdump_path=etdp, debug_buffer_path=buf, etrecord=make_program_info(lambda: aot))
    df = ins.calculate_numeric_gap("MSE")
    assert df["aot_debug_handle"].tolist() == [(1,), (2,), (3,), (4,)]
    assert df["runtime_ops"].tolist() == [[f"native_call_{OPS_NAMES[i]}"] for i in range(OPS)]
    assert df["aot_ops"].tolist() == [[f"node_{i}"] for i in range(OPS)]
    gaps = [g[0] for g in df["gap"]]
    assert gaps[2] == pytest.approx(0.25) and [gaps[i] for i in (0, 1, 3)] == [0.0, 0.0, 0.0]
    assert df["stacktraces"].iloc[2] == {"node_2": "model.py:12"}
    snr = ins.calculate_numeric_gap("snr")
    assert next(g[0] for g in snr["gap"]) == float("inf") and np.isfinite(snr["gap"].iloc[2][0])
    with pytest.raises(ValueError, match="unknown distance"):
        ins.calculate_numeric_gap("cosine")
    with pytest.raises(ValueError, match="etrecord"):
        Inspector(etdump_path=etdp).calculate_numeric_gap("MSE")


def test_matching_many_to_one():
    """A delegate covering handles 1..3 is compared with the graph's output of its last node;
    an op sharing a handle with it merges into it; multi-output delegates map outputs from the end."""
    from etlab.inspector._numeric import RuntimeIntermediate, match_intermediates

    aot = {(h,): torch.full((2,), float(h)) for h in range(1, 7)}
    runtime = [
        RuntimeIntermediate((1, 2, 3), 5, [torch.full((2,), 3.0)], 1, ["DELEGATE_CALL"]),
        RuntimeIntermediate((3,), 2, [torch.full((2,), 9.0)], 1, ["native_call_x"]),
        RuntimeIntermediate((4, 5), 6, [torch.full((2,), 4.0), torch.full((2,), 5.0)], 2, ["DELEGATE_CALL"]),
        RuntimeIntermediate((6, 99), 7, [torch.zeros(2)], 1, ["y"]),  # 99 is unknown to the graph: still maps 6?
    ]
    got = {(h, float(a[0])): float(v[0]) for h, a, _r, v in match_intermediates(aot, runtime)}
    assert got[((1, 2, 3), 3.0)] == 3.0          # latest instruction's value wins after merging
    assert got[((4, 5), 5.0)] == 5.0 and got[((4, 5), 4.0)] == 4.0
    assert ((6, 99), 6.0) not in got              # last handle 99 has no graph output


def test_numeric_gap_compares_through_a_trailing_view(synthetic_files):
    """An op decomposed into compute + reshape shares one handle: the runtime may log the data
    before the reshape. Same elements, other shape -> compared as the graph's shape, not an error."""
    etdp, buf = synthetic_files
    aot = {(i + 1,): (i * 10 + torch.arange(NUMEL)).float().reshape(1, NUMEL) for i in range(OPS)}
    aot[(2,)] = aot[(2,)] * 2  # still caught through the reshape
    ins = Inspector(etdump_path=etdp, debug_buffer_path=buf, etrecord=make_program_info(lambda: aot))
    gaps = [g[0] for g in ins.calculate_numeric_gap("MSE")["gap"]]
    assert gaps[0] == 0.0 and gaps[1] > 0 and gaps[2:] == [0.0] * (OPS - 2)
