"""Inspector.compare and `etlab compare`: the zoo MLP compiled portable and DemoBackend-delegated,
a build with one planted weight error, and two runs of one program."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from etlab.compiler import to_edge_transform_and_lower
from etlab.compiler.backends import DemoPartitioner
from etlab.inspector import Comparison, Inspector
from etlab.inspector._rollups import _handles  # an event's handles as a tuple (a kernel's is an int)
from etlab.models import make_mlp
from etlab.runtime import Runtime
from tests.inspector.conftest import OPS, make_program_info
from tests.inspector.conftest import RUNS as SYNTHETIC_RUNS

REPO = Path(__file__).resolve().parents[2]
RUNS = 3


@dataclass
class Build:
    folder: Path
    pte: Path
    etrecord: Path
    inputs: tuple

    def run(self, name: str = "run") -> tuple[Path, Path]:
        """Runs the program RUNS times with tracing and intermediates; (etdp, debug buffer)."""
        etdp, buf = self.folder / f"{name}.etdp", self.folder / f"{name}.bin"
        program = Runtime.get().load_program(self.pte, enable_etdump=True, debug_buffer_size=1 << 20)
        method = program.load_method("forward")
        for _ in range(RUNS):
            method.execute(list(self.inputs))
        program.write_etdump_result_to_file(etdp, buf)
        return etdp, buf

    def inspector(self, name: str = "run") -> Inspector:
        return Inspector(etdump_path=self.folder / f"{name}.etdp", debug_buffer_path=self.folder / f"{name}.bin",
                         etrecord=self.etrecord)


def build(folder: Path, *, delegate: bool = False, plant=None) -> Build:
    """The zoo MLP compiled (portable or delegated to the DemoBackend), its ETRecord saved, run once."""
    model, inputs = make_mlp()
    if plant is not None:
        plant(model)
    folder.mkdir(parents=True, exist_ok=True)
    edge = to_edge_transform_and_lower(torch.export.export(model, inputs),
                                       partitioner=[DemoPartitioner()] if delegate else None, generate_etrecord=True)
    manager = edge.to_executorch()
    pte, rec = folder / "model.pte", folder / "model.etrecord"
    manager.write_to_file(pte)
    record = manager.get_etrecord()
    record.update_representative_inputs(list(inputs))
    record.save(rec)
    b = Build(folder, pte, rec, inputs)
    b.run()
    return b


def _plant_fc2(model) -> None:
    with torch.no_grad():
        model.fc2.weight[3, 5] += 0.5


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> dict[str, Build]:
    root = tmp_path_factory.mktemp("compare")
    out = {"portable": build(root / "portable"), "delegated": build(root / "delegated", delegate=True),
           "planted": build(root / "planted", plant=_plant_fc2)}
    out["portable"].run("run2")
    return out


@pytest.fixture(scope="module")
def portable_vs_delegated(builds) -> Comparison:
    return builds["portable"].inspector().compare(builds["delegated"].inspector(), name_a="portable",
                                                  name_b="delegated")


def _events(ins: Inspector, handle: int) -> list:
    """The timed events of the execute blocks covering `handle`, pooled over blocks."""
    return [e for b in ins.event_blocks if b.name != "Default" for e in b.events
            if e.perf_data is not None and handle in _handles(e.debug_handles)
            and e.name not in ("OPERATOR_CALL", "DELEGATE_CALL")]


def test_portable_vs_delegated_rows_join_delegate_events_to_the_kernels_they_cover(builds, portable_vs_delegated):
    c = portable_vs_delegated
    assert c.by == "debug_handle" and c.rows
    assert all(r.present == "both" for r in c.rows), [r.key for r in c.rows if r.present != "both"]
    assert c.summary.matched == len(c.rows) and c.summary.only_a == c.summary.only_b == 0
    linear = [r for r in c.rows if r.backend_b == "DemoBackend"]
    assert len(linear) == 3  # fc1, fc2, fc3 went to the backend; relu stayed portable
    for r in linear:
        assert r.backend_a is None and len(r.events_b) == 1 and r.events_b[0].startswith("DemoBackend #")
        assert {"aten.addmm.default", "aten.permute_copy.default"} <= set(r.ops)
        # A runs the linear as permute_copy + addmm kernels: their runs are summed, then the median taken
        assert sorted(e.rsplit(".", 1)[0] for e in r.events_a) == ["native_call_addmm", "native_call_permute_copy"]
        h = r.handles[-1]
        a_runs = np.sum([e.perf_data.raw for e in _events(builds["portable"].inspector(), h)], axis=0)
        assert r.latency_a == pytest.approx(float(np.median(a_runs)))
        (b_event,) = _events(builds["delegated"].inspector(), h)
        assert r.latency_b == pytest.approx(b_event.perf_data.p50)
        assert r.delta == pytest.approx(r.latency_b - r.latency_a)
        assert r.ratio == pytest.approx(r.latency_b / r.latency_a)
        assert r.runs_a == r.runs_b == RUNS
    # same arithmetic both ways: every output compared, and equal up to float rounding
    assert c.summary.compared_outputs == len(c.rows)
    assert all(r.max_abs < 1e-5 and r.cosine > 0.99999 for r in c.rows)
    assert c.summary.total_ratio == pytest.approx(c.summary.total_b / c.summary.total_a)


def test_planted_weight_error_is_located_at_its_op(builds):
    c = builds["portable"].inspector().compare(builds["planted"].inspector())
    assert all(r.present == "both" for r in c.rows)
    differing = [r for r in c.rows if r.max_abs]
    first = differing[0]
    assert first.module == "fc2" and "aten.addmm.default" in first.ops
    assert all(r.max_abs == 0 and r.sqnr == math.inf and r.cosine == pytest.approx(1.0)
               for r in c.rows[: c.rows.index(first)])
    assert math.isfinite(first.sqnr) and 0 < first.relative < 1
    # everything downstream of fc2 differs too; the worst-numeric list names the planted op's row first
    assert {r.key for r in c.rows[c.rows.index(first):]} == {r.key for r in differing}
    assert c.top(1, "numeric")[0].sqnr <= first.sqnr


def test_two_runs_of_one_program_differ_only_in_time(builds):
    ins = builds["portable"]
    c = ins.inspector().compare(ins.inspector("run2"))
    assert c.rows and all(r.present == "both" for r in c.rows)
    assert all(r.max_abs == 0.0 and r.sqnr == math.inf and r.cosine == pytest.approx(1.0) for r in c.rows)
    assert all(r.ratio is not None and r.ratio > 0 for r in c.rows)
    by_instruction = ins.inspector().compare(ins.inspector("run2"), by="instruction")
    kernels = [e for blk in ins.inspector().event_blocks if blk.name != "Default" for e in blk.events
               if e.name.startswith("native_call_")]
    # one row per kernel (permute_copy and addmm of a linear share a debug handle, so one row above)
    assert by_instruction.by == "instruction" and len(by_instruction.rows) == len(kernels) > len(c.rows)
    assert all(r.present == "both" and r.max_abs == 0.0 and len(r.instructions_a) == 1 for r in by_instruction.rows)


def test_without_etrecords_events_pair_by_name(builds):
    b = builds["portable"]
    plain = lambda name: Inspector(etdump_path=b.folder / f"{name}.etdp", debug_buffer_path=b.folder / f"{name}.bin")
    c = plain("run").compare(plain("run2"))
    assert c.by == "event" and c.rows and all(r.present == "both" and not r.handles for r in c.rows)
    assert all(r.max_abs == 0.0 for r in c.rows)
    # against the delegated build the backend's events have no counterpart by name
    d = builds["delegated"]
    c = plain("run").compare(Inspector(etdump_path=d.folder / "run.etdp"))
    assert c.only_in_a and c.only_in_b
    assert all("give the debug buffer" in r.numeric_note for r in c.rows if r.present == "both")


def test_outputs_dataframe_json_and_bad_arguments(builds, portable_vs_delegated):
    c = portable_vs_delegated
    df = c.to_dataframe()
    assert len(df) == len(c.rows) and {"latency_a", "latency_b", "ratio", "max_abs", "sqnr"} <= set(df.columns)
    json.dumps(c.to_dict(), allow_nan=False)  # inf SQNR becomes null
    assert len(c.top(2)) == 2 and abs(c.top(1)[0].delta) == max(abs(r.delta) for r in c.rows)
    assert "rows in both" in repr(c)
    with pytest.raises(ValueError, match="by must be one of"):
        c.inspector_a.compare(c.inspector_b, by="node")
    other = Inspector(etdump_path=builds["portable"].folder / "run.etdp", target_time_scale="us")
    with pytest.raises(ValueError, match="time units"):
        c.inspector_a.compare(other)


def _cli(*args, module: str = "etlab.cli") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True, text=True,
                          timeout=300, env=env)


@pytest.mark.slow  # over 5 s of CPU (etlab run in subprocesses): left out of make test-fast
def test_cli_table_json_csv_and_html(builds, tmp_path):
    a, b = builds["delegated"].folder, builds["planted"].folder  # folders holding one run each
    out = _cli("compare", a, b, "--top", "5", "--json", tmp_path / "c.json", "--csv", tmp_path / "c.csv",
               "--html", tmp_path / "c.html")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == f"A: {a / 'run.etdp'}" and "joined by debug_handle" in lines[2]
    assert "B/A" in out.stdout and "SQNR" in out.stdout and len([ln for ln in lines if ln.startswith("#")]) == 5
    data = json.loads((tmp_path / "c.json").read_text())
    assert data["by"] == "debug_handle" and data["summary"]["matched"] == len(data["rows"])
    assert any(r["module"] == "fc2" and r["max_abs"] for r in data["rows"])
    assert (tmp_path / "c.csv").read_text().startswith("label,key,")
    page = (tmp_path / "c.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "data-etlab-view='compare'" in page and "etlabGraphView" in page


def test_python_m_etlab_inspector_compare(builds):
    p = builds["portable"]
    out = _cli("compare", p.folder / "run.etdp", p.folder / "run2.etdp", "--top", "3", module="etlab.inspector")
    assert out.returncode == 0, out.stderr
    assert "joined by event" in out.stdout and "8 rows in both" in out.stdout


def test_cli_flags_name_each_sides_files(builds, capsys):
    from etlab.inspector._cli import compare_main

    p = builds["portable"]
    argv = [p.folder / "run.etdp", p.folder / "run2.etdp", "--etrecord-a", p.etrecord, "--etrecord-b", p.etrecord,
            "--debug-buffer-a", p.folder / "run.bin", "--debug-buffer-b", p.folder / "run2.bin", "--by", "instruction"]
    assert compare_main([str(x) for x in argv]) == 0
    out = capsys.readouterr().out
    flat = " ".join(out.split())  # the summary wraps to the terminal, where numbers of any length fall
    assert "joined by instruction" in flat and "8 outputs compared: max |B-A| 0," in flat


def test_cli_errors_are_one_line_and_exit_2(builds, tmp_path, capsys):
    from etlab.inspector._cli import compare_main

    p = builds["portable"]
    # a folder with two runs is ambiguous; a missing side, a bad file and a bad flag are one line, exit 2
    for args, msg in (((p.folder, p.folder / "run.etdp"), "holds 2 .etdp files"),
                      ((p.folder / "run.etdp", tmp_path / "none"), "B: "),
                      ((p.folder / "run.etdp", p.etrecord), "model.etrecord"),
                      ((p.folder / "run.etdp", p.folder / "run2.etdp", "--top", "-1"), "--top")):
        assert compare_main([str(x) for x in args]) == 2
        out = capsys.readouterr()
        assert out.out == "" and len(out.err.strip().splitlines()) == 1 and msg in out.err, out.err


def test_jupyter_runs_comparison_is_inspector_compare(builds):
    """The JupyterLab 'compare two runs' view draws Inspector.compare's rows (by instruction)."""
    from etlab.jupyter._runs import compare_view
    from etlab.schema import load_pte

    b = builds["portable"]
    a_ins, b_ins = (Inspector(etdump_path=b.folder / f"{n}.etdp") for n in ("run", "run2"))
    view = compare_view(a_ins, b_ins, name_a="run.etdp", name_b="run2.etdp", pte=load_pte(b.pte))
    c = a_ins.compare(b_ins, by="instruction")
    assert [(r["instruction"], r["p50_a"], r["p50_b"]) for r in view["rows"]] == \
        [(r.instructions_a[0], r.latency_a, r.latency_b) for r in c.rows]
    drawn = {n["handles"][0]: n["latency"]["p50"] for n in view["graphs"][0]["nodes"] if n["latency"]}
    assert drawn == {r.instructions_a[0]: pytest.approx(r.ratio) for r in c.rows}


