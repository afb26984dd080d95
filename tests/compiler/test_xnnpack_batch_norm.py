"""Batch norms no convolution absorbs are delegated to XNNPACK as a per-channel multiply and add, over
(N, C) too: timm's RepViT classifier (BatchNorm1d over pooled features, then a linear; its distillation
head the same) was left portable by etlab while upstream's partitioner delegates it."""

from __future__ import annotations

import torch
from torch import nn

from etlab.compiler import to_edge_transform_and_lower
from etlab.compiler.backends import XnnpackPartitioner
from etlab.devtools import get_delegation_info
from etlab.facts.lowered import DELEGATION_REFUSAL_META
from etlab.runtime import Runtime


class NormHead(nn.Module):
    """conv, global mean (N, C), BatchNorm1d, linear, BatchNorm1d after the linear, and a BatchNorm1d
    over (N, C, L) after an add (no convolution to fold into)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn_pooled = nn.BatchNorm1d(8)
        self.fc = nn.Linear(8, 6)
        self.bn_fc = nn.BatchNorm1d(6)
        self.bn_seq = nn.BatchNorm1d(8)
        with torch.no_grad():
            for bn in (self.bn_pooled, self.bn_fc, self.bn_seq):
                bn.running_mean.normal_()
                bn.running_var.uniform_(0.5, 2)
                bn.weight.uniform_(0.5, 2)
                bn.bias.normal_()

    def forward(self, x):
        y = self.conv(x)
        head = self.bn_fc(self.fc(self.bn_pooled(y.mean((2, 3)))))
        seq = self.bn_seq(y.flatten(2) + 1.0)
        return head, seq


def make_norm_head():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return NormHead().eval(), (torch.randn(2, 3, 8, 8),)


def test_batch_norms_over_nc_and_ncl_are_delegated_and_run_like_eager():
    model, inputs = make_norm_head()
    edge = to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=[XnnpackPartitioner()])
    gm = edge.exported_program().graph_module
    left = [(n.name, n.meta.get(DELEGATION_REFUSAL_META)) for n in gm.graph.nodes
            if n.op == "call_function" and "batch_norm" in str(n.target)]
    assert left == []
    info = get_delegation_info(edge.exported_program())
    df = info.get_operator_delegation_dataframe()
    portable = {r["op_type"]: r["occurrences_in_non_delegated_graphs"] for _, r in df.iterrows()
                if r["op_type"] != "Total" and r["occurrences_in_non_delegated_graphs"]}
    assert info.num_delegated_subgraphs == 1 and portable == {"getitem": 2}  # the delegate call's two outputs
    got = Runtime.get().load_program(edge.to_executorch().buffer).load_method("forward").execute(list(inputs))
    with torch.no_grad():
        want = model(*inputs)
    assert len(got) == 2
    for g, w in zip(got, want):
        assert g.shape == w.shape and torch.allclose(g, w, atol=1e-5, rtol=1e-5)


def test_batch_norm_over_a_5d_input_is_refused_naming_its_rank():
    class BN3d(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm3d(4)

        def forward(self, x):
            return self.bn(x + 1.0)

    model, x = BN3d().eval(), torch.randn(1, 4, 2, 3, 3)
    edge = to_edge_transform_and_lower(torch.export.export(model, (x,)), partitioner=[XnnpackPartitioner()])
    refusals = [n.meta[DELEGATION_REFUSAL_META] for n in edge.exported_program().graph.nodes
                if "batch_norm" in str(n.target) and DELEGATION_REFUSAL_META in n.meta]
    assert refusals and "batch norm over a 5-D input" in refusals[0].reason
