"""The ETRecord records lowered modules' named data (XNNPACK's weights live there, keyed by SHA-256, not
in the payload): a program re-emitted from the record alone runs like eager, in etlab's layout and in
upstream's (`save(format="upstream")`, the lowered module's `named_data_store` field as upstream's
serializer writes it; upstream's reader side: tests/interop/test_xnnpack_etrecord.py). A malformed entry
is a FormatError naming it."""

from __future__ import annotations

import json
import zipfile

import pytest
import torch
from torch import nn

from etlab.compiler import EdgeProgramManager, to_edge_transform_and_lower
from etlab.compiler.backends.xnnpack import XnnpackPartitioner
from etlab.errors import FormatError
from etlab.etrecord import parse_etrecord
from etlab.facts.lowered import lowered_modules
from etlab.runtime import Runtime


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.norm, self.fc2 = nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(self.norm(torch.relu(self.fc1(x))))  # layer norm stays portable: two partitions


def _compiled(tmp_path):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model, inputs = Net().eval(), (torch.randn(3, 8),)
    edge = to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=[XnnpackPartitioner()],
                                       generate_etrecord=True)
    et = edge.to_executorch()
    with torch.no_grad():
        want = model(*inputs)
    return edge, et, inputs, want


def _named(ep) -> dict[str, bytes]:
    out = {}
    for _, _, mod in lowered_modules(ep.graph_module):
        store = mod.named_data_store_output
        for key, entry in store.pte_data.items():
            out[key] = bytes(store.buffers[entry.buffer_index])
    return out


@pytest.mark.parametrize("layout", ["etlab", "upstream"])
def test_a_program_re_emitted_from_the_record_alone_runs_like_eager(tmp_path, layout):
    edge, et, inputs, want = _compiled(tmp_path)
    path = tmp_path / "model.etrecord"
    et.get_etrecord().save(path, format=layout)
    recorded = parse_etrecord(path).edge_dialect_program
    assert len(lowered_modules(recorded.graph_module)) == 2
    assert _named(recorded) == _named(edge.exported_program()) and len(_named(recorded)) == 4
    again = EdgeProgramManager({"forward": recorded}).to_executorch()
    assert again.buffer == et.buffer  # the same .pte, weights included
    got = Runtime.get().load_program(again.buffer).load_method("forward").execute(list(inputs))
    torch.testing.assert_close(got[0], want, rtol=1e-5, atol=1e-5)


def _rewrite_delegate(path, out, change) -> None:
    """Copies an etlab-layout record, applying `change` to the first delegate entry that has named data."""
    with zipfile.ZipFile(path) as z:
        entries = {name: z.read(name) for name in z.namelist()}
    name = next(n for n, data in entries.items() if b'"named_data"' in data)
    doc = json.loads(entries[name])
    programs = doc["programs"] if isinstance(doc, dict) and "programs" in doc else doc
    delegate = next(d for p in programs if isinstance(p, dict) for d in p.get("delegates", []) if "named_data" in d)
    change(delegate["named_data"])
    entries[name] = json.dumps(doc).encode()
    with zipfile.ZipFile(out, "w") as z:
        for n, data in entries.items():
            z.writestr(n, data)


@pytest.mark.parametrize(("change", "message"), [
    (lambda nd: nd["pte_data"][0].__setitem__(1, 99), "buffer index 99"),
    (lambda nd: nd["pte_data"][0].__setitem__(2, 3), "alignment 3"),
    (lambda nd: nd["pte_data"].append(list(nd["pte_data"][0])), "listed twice"),
    (lambda nd: nd["external_data"].append(["../evil", []]), "not a plain file name"),
])
def test_malformed_named_data_is_a_format_error(tmp_path, change, message):
    _, et, _, _ = _compiled(tmp_path)
    et.get_etrecord().save(tmp_path / "good.etrecord")
    _rewrite_delegate(tmp_path / "good.etrecord", tmp_path / "bad.etrecord", change)
    with pytest.raises(FormatError, match=message):
        _ = parse_etrecord(tmp_path / "bad.etrecord").edge_dialect_program
