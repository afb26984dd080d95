"""to_backend: partitions become executorch_call_delegate calls on LoweredBackendModules."""

from __future__ import annotations

import operator
from typing import ClassVar

import pytest
import torch
from torch.export.graph_signature import InputKind

from etlab.compiler import (
    BackendDetails,
    DelegationError,
    DelegationSpec,
    LoweredBackendModule,
    Partitioner,
    PartitionResult,
    PreprocessResult,
    executorch_call_delegate,
    to_backend,
)
from etlab.compiler.backends import DemoPartitioner

from .conftest import edge_like

aten = torch.ops.aten


class RecordingBackend(BackendDetails):
    """Keeps the programs it is given; its bytes are the partition's node names."""

    seen: ClassVar[list] = []

    @staticmethod
    def preprocess(edge_program, compile_specs):
        RecordingBackend.seen.append(edge_program)
        names = [n.name for n in edge_program.graph.nodes if n.op == "call_function"]
        return PreprocessResult(",".join(names).encode(), {i: (i,) for i in range(len(names))})


class TagByName(Partitioner):
    """Tags the nodes named in `groups` (tag -> node names) for `backend_id`."""

    def __init__(self, groups: dict[str, list[str]], backend_id: str = "RecordingBackend"):
        self.groups = groups
        self.backend_id = backend_id

    def partition(self, exported_program):
        for node in exported_program.graph.nodes:
            for tag, names in self.groups.items():
                if node.name in names:
                    node.meta["delegation_tag"] = tag
        return PartitionResult(exported_program, {tag: DelegationSpec(self.backend_id, []) for tag in self.groups})


def _delegate_calls(ep):
    return [n for n in ep.graph.nodes if n.op == "call_function" and n.target is executorch_call_delegate]


def test_mlp_lowers_each_linear_and_runs_like_eager(mlp, mlp_lowered):
    module, inputs, ep = mlp
    lowered = mlp_lowered

    calls = _delegate_calls(lowered)
    assert len(calls) == 3
    assert [n.target for n in lowered.graph.nodes if n.op == "call_function" and n.target not in
            (executorch_call_delegate, operator.getitem)] == [aten.relu.default] * 2
    # every weight and bias was used only by its linear, so all of them moved into the partitions
    assert lowered.state_dict == {}
    assert [spec.kind for spec in lowered.graph_signature.input_specs] == [InputKind.USER_INPUT]
    for call in calls:
        sub = call.args[0]
        assert sub.op == "get_attr"
        module_ = getattr(lowered.graph_module, sub.target)
        assert isinstance(module_, LoweredBackendModule) and module_.backend_id == "DemoBackend"
        assert len(module_.original_module.state_dict) == 2
    torch.testing.assert_close(lowered.module()(*inputs), module(*inputs), rtol=0, atol=1e-6)
    # the input program is untouched
    assert sum(n.target == aten.addmm.default for n in ep.graph.nodes) == 3
    assert not any("delegation_tag" in n.meta for n in lowered.graph.nodes)


def test_debug_handles_stay_unique_and_map_back(mlp, mlp_lowered):
    _, _, ep = mlp
    lowered = mlp_lowered
    original = {n.name: n.meta["debug_handle"] for n in ep.graph.nodes if "debug_handle" in n.meta}
    handles = [n.meta["debug_handle"] for n in lowered.graph.nodes if n.op not in ("placeholder", "output")]
    assert len(handles) == len(set(handles))
    delegated_handles = set()
    for call in _delegate_calls(lowered):
        module_ = getattr(lowered.graph_module, call.args[0].target)
        inner_nodes = module_.original_module.graph.nodes
        inner = {n.name: n.meta["debug_handle"] for n in inner_nodes if "debug_handle" in n.meta}
        assert all(original[name] == handle for name, handle in inner.items())
        mapped = {h for hs in module_.debug_handle_map.values() for h in hs}
        assert mapped == set(inner.values())  # the folded permute maps through its addmm
        delegated_handles |= mapped
    assert not delegated_handles & set(handles)


