"""Placing the events of a delegate without a debug map on its nodes (etlab.inspector._delegate_nodes,
join_block's node_calls): by position, the ops fused into a node going with it."""

from __future__ import annotations

import numpy as np

from etlab.inspector import DelegateInfo, MethodInfo
from etlab.inspector._delegate_nodes import node_handles
from etlab.inspector._program_info import join_block

NO_HANDLE = 65535


def test_node_handles_take_the_fused_ops_after_them_and_layout_nodes_none():
    # transpose, conv(1) [+ bn 2, clamp 3], conv(4) [+ 5], add(6), matmul lowered to two nodes (7, 7), transpose
    got = node_handles([NO_HANDLE, 1, 4, 6, 7, 7, NO_HANDLE], covered=(1, 2, 3, 4, 5, 6, 7, 8))
    assert got == [None, (1, 2, 3), (4, 5), (6,), (7, 8), (7,), None]
    assert node_handles([NO_HANDLE, 0], covered=(1, 2)) == [None, None]  # no node names a covered handle
    assert node_handles([5, 9], covered=(3, 5, 9)) == [(3, 5), (9,)]     # before the first node: the first


def _join(n_calls: int, node_calls):
    per_call = ["Transpose #1", "Conv #1", "Add #1", "DELEGATE_CALL"]
    names = per_call * n_calls
    delegated = np.array([n != "DELEGATE_CALL" for n in names])
    method = MethodInfo(instruction_debug_handles={(0, 0): (1, 2, 3)},
                        delegates={(0, 0): DelegateInfo("XnnpackBackend", {})})
    return join_block(method, names, np.zeros(len(names), dtype=np.int64), np.zeros(len(names), dtype=np.int64),
                      [n if d else None for n, d in zip(names, delegated)], delegated, node_calls)


def test_events_of_each_call_are_its_nodes_in_order():
    nodes = {(0, 0): [None, (1, 2), (3,)]}
    assert _join(2, nodes).debug_handles == [None, (1, 2), (3,), (1, 2, 3)] * 2
    # a count that does not fit the node list (another program, a partial run) places nothing
    assert _join(1, {(0, 0): [None, (1, 2), (3,), (3,)]}).debug_handles == [None, None, None, (1, 2, 3)]
    assert _join(1, None).debug_handles == [None, None, None, (1, 2, 3)]
