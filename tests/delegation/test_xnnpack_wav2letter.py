"""torchaudio's Wav2Letter (corpus ta_wav2letter) as XNNPACK takes it: a stack of wide 1-D convolutions
(kernel 48 stride 2, kernel 7, kernel 32, 1x1) with ReLU, then log_softmax, which XNNPACK has no node
for. The same layers here without torchaudio: every convolution and ReLU is one partition (22 Edge nodes,
as upstream's partitioner takes them), the log_softmax stays portable, and the program matches eager."""

from __future__ import annotations

import torch
from torch import nn

from etlab.compiler import to_edge_transform_and_lower
from etlab.compiler.backends.xnnpack import XnnpackPartitioner
from etlab.devtools import get_delegation_info
from etlab.facts.lowered import DELEGATION_REFUSAL_META
from etlab.runtime import Runtime


class Wav2LetterLike(nn.Module):
    """Wav2Letter's layers at 1/4 and 1/8 of its widths (250 and 2000 channels): the same graph, small weights."""

    def __init__(self, features: int = 13, classes: int = 20, width: int = 64, wide: int = 256):
        super().__init__()
        layers = [nn.Conv1d(features, width, 48, stride=2, padding=23), nn.ReLU(inplace=True)]
        for _ in range(7):
            layers += [nn.Conv1d(width, width, 7, padding=3), nn.ReLU(inplace=True)]
        layers += [nn.Conv1d(width, wide, 32, padding=16), nn.ReLU(inplace=True),
                   nn.Conv1d(wide, wide, 1), nn.ReLU(inplace=True), nn.Conv1d(wide, classes, 1), nn.ReLU(inplace=True)]
        self.acoustic_model = nn.Sequential(*layers)

    def forward(self, x):
        return nn.functional.log_softmax(self.acoustic_model(x), dim=1)


def test_wav2letter_layers_are_one_partition_and_match_eager(tmp_path):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model, inputs = Wav2LetterLike().eval(), (torch.randn(1, 13, 60),)
    edge = to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=[XnnpackPartitioner()])
    info = get_delegation_info(edge.exported_program())
    assert (info.num_delegated_nodes, info.num_delegated_subgraphs) == (22, 1)
    (softmax,) = [n for n in edge.exported_program().graph.nodes if "log_softmax" in str(n.target)]
    assert softmax.meta[DELEGATION_REFUSAL_META].category == "operator"
    (tmp_path / "m.pte").write_bytes(edge.to_executorch().buffer)
    got = Runtime.get().load_program(tmp_path / "m.pte").load_method("forward").execute(list(inputs))
    with torch.no_grad():
        want = model(*inputs)
    torch.testing.assert_close(got[0], want, rtol=1e-4, atol=1e-4)
