"""ETRecord.save's faster torch.export serialization (issue 28: Swin-T's save took 10x upstream's) writes
exactly what torch's own serializer writes, and leaves torch's functions as they were."""

from __future__ import annotations

import gc
import io
import zipfile

import torch
from torch import nn
from torch._export.serde import serialize as serde

from etlab.compiler import to_edge
from etlab.etrecord import parse_etrecord
from etlab.etrecord._serde_speed import fast_serialization


class _Repeated(nn.Module):
    """Repeated blocks (shared shapes: the memo's hits), a dynamic batch (symbolic sizes: torch's path)."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.GELU()) for _ in range(4)])

    def forward(self, x):
        return self.blocks(x).softmax(-1)


def _manifest(record, fast: bool) -> bytes:
    buf = io.BytesIO()
    if fast:
        record.save(buf)
    else:
        record._save(buf, "etlab")  # the same writer without the memo
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as zf:
        return zf.read("etrecord.json")


def test_fast_serialization_writes_what_torch_writes(tmp_path):
    batch = torch.export.Dim("batch", min=1, max=8)
    ep = torch.export.export(_Repeated().eval(), (torch.randn(2, 8),), dynamic_shapes=({0: batch},), strict=False)
    record = to_edge(ep, generate_etrecord=True).to_executorch().get_etrecord()
    originals = serde.serialize_tensor_meta, serde.serialize_sym_int, serde._dataclass_to_dict
    assert _manifest(record, fast=True) == _manifest(record, fast=False)
    assert (serde.serialize_tensor_meta, serde.serialize_sym_int, serde._dataclass_to_dict) == originals
    record.save(tmp_path / "r.etrecord")
    back = parse_etrecord(tmp_path / "r.etrecord")
    assert len(back.edge_dialect_program.graph.nodes) == len(record.edge_dialect_program.graph.nodes)


def test_fast_serialization_restores_on_error():
    originals = serde.serialize_tensor_meta, serde.serialize_sym_int, serde._dataclass_to_dict
    assert gc.isenabled()
    try:
        with fast_serialization():
            assert serde.serialize_sym_int is not originals[1]
            assert not gc.isenabled()  # paused while saving (the save's CPU time halved on big graphs)
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert (serde.serialize_tensor_meta, serde.serialize_sym_int, serde._dataclass_to_dict) == originals
    assert gc.isenabled()


def test_fast_serialization_leaves_a_paused_collector_paused():
    gc.disable()
    try:
        with fast_serialization():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
