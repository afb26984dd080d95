"""float16 models on XNNPACK, as upstream 1.5.1's partitioner takes them: every float value of a float16
node is an fp16 XNNPACK value and its constants are stored as fp16; a float16 GELU (XNNPACK has none)
and a node mixing float32 and float16 stay out with a dtype reason. Upstream's runtime runs these
programs in tests/interop/test_xnnpack_lowering.py (half_mlp, half_cnn).
"""

from __future__ import annotations

import torch
from torch import nn

from etlab.compiler import to_edge_transform_and_lower
from etlab.compiler.backends.xnnpack import XnnpackPartitioner
from etlab.facts.lowered import DELEGATION_REFUSAL_META, lowered_modules
from etlab.models import zoo
from etlab.schema.xnnpack import XNNDatatype, deserialize_xnnpack

FP16, FP32 = XNNDatatype.xnn_datatype_fp16, XNNDatatype.xnn_datatype_fp32


def _lower(model, inputs):
    return to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=[XnnpackPartitioner()])


def _values(edge):
    for _, _, module in lowered_modules(edge.exported_program().graph_module):
        graph = deserialize_xnnpack(module.processed_bytes).graph
        store = module.named_data_store_output
        for value in graph.xvalues:
            tensor = value.xvalue_union
            entry = graph.constant_data[tensor.constant_buffer_idx] if tensor.constant_buffer_idx else None
            size = len(store.buffers[store.pte_data[entry.named_key].buffer_index]) if entry else None
            yield tensor, size


def test_a_float16_cnn_is_lowered_whole_in_fp16():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model, inputs = zoo.make_cnn()
    edge = _lower(model.half(), tuple(t.half() for t in inputs))
    graph = edge.exported_program().graph
    calls = [n for n in graph.nodes if n.op == "call_function"]
    assert not [n for n in graph.nodes if DELEGATION_REFUSAL_META in n.meta]
    assert len(lowered_modules(edge.exported_program().graph_module)) == 1 and len(calls) == 2  # delegate + getitem
    values = list(_values(edge))
    assert values and all(t.datatype == FP16 for t, _ in values)
    for tensor, size in values:  # constants hold 2 bytes per element
        if size is not None:
            assert size == 2 * int(torch.tensor(tensor.dims).prod())


def test_float16_gelu_and_mixed_float_types_stay_out_with_a_dtype_reason():
    class M(nn.Module):
        def forward(self, x, y):
            return nn.functional.gelu(x).float() + y, x * 2.0, x + y  # the last adds fp16 to fp32

    edge = _lower(M(), (torch.randn(2, 4).half(), torch.randn(2, 4)))
    refusals = {n.target.__name__: n.meta[DELEGATION_REFUSAL_META] for n in edge.exported_program().graph.nodes
                if DELEGATION_REFUSAL_META in n.meta}
    gelu = next(r for name, r in refusals.items() if "gelu" in name)
    assert gelu.category == "dtype" and "float16 GELU" in gelu.reason
    mixed = [r for r in refusals.values() if "mixes" in r.reason]
    assert len(mixed) == 1 and mixed[0].category == "dtype" and "float16/float32" in mixed[0].reason
    delegated = [t for t, _ in _values(edge)]
    assert {t.datatype for t in delegated} <= {FP16, FP32}  # x * 2 (fp16) and the fp32 add are taken, each typed
    assert any(t.datatype == FP16 for t in delegated) and any(t.datatype == FP32 for t in delegated)
