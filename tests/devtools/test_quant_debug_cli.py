"""`etlab inspect --numeric-gap`: the per-layer gap table of a quantized program's run on the command line."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("torchao")

from etlab.compiler import EtlabQuantizer, to_edge
from etlab.devtools._quant_debug import float_graph_of
from etlab.devtools._quant_debug_fix import quantize_pt2e
from etlab.inspector._cli import inspect_main
from etlab.models import make_mlp
from etlab.runtime import Runtime


@pytest.fixture(scope="module")
def quantized_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("qcli")
    model, inputs = make_mlp()
    converted = quantize_pt2e(float_graph_of(model, inputs), EtlabQuantizer(), [inputs])
    et = to_edge(torch.export.export(converted, inputs), generate_etrecord=True).to_executorch()
    record = et.get_etrecord()
    record.update_representative_inputs(list(inputs))
    record.save(out / "model.etrecord")
    program = Runtime.get().load_program(et.buffer, enable_etdump=True, debug_buffer_size=1 << 20)
    program.load_method("forward").execute(list(inputs))
    program.write_etdump_result_to_file(out / "run.etdp", out / "run.bin")
    return out


def test_numeric_gap_table(quantized_run, capsys):
    d = quantized_run
    args = [str(d / "run.etdp"), "--etrecord", str(d / "model.etrecord"), "--debug-buffer", str(d / "run.bin"),
            "--numeric-gap"]
    assert inspect_main(args) == 0
    table = capsys.readouterr().out
    assert "sqnr_db" in table and "quantize_per_tensor" in table and "addmm" in table
    assert inspect_main([*args, "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    ops = [r["aot_ops"] for r in rows]
    assert any("dequantize_per_tensor" in o for o in ops) and any("linear" in o or "addmm" in o for o in ops)
    # etlab's runtime computes the recorded quantized graph: every intermediate matches (SQNR inf -> null)
    assert all(r["max_abs"] == 0.0 or (r["sqnr_db"] is not None and r["sqnr_db"] > 30) for r in rows)
    assert all(r["cosine"] > 0.999 for r in rows)
    assert any("zoo.py" in r["source"] for r in rows)


def test_numeric_gap_needs_record_and_buffer(quantized_run, capsys):
    d = quantized_run
    assert inspect_main([str(d / "run.etdp"), "--numeric-gap"]) == 2
    assert "--etrecord" in capsys.readouterr().err
    assert inspect_main([str(d / "run.etdp"), "--etrecord", str(d / "model.etrecord"), "--numeric-gap"]) == 2
    assert "--debug-buffer" in capsys.readouterr().err
