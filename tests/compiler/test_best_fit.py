"""The planner's best fit (etlab.compiler._best_fit): the segment tree places every block where the plain
scan over all placed blocks does, and never overlaps two blocks whose lifetimes overlap."""

from __future__ import annotations

import random

import pytest

from etlab.compiler._best_fit import best_fit
from etlab.compiler._memory_planning import Block, greedy, lower_bound


def _plain_scan(blocks: list[Block]) -> list[int]:
    """The definition: per block, in order, the smallest gap (lowest on ties) between the byte ranges of
    the placed blocks whose lifetimes overlap its own, else the top of them."""
    placed: list[Block] = []
    for b in blocks:
        others = sorted((p.offset, p.offset + p.size) for p in placed if p.start <= b.end and b.start <= p.end)
        best, best_gap, cursor = None, None, 0
        for offset, top in others:
            gap = offset - cursor
            if gap >= b.size and (best_gap is None or gap < best_gap):
                best, best_gap = cursor, gap
            cursor = max(cursor, top)
        b.offset = cursor if best is None else best
        placed.append(b)
    return [b.offset for b in blocks]


def _random_blocks(rng: random.Random, n: int, steps: int, zero: bool = False) -> list[Block]:
    blocks = []
    for _ in range(n):
        start = rng.randrange(steps)
        end = min(steps - 1, start + int(rng.expovariate(1 / rng.choice([1, 8, steps / 3]))))
        blocks.append(Block([], rng.choice([0, 16, 48, 128, 1024] if zero else [16, 48, 128, 1024]), start, end, 1))
    return blocks


@pytest.mark.parametrize("seed", range(6))
def test_same_placement_as_the_plain_scan(seed):
    rng = random.Random(seed)
    # sizes of graphs small and large enough for buckets several steps wide and a deep tree
    blocks = _random_blocks(rng, rng.choice([40, 400]), rng.choice([30, 3000]))
    got_top = best_fit(blocks)
    got = [b.offset for b in blocks]
    assert got == _plain_scan(blocks)
    assert got_top == max(b.offset + b.size for b in blocks)


def test_long_lived_blocks_among_short_ones():
    """The unrolled-RNN shape: hundreds of outputs alive until the end among short-lived temporaries."""
    rng = random.Random(7)
    blocks = [Block([], 128, s, 2999, 1) for s in range(0, 3000, 10)]
    blocks += [Block([], rng.choice([128, 384]), s, s + rng.randrange(6), 1) for s in range(3000)]
    blocks.sort(key=lambda b: (-b.size, b.start))
    best_fit(blocks)
    got = [b.offset for b in blocks]
    assert got == _plain_scan(blocks)


def test_no_overlap_and_empty_tensors_at_zero():
    rng = random.Random(3)
    for _ in range(20):
        blocks = _random_blocks(rng, 60, 200, zero=True)
        best_fit(blocks)
        for b in blocks:
            if b.size == 0:
                assert b.offset == 0
                continue
            for o in blocks:
                if o is not b and o.size and b.start <= o.end and o.start <= b.end:
                    assert b.offset + b.size <= o.offset or o.offset + o.size <= b.offset


def test_greedy_stops_at_the_lower_bound_and_keeps_the_best_order():
    rng = random.Random(11)
    blocks = _random_blocks(rng, 300, 500)
    size = greedy(blocks, 1)
    assert size >= lower_bound(blocks, 500)
    assert size == max(b.offset + b.size for b in blocks)
    chain = [Block([], 64, i, i + 1, 1) for i in range(50)]  # reaches the bound (128) in the first order
    assert greedy(chain, 1) == 128 == lower_bound(chain, 51)
