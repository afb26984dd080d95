"""etlab.etrecord._schema_json converts torch.export's JSON exactly as torch's own converter does
(only faster: field types resolved once per class), and names what is wrong in a bad document."""

from __future__ import annotations

import json

import pytest
import torch
from torch._export.serde import schema
from torch._export.serde import serialize as serde

from etlab.etrecord._graphs import _export_json
from etlab.etrecord._schema_json import deserialize_program, from_json
from etlab.models import make_cnn


@pytest.fixture(scope="module")
def exported():
    model, inputs = make_cnn()
    return torch.export.export(model.eval(), inputs)


def test_same_dataclasses_as_torch(exported):
    doc = _export_json(exported, "cnn")
    ours = from_json(schema.ExportedProgram, json.loads(json.dumps(doc)))
    theirs = serde._dict_to_dataclass(schema.ExportedProgram, json.loads(json.dumps(doc)))
    assert ours == theirs
    assert len(ours.graph_module.graph.nodes) == sum(n.op == "call_function" for n in exported.graph.nodes)


def test_rebuilt_program_runs_like_the_original(exported):
    doc = _export_json(exported, "cnn")
    ep = deserialize_program(doc, dict(exported.state_dict), dict(exported.constants), None)
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(ep.module()(x), exported.module()(x))


def test_bad_union_is_named():
    with pytest.raises(ValueError, match="Argument has no member 'as_nonsense'"):
        from_json(schema.Argument, {"as_nonsense": 1})
    with pytest.raises(ValueError, match="one key"):
        from_json(schema.Argument, {"as_int": 1, "as_float": 2.0})
    with pytest.raises(ValueError, match="must be an object"):
        from_json(schema.TensorMeta, [1, 2])


def _torchs_rebuild(doc, exported):
    program = serde._dict_to_dataclass(schema.ExportedProgram, json.loads(json.dumps(doc)))
    return serde.ExportedProgramDeserializer(None).deserialize(program, dict(exported.state_dict),
                                                               dict(exported.constants), None)


@pytest.mark.parametrize("dynamic", [False, True])
def test_rebuild_equals_torchs_own(exported, dynamic):
    # the fast path (tensor metadata built directly, unions without create()) gives torch's program:
    # same code, signature, ranges and, per node, a FakeTensor of the same shape, strides, dtype and device
    if dynamic:
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        batch = torch.export.Dim("batch", min=1, max=64)
        exported = torch.export.export(model, (torch.randn(3, 4),), dynamic_shapes=({0: batch},))
    doc = _export_json(exported, "m")
    ours = deserialize_program(json.loads(json.dumps(doc)), dict(exported.state_dict), dict(exported.constants), None)
    theirs = _torchs_rebuild(doc, exported)
    assert ours.graph_module.code == theirs.graph_module.code
    assert ours.graph_signature == theirs.graph_signature
    assert {str(k): str(v) for k, v in ours.range_constraints.items()} == \
        {str(k): str(v) for k, v in theirs.range_constraints.items()}
    for a, b in zip(ours.graph.nodes, theirs.graph.nodes, strict=True):
        va, vb = a.meta.get("val"), b.meta.get("val")
        assert type(va) is type(vb), a.name
        if isinstance(va, torch.Tensor):
            assert (str(va.shape), va.stride(), va.dtype, va.device, va.requires_grad) == \
                (str(vb.shape), vb.stride(), vb.dtype, vb.device, vb.requires_grad), a.name
    modes = {id(n.meta["val"].fake_mode) for n in ours.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)}
    assert len(modes) == 1  # one fake mode per program, as torch's deserializer makes
    x = torch.randn(5 if dynamic else 1, *(exported.example_inputs[0][0].shape[1:]))
    torch.testing.assert_close(ours.module()(x), theirs.module()(x))