def test_delegate_call_keeps_the_ops_its_backend_did_not_log(synthetic_files):
    """A delegate covering handles 10-13 whose backend logs events for 10 and 11-12 only: handle 13
    gets the call's time minus the logged events' (per run), instead of vanishing from the join."""
    from etlab.inspector import OpInfo

    info = make_program_info()
    method = info.methods["forward"]
    method.instruction_debug_handles[(0, OPS)] = (10, 11, 12, 13)
    method.ops[13] = [OpInfo(name="dnode_13", op_type="aten.relu.default")]
    ins = Inspector(etdump_path=synthetic_files[0], debug_buffer_path=synthetic_files[1], etrecord=info)
    c = ins.compare(ins)
    (rest,) = [r for r in c.rows if r.handles == (13,)]
    assert rest.events_a == ["DELEGATE_CALL (ops its backend did not log)"] and rest.ops == ["aten.relu.default"]
    block = next(b for b in ins.event_blocks if b.name == "Execute")
    call = next(e for e in block.events if e.name == "DELEGATE_CALL")
    inner = [e for e in block.events if e.is_delegated_op]
    per_run = np.asarray(call.perf_data.raw) - np.sum([e.perf_data.raw for e in inner], axis=0)
    assert len(per_run) == SYNTHETIC_RUNS and rest.latency_a == pytest.approx(float(np.median(per_run)))
    assert {r.handles for r in c.rows if r.delegated} == {(10,), (11, 12)}
    assert all(r.present == "both" and r.ratio == pytest.approx(1.0) for r in c.rows)


