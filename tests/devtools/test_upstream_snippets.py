"""Upstream ExecuTorch's documented devtools flows with the import root changed to `etlab`: its
names (`from executorch.devtools import Inspector, ...`, `executorch.devtools.bundled_program.*`)
and its BundledProgram walk-through, whose model writes its results with `out=`. Written here from
the documented names and call shapes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]


def test_upstream_devtools_names_import_lazily_without_torch():
    """`from etlab.devtools import Inspector` (and the ETRecord names) are the lower layers' objects;
    reading a run through them loads neither torch nor the compiler, the ETRecord names not the compiler."""
    code = ("import sys\n"
            "from etlab.devtools import Inspector, inspector\n"
            "print(sorted(m for m in ('torch', 'etlab.compiler', 'etlab.runtime') if m in sys.modules))\n"
            "from etlab.devtools import ETRecord, generate_etrecord, parse_etrecord\n"
            "import etlab.inspector, etlab.etrecord\n"
            "assert Inspector is etlab.inspector.Inspector and inspector is etlab.inspector\n"
            "assert (ETRecord, generate_etrecord, parse_etrecord) == (etlab.etrecord.ETRecord, "
            "etlab.etrecord.generate_etrecord, etlab.etrecord.parse_etrecord)\n"
            "print(sorted(m for m in ('etlab.compiler', 'etlab.runtime') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[]", "[]"]
    import etlab.devtools as devtools

    assert {"Inspector", "ETRecord", "generate_etrecord", "parse_etrecord", "BundledProgram"} <= set(dir(devtools))


def test_upstream_bundled_program_module_layout():
    from etlab.devtools import BundledProgram, MethodTestCase, MethodTestSuite
    from etlab.devtools import deserialize_from_flatbuffer_to_bundled_program as deserialize
    from etlab.devtools import serialize_from_bundled_program_to_flatbuffer as serialize
    from etlab.devtools.bundled_program import config, core
    from etlab.devtools.bundled_program import serialize as ser_module

    assert (config.MethodTestCase, config.MethodTestSuite, core.BundledProgram) == (
        MethodTestCase, MethodTestSuite, BundledProgram)
    assert ser_module.serialize_from_bundled_program_to_flatbuffer is serialize
    assert ser_module.deserialize_from_flatbuffer_to_bundled_program is deserialize
    assert {"ConfigValue", "MethodInputType", "MethodOutputType", "DataContainer"} <= set(config.__all__)


class _OutArgsModel(torch.nn.Module):
    """Upstream's bundled-program sample model: two int32 buffers, results written with out=."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("a", 3 * torch.ones(2, 2, dtype=torch.int32))
        self.register_buffer("b", 2 * torch.ones(2, 2, dtype=torch.int32))

    def forward(self, x: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        z = x.clone()
        torch.mul(self.a, x, out=z)
        y = x.clone()
        torch.add(z, self.b, out=y)
        torch.add(y, q, out=y)
        return y


def _int_inputs(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(-5, 6, (2, 2), generator=g, dtype=torch.int32) for _ in range(2)]


def test_upstream_bundled_program_sample_end_to_end(tmp_path):
    from torch.export import export

    from etlab.compiler import to_edge_transform_and_lower
    from etlab.devtools import BundledProgram, load_bundled_program, verify_bundled_program
    from etlab.devtools.bundled_program.config import MethodTestCase, MethodTestSuite
    from etlab.devtools.bundled_program.serialize import (
        deserialize_from_flatbuffer_to_bundled_program,
        serialize_from_bundled_program_to_flatbuffer,
    )

    model = _OutArgsModel()
    capture_input = tuple(_int_inputs(100))
    # upstream's page exports with export(export_for_training(model, x).module(), x); torch 2.13 has
    # no export_for_training (export gives the same training IR)
    method_graph = export(model, capture_input)
    assert any(n.target is torch.ops.aten.mul.out for n in method_graph.graph.nodes)  # what the compiler meets
    et_program = to_edge_transform_and_lower(method_graph).to_executorch()
    edge_ops = {str(n.target) for n in et_program.exported_program().graph.nodes if n.op == "call_function"}
    assert edge_ops and all(".out" in op or "::" in op or "getitem" in op for op in edge_ops), edge_ops

    inputs = [_int_inputs(i) for i in range(10)]
    method_test_suites = [MethodTestSuite(method_name="forward", test_cases=[
        MethodTestCase(inputs=case, expected_outputs=(model(*case),)) for case in inputs])]
    bundled_program = BundledProgram(et_program, method_test_suites)
    serialized = serialize_from_bundled_program_to_flatbuffer(bundled_program)
    (tmp_path / "bundled_program.bpte").write_bytes(serialized)

    back = deserialize_from_flatbuffer_to_bundled_program((tmp_path / "bundled_program.bpte").read_bytes())
    assert [len(s.test_cases) for s in back.method_test_suites] == [10]
    program = load_bundled_program(tmp_path / "bundled_program.bpte")
    reports = verify_bundled_program(program)
    assert len(reports) == 10 and all(r.ok for r in reports), "\n".join(map(str, reports))
    # and the program computes the model: 3 * x + 2 + q, exactly
    method = program.load_method("forward")
    for case in inputs[:3]:
        (got,) = method.execute(case)
        assert got.dtype == torch.int32 and torch.equal(got, 3 * case[0] + 2 + case[1])


class _TutorialNet(torch.nn.Module):
    """The shape of upstream's devtools tutorial model (LeNet-like: two convs, three linears)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 6, 5)
        self.conv2 = torch.nn.Conv2d(6, 16, 5)
        self.fc1 = torch.nn.Linear(16 * 5 * 5, 120)
        self.fc2 = torch.nn.Linear(120, 84)
        self.fc3 = torch.nn.Linear(84, 10)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv1(x)), (2, 2))
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def test_upstream_devtools_tutorial_flow(tmp_path):
    """Upstream's devtools tutorial, import root changed: export, to_edge with IR checks, a deep copy of
    the edge manager for generate_etrecord(path, edge, et_program), a bundled program, a run that
    writes an ETDump (the tutorial's C++ runner: here etlab's runtime on the .bpte), then the
    Inspector on the ETDump and the ETRecord file."""
    import copy

    from torch.export import export

    from etlab.compiler import EdgeCompileConfig, to_edge
    from etlab.devtools import BundledProgram, Inspector, generate_etrecord, load_bundled_input, load_bundled_program
    from etlab.devtools.bundled_program.config import MethodTestCase, MethodTestSuite
    from etlab.devtools.bundled_program.serialize import serialize_from_bundled_program_to_flatbuffer

    torch.manual_seed(0)
    model = _TutorialNet().eval()
    aten_model = export(model, (torch.randn(1, 1, 32, 32),), strict=True)
    edge_program_manager = to_edge(aten_model, compile_config=EdgeCompileConfig(_check_ir_validity=True))
    edge_program_manager_copy = copy.deepcopy(edge_program_manager)
    et_program_manager = edge_program_manager.to_executorch()
    etrecord_path = tmp_path / "etrecord.bin"
    generate_etrecord(etrecord_path, edge_program_manager_copy, et_program_manager)

    inputs = [[torch.randn(1, 1, 32, 32)] for _ in range(2)]
    suites = [MethodTestSuite(method_name="forward", test_cases=[
        MethodTestCase(inputs=x, expected_outputs=(model(*x),)) for x in inputs])]
    bundled = serialize_from_bundled_program_to_flatbuffer(BundledProgram(et_program_manager, suites))
    (tmp_path / "bundled_program.bpte").write_bytes(bundled)

    program = load_bundled_program(tmp_path / "bundled_program.bpte", enable_etdump=True)
    method = program.load_method("forward")
    for i in range(len(inputs)):
        method.execute(load_bundled_input(method, i), bundled_input_index=i)
    program.write_etdump_result_to_file(tmp_path / "etdump.etdp")

    inspector = Inspector(etdump_path=tmp_path / "etdump.etdp", etrecord=etrecord_path)
    inspector.print_data_tabular(file=open(tmp_path / "table.txt", "w"))
    assert "native_call_convolution.out" in (tmp_path / "table.txt").read_text()
    execute = [b for b in inspector.event_blocks if b.name == "Execute"]
    assert execute and sum(b.num_runs for b in execute) == 2
    slowest = max((e for b in execute for e in b.events if e.perf_data is not None and e.op_types),
                  key=lambda e: e.perf_data.avg)
    assert slowest.op_types and slowest.stack_traces
    df = inspector.to_dataframe()
    assert {"event_name", "p50 (ms)", "op_types", "stack_traces", "module_hierarchy"} <= set(df.columns)
    assert inspector.find_total_for_module("conv2") > 0  # by module path (upstream's page: by nn_module_stack key)
    assert inspector.get_exported_program() is not None
    assert [b.bundled_input_index for b in execute] == [0, 1] or len(execute) == 1
