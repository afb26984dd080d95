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
