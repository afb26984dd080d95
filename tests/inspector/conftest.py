"""Synthetic ETDumps (with delegate, debug and allocation events), a hand-built ProgramInfo, and
real runs with delegate calls (`delegate_runs`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from etlab.etdump._synthetic import synthetic_debug_buffer, synthetic_etdump
from etlab.inspector import DelegateInfo, MethodInfo, OpInfo, ProgramInfo
from etlab.schema import serialize_etdump

RUNS, OPS, NUMEL = 3, 4, 16


@pytest.fixture(scope="session")
def synthetic_model():
    return synthetic_etdump(RUNS, OPS, debug_tensors=True, delegate=True, allocations=True, tensor_numel=NUMEL)


@pytest.fixture(scope="session")
def synthetic_files(synthetic_model, tmp_path_factory):
    """(etdp path, debug buffer path) of the synthetic run."""
    d = tmp_path_factory.mktemp("synthetic")
    etdp, buf = d / "run.etdp", d / "run.bin"
    etdp.write_bytes(serialize_etdump(synthetic_model))
    buf.write_bytes(synthetic_debug_buffer(RUNS, OPS, NUMEL))
    return etdp, buf


def make_program_info(aot_outputs=None) -> ProgramInfo:
    """Instruction i of chain 0 runs graph node with handle i + 1; instruction OPS calls a
    delegate covering handles 10 (id 0) and 11, 12 (id "conv_0"). Ops 0, 1 sit in module fc1,
    ops 2, 3 in module fc2 (inside "layers")."""
    ops = {}
    for i in range(OPS):
        mod = "fc1" if i < 2 else "fc2"
        hier = {"L__self___layers": ("layers", "torch.nn.Sequential"),
                f"L__self___layers_{mod}": (f"layers.{mod}", "torch.nn.Linear")}
        ops[i + 1] = [OpInfo(name=f"node_{i}", op_type=f"aten.op{i}.default", stack_trace=f"model.py:{10 + i}",
                             module_hierarchy=hier)]
    for h in (10, 11, 12):
        ops[h] = [OpInfo(name=f"dnode_{h}", op_type="aten.convolution.default", stack_trace=f"model.py:{h * 10}",
                         module_hierarchy={"L__self___conv": ("conv", "torch.nn.Conv2d")})]
    handles = {(0, i): (i + 1,) for i in range(OPS)}
    handles[(0, OPS)] = (10, 11, 12)
    method = MethodInfo(
        instruction_debug_handles=handles,
        delegates={(0, OPS): DelegateInfo("XnnpackBackend", {0: (10,), "conv_0": (11, 12)})},
        ops=ops, aot_intermediate_outputs=aot_outputs,
    )
    return ProgramInfo(methods={"forward": method})


def _build_delegated(model_and_inputs, folder: Path) -> Path:
    """Compile with the demo backend (delegate calls), run once with intermediates: model.pte,
    model.etrecord, run.etdp, run.bin in `folder`."""
    import torch

    from etlab.compiler import to_edge_transform_and_lower
    from etlab.compiler.backends import DemoPartitioner
    from etlab.runtime import DebugLevel, Runtime

    model, inputs = model_and_inputs
    et = to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=[DemoPartitioner()],
                                     generate_etrecord=True).to_executorch()
    et.write_to_file(folder / "model.pte")
    record = et.get_etrecord()
    record.update_representative_inputs(list(inputs))
    record.save(folder / "model.etrecord")
    program = Runtime.get().load_program(folder / "model.pte", enable_etdump=True,
                                         etdump_debug_level=DebugLevel.INTERMEDIATE_OUTPUTS)
    program.load_method("forward").execute(list(inputs))
    program.write_etdump_result_to_file(folder / "run.etdp", folder / "run.bin")
    return folder


@pytest.fixture(scope="session")
def delegate_runs(tmp_path_factory) -> dict[str, Path]:
    """An MLP (its linears delegated to the demo backend) and a CNN, each compiled, run once and
    recorded in its own folder (model.pte, model.etrecord, run.etdp, run.bin)."""
    from etlab.models import make_cnn, make_mlp

    return {name: _build_delegated(make(), tmp_path_factory.mktemp(name))
            for name, make in (("mlp", make_mlp), ("cnn", make_cnn))}