def test_meta_val_of_delegate_outputs(add_mul_lowered):
    lowered = add_mul_lowered
    for call in _delegate_calls(lowered):
        items = sorted(call.users, key=lambda n: n.args[1])
        assert [i.target for i in items] == [operator.getitem] * len(items)
        assert len(call.meta["val"]) == len(items)
        for item in items:
            assert item.meta["val"].shape == call.meta["val"][item.args[1]].shape


def test_shared_weight_stays_in_parent_and_is_passed_in():
    class Shared(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.linspace(-1, 1, 12).reshape(3, 4))
            self.bias = torch.nn.Parameter(torch.linspace(0, 1, 3))

        def forward(self, x):
            return torch.nn.functional.linear(x, self.weight, self.bias), torch.relu(self.weight)

    module, inputs = Shared(), (torch.linspace(-2, 2, 8).reshape(2, 4),)
    lowered = to_backend(edge_like(module, inputs), DemoPartitioner())
    assert set(lowered.state_dict) == {"weight"}
    (call,) = _delegate_calls(lowered)
    assert [a.name for a in call.args[1:]] == ["p_weight", "x"]
    sub = getattr(lowered.graph_module, call.args[0].target).original_module
    assert set(sub.state_dict) == {"bias"}
    for got, want in zip(lowered.module()(*inputs), module(*inputs)):
        torch.testing.assert_close(got, want)


def test_outputs_used_between_partition_nodes_keep_graph_order():
    class Interleaved(torch.nn.Module):
        def forward(self, x, y):
            s = x + y
            r = torch.relu(s)  # sits between two partition nodes but only reads the partition
            p = s * y
            return r, p

    module, inputs = Interleaved(), (torch.randn(2, 3), torch.randn(2, 3))
    ep = edge_like(module, inputs)
    lowered = to_backend(ep, TagByName({"t": ["add", "mul"]}))
    (call,) = _delegate_calls(lowered)
    assert len(call.users) == 2
    lowered.graph.lint()
    for got, want in zip(lowered.module()(*inputs), module(*inputs)):
        torch.testing.assert_close(got, want)
    (program,) = RecordingBackend.seen[-1:]
    assert [spec.arg.name for spec in program.graph_signature.output_specs] == ["add", "mul"]


def test_whole_program_overload_returns_lowered_module(add_mul):
    _, inputs, _ = add_mul

    class OnlyAddMul(torch.nn.Module):
        def forward(self, x, y):
            return (x + y) * x

    ep = edge_like(OnlyAddMul(), inputs)
    lowered = to_backend("DemoBackend", ep, [])
    assert isinstance(lowered, LoweredBackendModule)
    assert lowered.backend_id == "DemoBackend" and lowered.processed_bytes[:4] == b"ETDB"
    (out,) = lowered(*inputs)
    torch.testing.assert_close(out, OnlyAddMul()(*inputs))


def test_unknown_backend_id(add_mul):
    _, _, ep = add_mul
    with pytest.raises(DelegationError, match=r"unknown backend id 'NoSuchBackend'.*DemoBackend"):
        to_backend("NoSuchBackend", ep, [])
    with pytest.raises(DelegationError, match="unknown backend id 'NoSuchBackend'"):
        to_backend(ep, TagByName({"t": ["add"]}, backend_id="NoSuchBackend"))


def test_non_convex_partition_is_rejected(add_mul):
    _, _, ep = add_mul  # mul -> relu -> (mul_1, add_1): tagging mul with add_1 leaves relu and mul_1 in between
    with pytest.raises(DelegationError, match=r"not convex.*'add_1' depends on 'mul_1'"):
        to_backend(ep, TagByName({"t": ["mul", "add_1"]}))