def test_integer_codes_are_not_compared_with_float_values():
    from etlab.inspector._compare import CompareRow, _numerics, _Unit

    def unit(value):
        return _Unit(block="Execute", order=0, name="op", label="op", instruction=0, delegate_id=None, handles=(1,),
                     op_types=[], nodes=[], module="", source="", is_delegated=False, backend=None, raw=[1.0],
                     outputs=[value], num_outputs=1)

    row = CompareRow(key="#1", block="Execute", present="both", handles=(1,), ops=[], nodes=[], module="", source="",
                     events_a=[], events_b=[], instructions_a=[], instructions_b=[], backend_a=None, backend_b=None,
                     delegated=False, latency_a=1.0, latency_b=1.0, runs_a=1, runs_b=1, delta=0.0, ratio=1.0)
    _numerics(row, [unit(torch.ones(4))], [unit(torch.ones(4, dtype=torch.int8))])
    assert row.max_abs is None and row.numeric_note == "dtypes differ (float32 vs int8)"
    _numerics(row, [unit(torch.ones(4))], [unit(torch.full((2, 2), 1.5))])  # same size, other shape: reshaped
    assert row.max_abs == 0.5 and row.relative == pytest.approx(0.5) and row.cosine == pytest.approx(1.0)


def test_handles_naming_different_ops_rejoin_by_module_and_op(synthetic_files):
    """Handles are numbered per graph: a build with other nodes (q/dq of a quantized build) reuses
    them for other ops. Such builds join by module + op instead; a quantize op joins the op before it
    (no graph recorded here: by handle order, and the row says so); the op B lacks stays listed on A's side."""
    from etlab.inspector import OpInfo

    other = make_program_info()
    other.methods["forward"].ops[2] = [OpInfo(name="q", op_type="quantized_decomposed.quantize_per_tensor.default")]
    a = Inspector(etdump_path=synthetic_files[0], etrecord=make_program_info())
    b = Inspector(etdump_path=synthetic_files[0], etrecord=other)
    c = a.compare(b)
    assert c.by == "module+op" and c.summary.mismatched == 0
    rows = {r.key: r for r in c.rows}
    fc1 = rows["layers.fc1/op0#0"]
    assert fc1.join == "module+op" and fc1.present == "both" and len(fc1.events_b) == len(fc1.events_a) + 1
    assert "attached by handle order" in fc1.join_note
    lost = rows["layers.fc1/op1#0"]
    assert lost.present == "a" and lost.join == "unmatched" and lost.latency_b is None
    assert rows["conv/convolution#1"].handles == (11, 12)  # one delegate event covering two convs: one row
    assert c.summary.joins == {"module+op": 5, "unmatched": 1} and "1 unmatched" in c.summary.text(c.unit)
    same = a.compare(a)
    assert same.by == "debug_handle" and all(r.join == "debug_handle" for r in same.rows)
    assert a.compare(a, by="module").by == "module+op"
