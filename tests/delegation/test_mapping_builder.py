"""DelegateMappingBuilder: generated vs manual identifiers, and its error cases."""

from __future__ import annotations

import pytest
import torch

from etlab.compiler import DelegateMappingBuilder, DelegationError


def _nodes(*handles):
    graph = torch.fx.Graph()
    nodes = []
    for i, handle in enumerate(handles):
        node = graph.placeholder(f"n{i}")
        if handle is not None:
            node.meta["debug_handle"] = handle
        nodes.append(node)
    return nodes


def test_generated_identifiers_count_from_zero():
    builder = DelegateMappingBuilder(generated_identifiers=True)
    a, b, c = _nodes(7, 3, 5)
    assert builder.insert_delegate_mapping_entry(nodes=a) == 0
    assert builder.insert_delegate_mapping_entry(nodes=[b, c]) == 1
    assert builder.insert_delegate_mapping_entry(handles=[9, None, 2]) == 2
    assert builder.get_delegate_mapping() == {0: (7,), 1: (3, 5), 2: (2, 9)}


def test_manual_identifiers_of_either_type():
    builder = DelegateMappingBuilder()
    (node,) = _nodes(4)
    assert builder.insert_delegate_mapping_entry(nodes=node, identifier="conv_fused") == "conv_fused"
    assert builder.insert_delegate_mapping_entry(handles=11, identifier=42) == 42
    assert builder.get_delegate_mapping() == {"conv_fused": (4,), 42: (11,)}


@pytest.mark.parametrize(
    "generated, kwargs, message",
    [
        (True, {"handles": 1, "identifier": 3}, "cannot take the manual identifier"),
        (False, {"handles": 1}, "uses manual identifiers"),
        (False, {"handles": 1, "identifier": 1.5}, "int or a str"),
        (False, {"handles": [None], "identifier": "x"}, "no debug handles"),
        (False, {"identifier": "x"}, "exactly one of"),
        (False, {"handles": 1, "nodes": [], "identifier": "x"}, "exactly one of"),
        (False, {"handles": ["a"], "identifier": "x"}, "must be ints"),
    ],
)
def test_misuse_is_reported(generated, kwargs, message):
    builder = DelegateMappingBuilder(generated_identifiers=generated)
    with pytest.raises(DelegationError, match=message):
        builder.insert_delegate_mapping_entry(**kwargs)
    assert builder.get_delegate_mapping() == {}


def test_duplicate_manual_identifier_is_rejected():
    builder = DelegateMappingBuilder()
    builder.insert_delegate_mapping_entry(handles=1, identifier="op")
    with pytest.raises(DelegationError, match="already inserted"):
        builder.insert_delegate_mapping_entry(handles=2, identifier="op")
    assert builder.get_delegate_mapping() == {"op": (1,)}


def test_nodes_without_handles_are_skipped():
    builder = DelegateMappingBuilder(generated_identifiers=True)
    with_handle, without = _nodes(6, None)
    builder.insert_delegate_mapping_entry(nodes=[with_handle, without])
    assert builder.get_delegate_mapping() == {0: (6,)}
