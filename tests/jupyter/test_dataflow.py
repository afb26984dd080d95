"""The `.pte` viewer's instruction graph follows the values, from the file alone: every zoo model (plain
and DemoBackend-delegated) is one connected piece per method, its edges are exactly the data flow of the
planned graph the file was emitted from (out variants, multi-output results, tensor lists, delegate calls
with view inputs, views without an instruction, state buffers), and each node shows the planned shapes of
what it writes (batch norm's output, not its empty saved statistics)."""

from __future__ import annotations

import pytest
import torch
from torch.fx import GraphModule, Node

from etlab.compiler import to_edge_transform_and_lower
from etlab.compiler.backends import DemoPartitioner
from etlab.jupyter._dataflow import instruction_flow
from etlab.jupyter._program import instruction_graph
from etlab.models import ZOO, export_zoo
from etlab.schema import load_file


def components(model) -> int:
    """Connected pieces of a GraphModel (edges taken both ways)."""
    parent = {n.id: n.id for n in model.nodes}

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in model.edges:
        parent[find(a)] = find(b)
    return len({find(n.id) for n in model.nodes})


def planned_flow(gm: GraphModule) -> tuple[set[tuple[int, int]], dict[int, list[list[int]]]]:
    """From the planned graph the emitter wrote: (producer instruction, reader instruction) pairs, through
    nodes that are no instruction (getitem, elided views), and each instruction's planned output shapes."""
    def instruction(n: Node) -> int | None:
        i = n.meta.get("instruction")
        return i if n.op == "call_function" and isinstance(i, int) else None

    def producers(n: Node) -> set[int]:
        if n.op == "placeholder":
            return set()
        if instruction(n) is not None:
            return {instruction(n)}
        return set().union(*(producers(a) for a in n.all_input_nodes)) if n.all_input_nodes else set()

    edges, shapes = set(), {}
    for n in gm.graph.nodes:
        i = instruction(n)
        if i is None:
            continue
        edges |= {(p, i) for a in n.all_input_nodes for p in producers(a) if p != i}
        spec = n.meta.get("spec")
        specs = spec if isinstance(spec, (list, tuple)) else [spec]
        shapes[i] = [list(s.shape) for s in specs if hasattr(s, "shape")]
    return edges, shapes


@pytest.fixture(scope="module", params=[(name, part) for name in ZOO for part in (False, True)],
                ids=lambda p: f"{p[0]}{'-demo' if p[1] else ''}")
def zoo_pte(request, tmp_path_factory):
    name, partition = request.param
    et = to_edge_transform_and_lower(export_zoo(name), partitioner=[DemoPartitioner()] if partition else None
                                     ).to_executorch()
    path = tmp_path_factory.mktemp("dataflow") / f"{name}.pte"
    et.write_to_file(path)
    return name, et, load_file(path, what=path.name)


def test_each_method_is_one_piece_with_the_planned_data_flow(zoo_pte):
    name, et, pte = zoo_pte
    for plan in pte.program.execution_plan:
        model = instruction_graph(plan)
        assert components(model) == 1, f"{name}/{plan.name}: {components(model)} pieces"
        step = {n.id: n.handles[0] for n in model.nodes if n.handles}
        got = {(step[a], step[b]) for a, b in model.edges if a in step and b in step}
        edges, shapes = planned_flow(et.exported_program(str(plan.name)).graph_module)
        if name != "cond":  # the branches' instructions live in submodules of the planned graph
            assert got == edges, f"{name}/{plan.name}: missing {sorted(edges - got)}, extra {sorted(got - edges)}"
        for node in model.nodes:
            if node.handles and node.handles[0] in shapes:
                assert node.shapes == shapes[node.handles[0]], (name, node.name)
        # every method input feeds something, every output is fed
        for n in model.nodes:
            if n.kind == "input":
                assert any(a == n.id for a, _ in model.edges), (name, n.name)
            if n.kind == "output":
                assert any(b == n.id for _, b in model.edges), (name, n.name)


def test_batch_norm_writes_its_output_and_feeds_the_next_op():
    """native_batch_norm.out's result is a list (out, save_mean, save_invstd); the next op reads `out`."""
    from etlab.models import make_cnn

    model, inputs = make_cnn()
    et = to_edge_transform_and_lower(torch.export.export(model, inputs)).to_executorch()
    pte = _pte(et)
    graph = instruction_graph(pte.program.execution_plan[0])
    bns = [n for n in graph.nodes if "batch_norm" in n.op]
    assert bns
    for bn in bns:
        out_shape = bn.shapes[0]
        assert len(out_shape) == 4 and all(d > 0 for d in out_shape), bn.shapes  # not the empty [0] statistics
        nxt = [graph.nodes[b] for a, b in graph.edges if a == bn.id]
        assert nxt and all(n.kind in ("op", "output") for n in nxt), bn.name


def test_cond_branches_both_feed_the_output():
    et = to_edge_transform_and_lower(export_zoo("cond")).to_executorch()
    plan = _pte(et).program.execution_plan[0]
    graph = instruction_graph(plan)
    out = next(n for n in graph.nodes if n.kind == "output")
    fed_by = {graph.nodes[a].op for a, b in graph.edges if b == out.id}
    assert fed_by == {"aten::add.out", "aten::mul.out"}  # the true branch ends in add, the false in mul
    jump = next(n for n in graph.nodes if n.kind == "control_flow")
    assert any(b == jump.id and graph.nodes[a].op == "aten::gt.Scalar_out" for a, b in graph.edges)


def test_hostile_indices_do_not_raise():
    """Out-of-range value indices in a crafted plan are skipped, not followed."""
    from etlab.schema import program as P

    plan = P.ExecutionPlan(name="forward", values=[P.EValue(P.Tensor(sizes=[2]))], inputs=[0, 7], outputs=[9],
                           chains=[P.Chain(instructions=[
                               P.Instruction(P.KernelCall(op_index=3, args=[0, 42, -1])),
                               P.Instruction(P.DelegateCall(delegate_index=5, args=[99, 0])),
                               P.Instruction(P.MoveCall(move_from=50, move_to=-3)),
                               P.Instruction(P.JumpFalseCall(cond_value_index=77, destination_instruction=0))])],
                           operators=[], delegates=[])
    flow = instruction_flow(plan)
    assert len(flow.steps) == 4
    graph = instruction_graph(plan)
    assert [n.kind for n in graph.nodes][:1] == ["input"]


def _pte(et):
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "m.pte"
        et.write_to_file(path)
        return load_file(path, what=path.name)
