"""ETRecord.save's faster torch.export serialization (issue 28: Swin-T's save took 10x upstream's) writes
exactly what torch's own serializer writes, and leaves torch's functions as they were."""

from __future__ import annotations

import gc
import io
import logging
import threading
import zipfile

import torch
from torch import nn
from torch._export.serde import serialize as serde
from torch._export.serde.union import _Union

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


class _Branches(nn.Module):
    """torch.cond: its branches are serialized by nested serializers (union values inside them too)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda y: self.lin(y).relu(), lambda y: self.lin(y) - 1, (x,))


def _originals():
    return (serde.serialize_tensor_meta, serde.serialize_sym_int, serde._dataclass_to_dict,
            _Union.__dict__["create"], torch.fx.GraphModule.print_readable)


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
    originals = _originals()
    assert _manifest(record, fast=True) == _manifest(record, fast=False)
    assert _originals() == originals
    record.save(tmp_path / "r.etrecord")
    back = parse_etrecord(tmp_path / "r.etrecord")
    assert len(back.edge_dialect_program.graph.nodes) == len(record.edge_dialect_program.graph.nodes)


def test_fast_serialization_writes_what_torch_writes_for_control_flow():
    ep = torch.export.export(_Branches().eval(), (torch.randn(2, 4),), strict=False)
    record = to_edge(ep, generate_etrecord=True).to_executorch().get_etrecord()
    assert _manifest(record, fast=True) == _manifest(record, fast=False)


def test_graph_text_is_skipped_only_for_the_saving_thread_with_debug_logging_off():
    gm = torch.export.export(_Repeated().eval(), (torch.randn(2, 8),), strict=False).graph_module
    text = gm.print_readable(print_output=False)
    other: list[str] = []
    level = serde.log.level
    with fast_serialization():
        assert gm.print_readable(print_output=False) == ""  # serialize_graph's debug line, which is off
        worker = threading.Thread(target=lambda: other.append(gm.print_readable(print_output=False)))
        worker.start()
        worker.join()
        serde.log.setLevel(logging.DEBUG)
        try:
            assert gm.print_readable(print_output=False) == text
        finally:
            serde.log.setLevel(level)
    assert other == [text]
    assert gm.print_readable(print_output=False) == text


def test_fast_serialization_restores_on_error():
    originals = _originals()
    assert gc.isenabled()
    try:
        with fast_serialization():
            assert serde.serialize_sym_int is not originals[1]
            assert not gc.isenabled()  # paused while saving (the save's CPU time halved on big graphs)
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert _originals() == originals
    assert gc.isenabled()


def test_fast_serialization_leaves_a_paused_collector_paused():
    gc.disable()
    try:
        with fast_serialization():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