@pytest.mark.parametrize(
    "partitioner, message",
    [
        (TagByName({"t": ["x", "add"]}), "placeholder 'x'"),
        (TagByName({"t": []}), None),
    ],
)
def test_tagging_rules(add_mul, partitioner, message):
    _, _, ep = add_mul
    if message is None:  # a tag with no nodes is simply skipped
        assert not _delegate_calls(to_backend(ep, partitioner))
        return
    with pytest.raises(DelegationError, match=message):
        to_backend(ep, partitioner)


def test_tag_missing_from_partition_tags(add_mul):
    class Sloppy(Partitioner):
        def partition(self, exported_program):
            next(n for n in exported_program.graph.nodes if n.op == "call_function").meta["delegation_tag"] = "x"
            return PartitionResult(exported_program, {})

    with pytest.raises(DelegationError, match="not a key of partition_tags"):
        to_backend(add_mul[2], Sloppy())


def test_partitioner_must_not_change_the_graph(add_mul):
    class Meddler(Partitioner):
        def partition(self, exported_program):
            graph = exported_program.graph
            relu = next(n for n in graph.nodes if n.target == aten.relu.default)
            with graph.inserting_after(relu):
                graph.call_function(aten.relu.default, (relu,))
            return PartitionResult(exported_program, {})

    with pytest.raises(DelegationError, match="changed the graph"):
        to_backend(add_mul[2], Meddler())


def test_backend_must_define_preprocess():
    with pytest.raises(TypeError, match="must define"):
        type("Incomplete", (BackendDetails,), {})


def test_argument_errors(add_mul):
    _, _, ep = add_mul
    with pytest.raises(TypeError, match="partitioner must be an etlab Partitioner"):
        to_backend(ep, object())
    with pytest.raises(TypeError, match="edge_program must be an ExportedProgram"):
        to_backend("DemoBackend", "not a program", [])


def test_mutated_buffer_stays_in_parent_and_constants_move():
    class Accumulate(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("total", torch.zeros(2, 3))
            self.register_buffer("scale", torch.full((2, 3), 2.0), persistent=False)

        def forward(self, x):
            new = self.total + x
            self.total.copy_(new)
            return new * self.scale

    module, inputs = Accumulate(), (torch.ones(2, 3),)
    lowered = to_backend(edge_like(module, inputs), DemoPartitioner())
    sig = lowered.graph_signature
    assert list(sig.buffers_to_mutate.values()) == ["total"]
    assert set(lowered.state_dict) == {"total"} and lowered.constants == {}
    (call,) = _delegate_calls(lowered)
    sub = getattr(lowered.graph_module, call.args[0].target).original_module
    assert set(sub.constants) == {"scale"}
    runnable = lowered.module()
    runnable(*inputs)
    torch.testing.assert_close(runnable(*inputs), torch.full((2, 3), 4.0))
    torch.testing.assert_close(runnable.total, torch.full((2, 3), 2.0))


def test_symbolic_shapes_cross_the_partition_boundary():
    class Dynamic(torch.nn.Module):
        def forward(self, x, y):
            return torch.relu(torch.relu(x) * y + y)

    inputs = (torch.randn(3, 4), torch.randn(3, 4))
    batch = torch.export.Dim("batch", max=16)
    ep = torch.export.export(Dynamic(), inputs, dynamic_shapes=({0: batch}, {0: batch})).run_decompositions()
    add_mul = [n.name for n in ep.graph.nodes if n.target in (aten.mul.Tensor, aten.add.Tensor)]
    lowered = to_backend(ep, TagByName({"t": add_mul}))
    assert len(_delegate_calls(lowered)) == 1
    (program,) = RecordingBackend.seen[-1:]
    assert list(program.graph_signature.user_inputs) == ["y", "relu"]  # graph order
    assert len(program.range_constraints) == 1
    bigger = (torch.randn(9, 4), torch.randn(9, 4))
    torch.testing.assert_close(lowered.module()(*bigger), Dynamic()(*bigger))
