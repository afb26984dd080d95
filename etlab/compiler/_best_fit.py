"""Best-fit placement of planned blocks in one arena, fast on graphs with tens of thousands of tensors.

A block (lifetime [start, end] in planner steps, `size` bytes) goes into the smallest hole of the
address space left by the blocks already placed whose lifetimes overlap its own (the lowest such
hole on ties), or on top of them. Only the union of those blocks' byte ranges matters, and that union
is small even when hundreds of blocks overlap (an unrolled RNN keeps every step's output alive until
the final stack: ~700 live blocks, 5 merged intervals). So instead of scanning every placed block per
placement (quadratic: a minute on a 16,000-tensor vocoder), the placed blocks are kept as merged
intervals in a segment tree over time:

- leaves are buckets of consecutive steps; a block that covers a bucket only in part is also kept
  whole in that bucket's `partial` list and checked exactly;
- node n's `own` holds the blocks whose canonical cover of bucket ranges includes n (each covers all
  of n's steps), `agg` the union of every block touching n's steps.

The blocks overlapping a query are then: `agg` of the canonical nodes of its interior buckets, `own`
along the root paths of its end buckets and of that interior range, and the exactly checked partial
blocks of its end buckets. Placements are the plain scan's. Blocks of zero bytes (empty tensors)
conflict with nothing: they go at offset 0 and take no part in placing the others.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

_TARGET_BUCKETS = 256  # leaves: enough that a bucket holds few partial blocks, few enough for a shallow tree


def _add(starts: list[int], ends: list[int], a: int, b: int) -> bool:
    """Adds [a, b) (a < b) to sorted disjoint intervals (two parallel lists), merging those it overlaps or
    touches; False when they already covered it."""
    i = bisect_left(ends, a)
    if i < len(starts) and starts[i] <= a and b <= ends[i]:
        return False
    j = bisect_right(starts, b)
    if i >= j:
        starts.insert(i, a)
        ends.insert(i, b)
    else:
        starts[i:j] = [min(a, starts[i])]
        ends[i:j] = [max(b, ends[j - 1])]
    return True


class _Occupancy:
    """Byte ranges of the placed blocks, queried by lifetime (see the module doc)."""

    def __init__(self, first: int, last: int):
        self.first = first
        self.width = max(1, -(-(last - first + 1) // _TARGET_BUCKETS))
        n = (last - first) // self.width + 1
        self.leaves = 1 << max(0, (n - 1).bit_length())
        size = 2 * self.leaves
        self.own_s: list[list[int]] = [[] for _ in range(size)]
        self.own_e: list[list[int]] = [[] for _ in range(size)]
        self.agg_s: list[list[int]] = [[] for _ in range(size)]
        self.agg_e: list[list[int]] = [[] for _ in range(size)]
        self.partial: list[list[tuple[int, int, int, int]]] = [[] for _ in range(self.leaves)]

    def _buckets(self, start: int, end: int) -> tuple[int, int, int, int]:
        """(first bucket, last bucket, first fully covered, last fully covered) of steps [start, end]."""
        w, f = self.width, self.first
        b0, b1 = (start - f) // w, (end - f) // w
        full0 = b0 if (start - f) % w == 0 else b0 + 1
        full1 = b1 if (end - f) % w == w - 1 else b1 - 1
        return b0, b1, full0, full1

    def _canonical(self, lo: int, hi: int) -> tuple[list[int], list[int]]:
        """Tree nodes covering buckets lo..hi exactly, and the nodes on the root paths of lo and hi."""
        canon, paths = [], []
        left, right = lo + self.leaves, hi + self.leaves + 1
        a, b = left, right - 1
        while left < right:
            if left & 1:
                canon.append(left)
                left += 1
            if right & 1:
                right -= 1
                canon.append(right)
            left >>= 1
            right >>= 1
        while a > 1:
            a >>= 1
            paths.append(a)
        while b > 1:
            b >>= 1
            paths.append(b)
        return canon, paths

    def add(self, start: int, end: int, offset: int, size: int) -> None:
        top = offset + size
        b0, b1, full0, full1 = self._buckets(start, end)
        if full0 <= full1:
            canon, paths = self._canonical(full0, full1)
            for n in canon:
                _add(self.own_s[n], self.own_e[n], offset, top)
                _add(self.agg_s[n], self.agg_e[n], offset, top)
            for n in paths:
                _add(self.agg_s[n], self.agg_e[n], offset, top)
        for k in {b0, b1}:
            if not full0 <= k <= full1:
                self.partial[k].append((start, end, offset, top))
                n = k + self.leaves  # up to the first ancestor that has it: each agg holds its children's
                while n and _add(self.agg_s[n], self.agg_e[n], offset, top):
                    n >>= 1

    def place(self, start: int, end: int, size: int) -> int:
        """The offset best fit gives a block living over [start, end]."""
        b0, b1, _f0, _f1 = self._buckets(start, end)
        spans: list[tuple[int, int]] = []
        own_s, own_e = self.own_s, self.own_e
        for k in {b0, b1}:
            for p_start, p_end, offset, top in self.partial[k]:
                if p_start <= end and start <= p_end:
                    spans.append((offset, top))
            n = k + self.leaves
            while n:
                if own_s[n]:
                    spans.extend(zip(own_s[n], own_e[n]))
                n >>= 1
        if b0 + 1 <= b1 - 1:
            canon, paths = self._canonical(b0 + 1, b1 - 1)
            for n in canon:
                if self.agg_s[n]:
                    spans.extend(zip(self.agg_s[n], self.agg_e[n]))
            for n in paths:
                if own_s[n]:
                    spans.extend(zip(own_s[n], own_e[n]))
        spans.sort()
        best, best_gap, cursor = None, None, 0
        for offset, top in spans:
            gap = offset - cursor
            if gap >= size and (best_gap is None or gap < best_gap):
                best, best_gap = cursor, gap
            if top > cursor:
                cursor = top
        return cursor if best is None else best


def best_fit(blocks: list) -> int:
    """Places each block (objects with start, end, size; sets .offset), in the given order, by best fit
    among the blocks already placed whose lifetimes overlap its own; returns the arena's size."""
    if not blocks:
        return 0
    occupancy = _Occupancy(min(b.start for b in blocks), max(b.end for b in blocks))
    top = 0
    for b in blocks:
        if b.size == 0:
            b.offset = 0
            continue
        b.offset = occupancy.place(b.start, b.end, b.size)
        occupancy.add(b.start, b.end, b.offset, b.size)
        top = max(top, b.offset + b.size)
    return top
