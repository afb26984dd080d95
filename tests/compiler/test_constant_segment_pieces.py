"""The constant segment is copied into the .pte once: the compiler hands serialize_pte the weights themselves
(`Pieces`, views of the tensors' memory), not a joined copy of them; the file is byte for byte what writing the
same segment as one bytes object gives, and every constant reads back as the tensor it came from."""

from __future__ import annotations

import numpy as np
import torch

from etlab.compiler import ExecutorchBackendConfig, to_edge
from etlab.schema import deserialize_pte, serialize_pte
from etlab.schema import program as P


class _Odd(torch.nn.Module):
    """Constants of sizes that need padding between them (3, 5 and 7 floats, 16-byte alignment)."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.arange(3.0))
        self.b = torch.nn.Parameter(torch.arange(5.0) + 10)
        self.c = torch.nn.Parameter(torch.arange(7.0) + 20)

    def forward(self, x):
        return x[:3] * self.a, x[:5] + self.b, x * self.c


def _compiled():
    ep = torch.export.export(_Odd(), (torch.ones(7),))
    return ep, to_edge(ep).to_executorch(ExecutorchBackendConfig(segment_alignment=1024))


def test_constant_segment_is_handed_over_as_views_of_the_weights():
    ep, et = _compiled()
    segment = et._compiled.segments[0]
    assert isinstance(segment, P.Pieces)
    pointers = {np.asarray(piece).ctypes.data for piece in segment.parts if isinstance(piece, memoryview)}
    assert {p.data_ptr() for p in ep.state_dict.values()} <= pointers  # no copy before the file's


def test_pte_with_pieces_is_the_pte_with_the_joined_segment():
    ep, et = _compiled()
    pte = deserialize_pte(et.buffer)
    offsets = pte.program.constant_segment.offsets
    data = bytes(pte.segments[0])
    for name, t in ep.state_dict.items():
        raw = t.detach().numpy().tobytes()
        assert any(data[o:o + len(raw)] == raw for o in offsets[1:]), name
    joined = b"".join(bytes(p) for p in et._compiled.segments[0].parts)
    again = serialize_pte(pte.program, [joined, *pte.segments[1:]], segment_alignment=1024)
    assert again == bytes(et.buffer)
