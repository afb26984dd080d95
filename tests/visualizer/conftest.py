"""A small delegated MLP, compiled, run three times with tracing and intermediates, and its Inspector."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from etlab.compiler import to_edge_transform_and_lower
from etlab.compiler.backends import DemoPartitioner
from etlab.models import make_mlp
from etlab.runtime import Runtime


@dataclass
class RunArtifacts:
    manager: object
    inputs: tuple
    pte: object
    etdump: object
    debug_buffer: object


def compile_and_run(tmp_path, make=make_mlp, runs: int = 3, partition: bool = True) -> RunArtifacts:
    model, inputs = make()
    ep = torch.export.export(model, inputs)
    edge = to_edge_transform_and_lower(ep, partitioner=[DemoPartitioner()] if partition else None,
                                       generate_etrecord=True)
    manager = edge.to_executorch()
    pte, etdp, buf = tmp_path / "model.pte", tmp_path / "run.etdp", tmp_path / "run.bin"
    manager.write_to_file(pte)
    program = Runtime.get().load_program(pte, enable_etdump=True, debug_buffer_size=1 << 20)
    method = program.load_method("forward")
    for _ in range(runs):
        method.execute(list(inputs))
    program.write_etdump_result_to_file(etdp, buf)
    return RunArtifacts(manager, inputs, pte, etdp, buf)


@pytest.fixture(scope="session")
def mlp_run(tmp_path_factory) -> RunArtifacts:
    return compile_and_run(tmp_path_factory.mktemp("mlp"))


@pytest.fixture(scope="session")
def mlp_inspector(mlp_run):
    from etlab.inspector import Inspector

    record = mlp_run.manager.get_etrecord()
    record.update_representative_inputs(list(mlp_run.inputs))
    return Inspector(etdump_path=mlp_run.etdump, debug_buffer_path=mlp_run.debug_buffer, etrecord=record)
