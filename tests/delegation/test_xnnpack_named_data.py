"""XNNPACK constants as named data, as upstream 1.5.1 writes them (upstream's runtime side: tests/interop/
test_xnnpack_lowering.py): keyed by SHA-256, stored once per program across partitions, in the .pte or,
for weights tagged by `delegate_external_constants_pass_unlifted`, in the .ptd the tag names; etlab's
runtime reads them from either.
"""

from __future__ import annotations

import hashlib

import pytest
import torch
from torch import nn

from etlab.compiler import (
    ExecutorchBackendConfig,
    NamedDataStore,
    delegate_external_constants_pass_unlifted,
    to_edge_transform_and_lower,
)
from etlab.compiler.backends.xnnpack import XnnpackPartitioner
from etlab.facts.lowered import lowered_modules
from etlab.runtime import LoadError, Runtime
from etlab.schema import deserialize_ptd, deserialize_pte
from etlab.schema.xnnpack import deserialize_xnnpack


class Twice(nn.Module):
    """One linear applied on both sides of an op kept out of XNNPACK: two partitions, one weight; and a conv."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x, y):
        return self.fc(self.fc(x) - 1.0), self.conv(y)


def _model():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return Twice().eval(), (torch.randn(2, 16), torch.randn(1, 3, 8, 8))


def _lower(ep, **config):
    edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner(exclude_ops=["aten.sub.Tensor"])])
    return edge, edge.to_executorch(ExecutorchBackendConfig(**config))


def _run(path, inputs, data_files=()):
    return Runtime.get().load_program(path, data_files=list(data_files)).load_method("forward").execute(list(inputs))


def _check(got, model, inputs):
    with torch.no_grad():
        want = model(*inputs)
    want = [want] if isinstance(want, torch.Tensor) else list(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def _keys(module) -> list[str]:
    graph = deserialize_xnnpack(module.processed_bytes).graph
    return [c.named_key for c in graph.constant_data[1:]]


def test_weights_are_stored_once_across_partitions_in_the_pte(tmp_path):
    model, inputs = _model()
    edge, et = _lower(torch.export.export(model, inputs))
    modules = [m for _, _, m in lowered_modules(edge.exported_program().graph_module)]
    assert len(modules) == 2  # fc with conv, then fc again after the portable sub
    keys = [_keys(m) for m in modules]
    fc = hashlib.sha256(model.fc.weight.detach().contiguous().numpy().tobytes()).hexdigest()
    assert fc in keys[0] and fc in keys[1] and sorted(map(len, keys)) == [2, 4]  # one key, both partitions
    pte = deserialize_pte(et.buffer)
    named = {n.key: bytes(pte.segments[n.segment_index]) for n in pte.program.named_data}
    assert set(named) == set(keys[0]) | set(keys[1]) and len(named) == 4
    assert len({n.segment_index for n in pte.program.named_data}) == 4  # one segment per blob
    assert all(hashlib.sha256(v).hexdigest() == k for k, v in named.items())
    assert not et.data_files
    (tmp_path / "m.pte").write_bytes(et.buffer)
    _check(_run(tmp_path / "m.pte", inputs), model, inputs)


def test_tagged_weights_go_to_the_ptd_the_tag_names(tmp_path):
    model, inputs = _model()
    gm = torch.export.export(model, inputs).module()
    result = delegate_external_constants_pass_unlifted(gm, gen_tag_fn=lambda n: "fc" if "fc" in n.target else None)
    assert result.modified and result.graph_module is gm
    _, et = _lower(torch.export.export(gm, inputs))
    assert set(et.data_files) == {"fc"}
    ptd = deserialize_ptd(et.data_files["fc"])
    fc = model.fc.weight.detach().contiguous().numpy().tobytes()
    assert hashlib.sha256(fc).hexdigest() in ptd.named() and len(ptd.named()) == 2  # fc's weight and bias
    pte = deserialize_pte(et.buffer)
    assert len(pte.program.named_data) == 2  # the convolution's, untagged, stay in the .pte
    assert not set(ptd.named()) & {n.key for n in pte.program.named_data}
    paths = et.write_tensor_data_to_file(tmp_path)
    assert paths == [tmp_path / "fc.ptd"]
    (tmp_path / "m.pte").write_bytes(et.buffer)
    _check(_run(tmp_path / "m.pte", inputs, [tmp_path / "fc.ptd"]), model, inputs)
    with pytest.raises(LoadError, match="names data"):
        _run(tmp_path / "m.pte", inputs)


def test_delegate_data_and_external_constants_share_the_default_ptd(tmp_path):
    """Constants the emitter externalizes (a portable op's) and delegate weights tagged
    `_default_external_constant` land in one .ptd, as upstream merges them."""

    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)
            self.register_buffer("offset", torch.randn(8))

        def forward(self, x):
            return self.fc(x) - self.offset

    model, inputs = Mixed().eval(), (torch.randn(2, 8),)
    gm = torch.export.export(model, inputs).module()
    delegate_external_constants_pass_unlifted(gm, gen_tag_fn=lambda n: "_default_external_constant")
    _, et = _lower(torch.export.export(gm, inputs), external_constants=True)
    assert set(et.data_files) == {"_default_external_constant"}
    named = deserialize_ptd(et.data_files["_default_external_constant"]).named()
    assert "offset" in named and len(named) == 3  # the buffer by name, the linear's weight and bias by SHA-256
    assert named["offset"][0] is not None  # the emitter's tensor keeps its layout; delegate blobs have none
    (tmp_path / "m.pte").write_bytes(et.buffer)
    et.write_tensor_data_to_file(tmp_path)
    _check(_run(tmp_path / "m.pte", inputs, [tmp_path / "_default_external_constant.ptd"]), model, inputs)


def test_store_dedups_by_content_and_refuses_a_key_reused_for_other_data():
    store = NamedDataStore()
    store.add_named_data("a", b"x" * 32, 16)
    store.add_named_data("b", b"x" * 32, 64, external_tag="w")
    store.add_named_data("a", b"x" * 32)  # the same key and bytes again: nothing new
    out = store.get_named_data_store_output()
    assert len(out.buffers) == 1 and out.pte_data["a"].buffer_index == out.external_data["w"]["b"].buffer_index == 0
    with pytest.raises(ValueError, match="'a' is already stored with different data"):
        store.add_named_data("a", b"y" * 32)
    mutable = bytearray(b"x" * 31 + b"y")  # as long as "a"'s bytes, one byte apart: a buffer of its own,
    store.add_named_data("d", mutable)  # copied (a later change of the caller's buffer changes nothing)
    mutable[0:1] = b"z"
    out = store.get_named_data_store_output()
    assert len(out.buffers) == 2 and out.pte_data["d"].buffer_index == 1 and out.buffers[1] == b"x" * 31 + b"y"
    store.add_named_data("e", memoryview(b"x" * 31 + b"y"))  # equal bytes under another key: stored once
    assert len(store.get_named_data_store_output().buffers) == 2
    with pytest.raises(ValueError, match="not a file name"):
        store.add_named_data("c", b"z", external_tag="../w")
    with pytest.raises(ValueError, match="alignment"):
        store.add_named_data("c", b"z", 0)


def test_pass_refuses_a_tag_that_is_not_a_file_name():
    model, inputs = _model()
    gm = torch.export.export(model, inputs).module()
    with pytest.raises(ValueError, match=r"gen_tag_fn.*returned 'a/b'"):
        delegate_external_constants_pass_unlifted(gm, gen_tag_fn=lambda n: "a/b")
    assert not delegate_external_constants_pass_unlifted(gm).modified  # no function: nothing tagged, as upstream
