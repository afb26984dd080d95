"""DemoBackend: preprocess bytes run through the runtime half and match eager."""

from __future__ import annotations

import struct

import pytest
import torch

from etlab.compiler import CompileSpec, DelegationError, executorch_call_delegate, to_backend
from etlab.compiler._delegation_lowering import program_with_shared_state
from etlab.compiler.backends import DemoBackend, DemoPartitioner
from etlab.errors import FormatError
from etlab.runtime._errors import ExecutionError
from etlab.runtime.backends.demo_backend import DEMO_BACKEND

from .conftest import RecordingContext, edge_like


def _lowered_modules(ep):
    return [getattr(ep.graph_module, n.args[0].target) for n in ep.graph.nodes
            if n.op == "call_function" and n.target is executorch_call_delegate]


def _run_delegate(lowered_module, inputs, context=None):
    """Run a LoweredBackendModule's bytes through the runtime half, with eager-shaped outputs."""
    expected = lowered_module.original_module.module()(*inputs)
    outputs = [torch.full_like(t, float("nan")) for t in expected]
    handle = DEMO_BACKEND.init(memoryview(lowered_module.processed_bytes), [])
    DEMO_BACKEND.execute(handle, [*inputs, *outputs], context)
    return outputs, list(expected)


class _DelegatesOnRuntime(torch.fx.Interpreter):
    """Runs a delegated graph, executing each delegate call through the runtime half."""

    delegate_runs = 0

    def run_node(self, node):
        if node.op != "call_function" or node.target is not executorch_call_delegate:
            return super().run_node(node)
        lowered_module, *inputs = self.map_nodes_to_values(node.args, node)
        outputs = [torch.full(v.shape, float("nan")) for v in node.meta["val"]]
        handle = DEMO_BACKEND.init(memoryview(lowered_module.processed_bytes), [])
        DEMO_BACKEND.execute(handle, [*inputs, *outputs], None)
        self.delegate_runs += 1
        return tuple(outputs)


@pytest.mark.parametrize("fixture, delegates", [("mlp", 3), ("add_mul", 2)])
def test_bytes_round_trip_and_match_eager(request, fixture, delegates):
    module, inputs, _ = request.getfixturevalue(fixture)
    lowered = request.getfixturevalue(f"{fixture}_lowered")
    sig = lowered.graph_signature
    assert list(sig.user_inputs) == [spec.arg.name for spec in sig.input_specs]  # no lifted state left in the parent
    runner = _DelegatesOnRuntime(lowered.graph_module)
    got = runner.run(*inputs)
    want = module(*inputs)
    torch.testing.assert_close(got[0], want, rtol=0, atol=1e-5)
    assert runner.delegate_runs == delegates


def test_profiling_events_use_mapped_identifiers(mlp, mlp_lowered):
    _, inputs, _ = mlp
    first = _lowered_modules(mlp_lowered)[0]
    context = RecordingContext()
    outputs, _ = _run_delegate(first, inputs, context)
    ids = [event[2] for event in context.events]
    assert ids == sorted(first.debug_handle_map)  # one event per backend op, generated ids 0..n-1
    assert all(event[0] == "done" and event[3] == b"addmm" for event in context.events)
    (logged,) = context.outputs
    torch.testing.assert_close(logged[2], outputs[0])


def test_name_identifiers(add_mul):
    _, inputs, ep = add_mul
    spec = [CompileSpec("identifiers", b"names")]
    first = _lowered_modules(to_backend(ep, DemoPartitioner(spec)))[0]
    assert set(first.debug_handle_map) == {"add", "mul"}
    context = RecordingContext()
    _run_delegate(first, inputs, context)
    assert [(event[1], event[2]) for event in context.events] == [("add", -1), ("mul", -1)]
    assert [name for name, _, _ in context.outputs] == ["add", "mul"]


def test_unknown_compile_spec_is_rejected(add_mul):
    with pytest.raises(DelegationError, match="DemoBackend: unknown compile spec 'speed'"):
        to_backend(add_mul[2], DemoPartitioner([CompileSpec("speed", b"max")]))


