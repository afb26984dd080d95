"""The upstream-shaped API: generate_etrecord, the add_/update_ methods, multi-method records."""

from __future__ import annotations

import io

import pytest
import torch

from etlab.compiler import to_edge
from etlab.etrecord import ETRecord, ProgramInfo, generate_etrecord, parse_etrecord

from .conftest import compiled, read_entries

pytestmark = pytest.mark.xdist_group("etrecord")  # one worker: the compiled models are cached per process


def test_generate_etrecord_with_all_stages(tmp_path):
    c = compiled("mlp")
    path = tmp_path / "model.etrecord"
    generate_etrecord(path, c.edge, c.executorch, exported_program=c.exported,
                      extra_recorded_export_modules={"aten_copy": c.exported, "edge_copy": c.edge})
    record = parse_etrecord(path)
    assert sorted(record.graph_map) == ["aten_copy/forward", "edge_copy/forward"]
    assert record._debug_handle_map == c.executorch.debug_handle_map
    assert isinstance(record.export_graph_id, int)
    info = record.program_info()
    assert isinstance(info, ProgramInfo)
    assert info.graphs["edge_dialect_exported_program"] is record.edge_dialect_program
    assert info.graphs["exported_program"] is record.exported_program
    assert info.graphs["aten_copy/forward"] is record.graph_map["aten_copy/forward"]
    assert info.graphs.get("nothing") is None
    with torch.no_grad():
        torch.testing.assert_close(record.graph_map["edge_copy/forward"].module()(*c.inputs), c.model(*c.inputs),
                                   rtol=1e-5, atol=1e-5)
    # the programs recorded twice are written once
    assert len(read_entries(path.read_bytes())[0]["programs"]) == 2


def test_generate_etrecord_from_an_exported_program_alone(tmp_path):
    c = compiled("mlp")
    buf = io.BytesIO()
    generate_etrecord(buf, c.edge.exported_program(), c.executorch)
    record = parse_etrecord(buf.getvalue())
    assert record.exported_program is None and record.edge_dialect_program is not None
    # without representative inputs the edge program's example inputs are used
    aot = record.program_info().methods["forward"].aot_intermediate_outputs()
    assert aot


def test_reserved_names_and_missing_parts_are_refused():
    c = compiled("mlp")
    with pytest.raises(RuntimeError, match="reserved"):
        generate_etrecord(io.BytesIO(), c.edge, c.executorch,
                          extra_recorded_export_modules={"debug_handle_map": c.exported})
    with pytest.raises(RuntimeError, match="must contain"):
        ETRecord(edge_dialect_program=c.edge.exported_program()).save(io.BytesIO())
    record = ETRecord()
    record.add_edge_dialect_program(c.edge)
    with pytest.raises(RuntimeError, match="already exists"):
        record.add_edge_dialect_program(c.edge)
    with pytest.raises(TypeError, match="ExecutorchProgramManager"):
        record.add_executorch_program(object())


def test_representative_inputs_and_reference_outputs(tmp_path):
    c = compiled("cnn")
    record = ETRecord.from_sources(c.executorch.get_etrecord())
    other = torch.randn_like(c.inputs[0])
    with torch.no_grad():
        expected = c.model(other)
    record.update_representative_inputs([other])
    record.update_reference_outputs([[expected], [expected * 2]])
    path = tmp_path / "cnn.etrecord"
    record.save(path)
    parsed = parse_etrecord(path)
    torch.testing.assert_close(parsed._representative_inputs[0], other, rtol=0, atol=0)
    assert list(parsed._reference_outputs) == ["forward"]
    method = parsed.program_info().methods["forward"]
    assert len(method.reference_outputs) == 2
    torch.testing.assert_close(method.reference_outputs[1][0], expected * 2, rtol=0, atol=0)
    aot = method.aot_intermediate_outputs()  # runs on the representative inputs, not the example ones
    torch.testing.assert_close(aot[max(aot, key=max)], expected, rtol=1e-5, atol=1e-5)


def test_bundled_program_gives_inputs_and_expected_outputs():
    c = compiled("mlp")

    class Case:  # duck-typed like upstream's MethodTestCase / MethodTestSuite / BundledProgram
        def __init__(self, inputs, expected_outputs):
            self.inputs, self.expected_outputs = inputs, expected_outputs

    class Suite:
        method_name = "forward"

        def __init__(self, test_cases):
            self.test_cases = test_cases

    class Bundled:
        executorch_program = c.executorch

        def __init__(self, suites):
            self.method_test_suites = suites

    record = ETRecord()
    record.add_edge_dialect_program(c.edge)
    record.add_executorch_program(Bundled([Suite([Case([c.inputs[0] * 2], [torch.ones(1)]),
                                                  Case([c.inputs[0]], [torch.zeros(1)])])]))
    parsed = parse_etrecord(_saved(record))
    torch.testing.assert_close(parsed._representative_inputs[0], c.inputs[0] * 2)
    assert [o[0].item() for o in parsed._reference_outputs["forward"]] == [1.0, 0.0]


def _saved(record: ETRecord) -> bytes:
    buf = io.BytesIO()
    record.save(buf)
    return buf.getvalue()


def test_two_methods():
    from etlab.models import METHOD_INPUTS, ZOO

    module, _ = ZOO["two_methods"]()

    class Method(torch.nn.Module):
        def __init__(self, name):
            super().__init__()
            self.module, self.name = module, name

        def forward(self, *args):
            return getattr(self.module, self.name)(*args)

    inputs = METHOD_INPUTS["make_two_methods"]
    programs = {m: torch.export.export(Method(m), ins) for m, ins in inputs.items()}
    et = to_edge(programs, generate_etrecord=True).to_executorch()
    parsed = parse_etrecord(_saved(ETRecord.from_sources(et.get_etrecord())))
    assert sorted(parsed.methods) == ["encode", "forward"]
    assert sorted(parsed.edge_dialect_program) == ["encode", "forward"]
    assert sorted(parsed.exported_programs) == ["encode", "forward"]
    info = parsed.program_info()
    assert info.method_for_block("encode") is info.methods["encode"]
    for m, ins in inputs.items():
        assert info.methods[m].instruction_debug_handles == {
            (0, i): tuple(dict.fromkeys(h)) for i, h in et.debug_handle_map[m].items()}
        aot = info.methods[m].aot_intermediate_outputs()
        with torch.no_grad():
            torch.testing.assert_close(aot[max(aot, key=max)], getattr(module, m)(*ins), rtol=1e-5, atol=1e-5)