def test_preprocess_names_unsupported_node(add_mul):
    _, _, ep = add_mul
    with pytest.raises(DelegationError, match=r"DemoBackend cannot lower node 'relu'"):
        DemoBackend.preprocess(program_with_shared_state(ep), [])


@pytest.fixture(scope="module")
def add_mul_bytes(add_mul_lowered):
    return _lowered_modules(add_mul_lowered)[0].processed_bytes


def _with_int(data: bytes, offset: int, fmt: str, value: int) -> bytes:
    patched = bytearray(data)
    struct.pack_into(fmt, patched, offset, value)
    return bytes(patched)


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (lambda b: b"XXXX" + b[4:], "magic"),
        (lambda b: _with_int(b, 4, "<H", 9), "version 9"),
        (lambda b: b[:-3], "truncated"),
        (lambda b: b[:10], "truncated"),
        (lambda b: b + b"\0", "unexpected bytes"),
        (lambda b: _with_int(b, 24 + 1, "<B", 4), "scalar type 4"),
        (lambda b: _with_int(b, 8, "<I", 1), "refer to value"),  # only one value left
        (lambda b: _with_int(b, 20, "<I", 0), "never computed"),  # no ops
    ],
)
def test_corrupted_bytes_give_a_clear_error(add_mul_bytes, corrupt, message):
    with pytest.raises(FormatError, match=f"DemoBackend: invalid processed bytes: .*{message}"):
        DEMO_BACKEND.init(memoryview(corrupt(add_mul_bytes)), [])


def test_shape_mismatch_in_bytes_is_caught(add_mul_bytes):
    # value 0 is the first input, [3, 5]; claim [3, 6] so the add no longer fits
    patched = _with_int(add_mul_bytes, 24 + 4 + 4, "<I", 6)
    with pytest.raises(FormatError, match="DemoBackend: invalid processed bytes: op 0 \\(add\\)"):
        DEMO_BACKEND.init(memoryview(patched), [])


def test_execute_checks_its_arguments(add_mul_bytes):
    handle = DEMO_BACKEND.init(memoryview(add_mul_bytes), [])
    x = torch.ones(3, 5)
    with pytest.raises(ExecutionError, match="DemoBackend: expected 2 inputs and 1 outputs"):
        DEMO_BACKEND.execute(handle, [x, x], None)
    with pytest.raises(ExecutionError, match=r"DemoBackend: input 1 has shape \[5, 3\]"):
        DEMO_BACKEND.execute(handle, [x, torch.ones(5, 3), x.clone()], None)
    with pytest.raises(ExecutionError, match="DemoBackend: output 2 must be a float32 tensor"):
        DEMO_BACKEND.execute(handle, [x, x, torch.ones(3, 5, dtype=torch.int32)], None)
    out = torch.zeros(3, 5)
    DEMO_BACKEND.execute(handle, [x, 2 * x, out], None)
    torch.testing.assert_close(out, torch.full((3, 5), 3.0))


def test_constants_are_folded_and_stored_once():
    class Linear(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 3)

        def forward(self, x):
            return self.fc(x)

    module, inputs = Linear(), (torch.randn(2, 4),)
    lowered = to_backend("DemoBackend", edge_like(module, inputs), [])
    handle = DEMO_BACKEND.init(memoryview(lowered.processed_bytes), [])
    assert [op.metadata for op in handle.ops] == [b"addmm"]  # the weight's permute happened ahead of time
    constants = [t for t in handle.slots if t is not None and t.shape in ((4, 3), (3,))]
    assert len(constants) == 2
    got = torch.empty(2, 3)
    DEMO_BACKEND.execute(handle, [*inputs, got], None)
    torch.testing.assert_close(got, module(*inputs), rtol=0, atol=1e-5)


def test_importing_runtime_backends_registers_demo_backend():
    import etlab.runtime.backends  # noqa: F401
    from etlab.runtime._registry import find_backend

    assert find_backend("DemoBackend") is DEMO_BACKEND
