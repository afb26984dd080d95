"""Running the float and converted graphs side by side on a batch, one node at a time, for the report over a
dataset (`Stepper`): each graph advances only as far as the next per-layer measurement needs, the values the
report reads are held until their last reader is done and every other value is freed after its last use, so
memory is a few layers' activations of one batch rather than every kept value of both graphs.

Doing no more than it needs: the values no input reaches (weights dequantized per channel) are computed once,
and a quantize -> dequantize pair whose int8 value nobody reads runs as one fake-quantize pass (the same values
as the two decomposed ops, a third of the time). The guard torch.export adds for the example's batch size is
skipped: the caller checks a batch against a batch-1 run (see _quant_dataset)."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import GraphModule, Interpreter, Node

from etlab.devtools._quant_dataset_fold import CONV2D, conv2d, conv_bn_pair, fold, folded_conv
from etlab.devtools._quant_dataset_stats import Coverage
from etlab.devtools._quant_debug import _input_dependent, _is_dequantize, _is_quantize, mutated_later
from etlab.facts.fx import node_op_name


def static_quantizer(node: Node) -> Coverage | None:
    """A quantize_per_tensor node with a constant scale and zero point (a calibrated activation), or None."""
    if not _is_quantize(node) or "per_tensor" not in node_op_name(node) or len(node.args) < 5:
        return None
    scale, zp, qmin, qmax = node.args[1:5]
    if not all(isinstance(v, (int, float)) for v in (scale, zp, qmin, qmax)) or not scale > 0:
        return None
    return Coverage(node.name, float(scale), int(zp), (qmin - zp) * scale, (qmax - zp) * scale)


@dataclass
class Constants:
    """The values of a graph's nodes that no input reaches (weights dequantized per channel, folded
    constants, the parameters themselves), computed on the first run and reused: they cost as much as the layers
    on a small batch (a parameter's attribute lookup ~40 us, a few hundred per batch)."""

    names: set[str]
    values: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, gm: GraphModule) -> Constants:
        """The graph's nodes that no input reaches (computed once, not per input)."""
        dependent, mutated = _input_dependent(gm), mutated_later(gm)
        return cls({n.name for n in gm.graph.nodes if n.op in ("call_function", "get_attr")
                    and n.name not in dependent and n.name not in mutated})


def fusable_quantizers(gm: GraphModule, keep: set[str]) -> frozenset[str]:
    """Static per-tensor quantize nodes read only by dequantize nodes of the same parameters, and not kept:
    their int8 value is never looked at, so the pair runs as one fake-quantize pass."""
    out = set()
    for n in gm.graph.nodes:
        if static_quantizer(n) is None or n.name in keep or not n.users:
            continue
        if all(_is_dequantize(u) and "per_tensor" in node_op_name(u) and u.args[0] is n
               and tuple(u.args[1:5]) == tuple(n.args[1:5]) for u in n.users):
            out.add(n.name)
    return frozenset(out)


CHUNK = 1 << 19  # elements (2 MB of float32) fake-quantized at a time: they stay in cache through the five passes


def _flat(x: torch.Tensor) -> torch.Tensor | None:
    """x's elements as a 1-D view in memory order (contiguous or channels-last), or None."""
    if x.is_contiguous():
        return x.view(-1)
    if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last):
        return x.permute(0, 2, 3, 1).reshape(-1)
    return None


def fake_quantize(x: torch.Tensor, scale: float, zero_point: int, quant_min: int, quant_max: int) -> torch.Tensor:
    """Exactly the values quantize_per_tensor -> dequantize_per_tensor (quantized_decomposed) give, without the
    int8 tensor: round(x * (1 / scale)) + zero_point clamped, minus zero_point, times scale, in place on the
    output a cache-sized chunk at a time (~14x faster than the two ops, ~5x than torch's
    fake_quantize_per_tensor_affine, which rounds ties of x * inverse scale differently and builds a mask).
    The zero point is taken out of the clamp's bounds instead of added and subtracted: round() gives an integer,
    exact in float32 up to 2^24 with the zero point added, and anything larger is clamped either way."""
    out = torch.empty_like(x)
    src, dst = _flat(x), _flat(out)
    if src is None or dst is None:
        src, dst = x, out
    inverse = 1.0 / scale
    for start in range(0, max(dst.numel(), 1), CHUNK) if dst.dim() == 1 else [None]:
        s, d = (src, dst) if start is None else (src[start:start + CHUNK], dst[start:start + CHUNK])
        torch.mul(s, inverse, out=d)
        d.round_().clamp_(quant_min - zero_point, quant_max - zero_point).mul_(scale)
    return out


def _storage_bytes(values) -> dict[int, int]:
    out = {}
    for v in values:
        if isinstance(v, torch.Tensor) and v.device.type == "cpu":
            s = v.untyped_storage()
            out[s.data_ptr()] = s.nbytes()
    return out


class Stepper(Interpreter):
    """Runs a GraphModule one node at a time (`advance_to`), holding the values named in `pinned` in `values`
    until the caller releases them, and freeing every other value after its last use.

    alias: a dequantize of a fused quantize returns the quantize's (already dequantized) value; `alias` maps
    such a dequantize to its quantize, so that callers caching by value see one value, not two."""

    def __init__(self, gm: GraphModule, pinned: set[str], constants: Constants | None = None,
                 fusable: frozenset[str] = frozenset(), fold: bool = False, onednn: bool = False):
        super().__init__(gm, garbage_collect_values=False)
        self.order: list[Node] = list(gm.graph.nodes)
        self.position = {n.name: i for i, n in enumerate(self.order)}
        last: dict[Node, int] = {}
        for i, n in enumerate(self.order):
            for a in n.all_input_nodes:
                last[a] = i
        self.free_after: list[list[Node]] = [[] for _ in self.order]
        for a, i in last.items():  # a pinned value lives on in `values`, not in the environment
            self.free_after[i].append(a)
        self.pinned = pinned
        self.onednn = onednn  # convolutions on oneDNN (see _quant_dataset_fold.conv2d)
        self.dependent = _input_dependent(gm)
        self.constants = constants
        self.fusable = fusable
        self.fused: set[str] = set()
        self.alias: dict[str, str] = {}
        self.values: dict[str, Any] = {}
        self.pos = 0
        self.on_step: Callable[[], None] | None = None  # called after every node (memory measurement)
        # fold: conv2d -> batch_norm pairs run as one convolution (see _quant_dataset_fold), where nobody reads
        # the convolution's own value; conv node name -> its batch norm, and the folded parameters once computed
        self.fold_at: dict[str, Node] = {}
        self.folded: dict[str, tuple | None] = {}
        for n in self.order if fold else []:
            conv = n.args[0] if n.args else None
            if isinstance(conv, Node) and conv_bn_pair(conv, n) and conv.name not in pinned \
                    and not any(a.name in self.dependent for a in [*conv.all_input_nodes[1:], *n.all_input_nodes[1:]]):
                self.fold_at[conv.name] = n

    def start(self, args: tuple) -> None:
        """Starts a new pass over the graph with these inputs (nothing kept from the last one)."""
        self.env = {}
        self.args_iter = iter(args)
        self.values = {}
        self.pos = 0

    def advance_to(self, name: str) -> None:
        """Runs the nodes up to and including `name`."""
        target = self.position[name]
        while self.pos <= target:
            self._step()

    def finish(self) -> Any:
        """Runs the rest of the graph; the output node's value."""
        while self.pos < len(self.order):
            self._step()
        return self.env.get(self.order[-1])

    def live_bytes(self) -> dict[int, int]:
        """Storage -> bytes of the values held now that an input reaches (weights and constants left out:
        they do not grow with the batch)."""
        return _storage_bytes([*(v for n, v in self.env.items() if n.name in self.dependent),
                               *(v for n, v in self.values.items() if n in self.dependent)])

    def _step(self) -> None:
        n = self.order[self.pos]
        out = self._run(n)
        self.env[n] = out
        if n.name in self.pinned:
            self.values[n.name] = out
        for a in self.free_after[self.pos]:
            self.env.pop(a, None)
        self.pos += 1
        if self.on_step is not None:
            self.on_step()

    def _fake_quantize(self, n: Node):
        """quantize -> dequantize without the int8 value anyone reads, stored as the quantize node's value for
        its dequantize users; None when it does not apply. See `fake_quantize`."""
        x = self.env.get(n.args[0])
        if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
            return None
        scale, zp, qmin, qmax = n.args[1:5]
        if not qmin <= zp <= qmax:
            return None
        self.fused.add(n.name)
        return fake_quantize(x, float(scale), int(zp), int(qmin), int(qmax))

    def _fold(self, n: Node):
        """A folded pair's convolution computes the batch norm's value; the batch norm returns it. None: run the
        node as it is (parameters that do not fold)."""
        if n.name not in self.fold_at:  # the batch norm of a folded convolution
            return self.env[n.args[0]] if self.folded.get(n.args[0].name) is not None else None
        bn = self.fold_at[n.name]
        if n.name not in self.folded:
            self.folded[n.name] = fold(n, bn, lambda a: self.env[a] if a in self.env else self.fetch_attr(a.target))
        params = self.folded[n.name]
        return folded_conv(n, self.env[n.args[0]], *params) if params is not None else None

    def _run(self, n: Node) -> Any:
        if n.op == "call_module" and str(n.target).startswith("_guards"):
            return None
        if self.fused and n.args and isinstance(n.args[0], Node) and n.args[0].name in self.fused:
            self.alias[n.name] = n.args[0].name
            return self.env[n.args[0]]  # a dequantize of a fused quantize: its value is already dequantized
        if n.name in self.fold_at or (n.args and isinstance(n.args[0], Node) and n.args[0].name in self.folded):
            out = self._fold(n)
            if out is not None:
                return out
        cache = self.constants
        if cache is not None and n.name in cache.values:
            return cache.values[n.name]
        out = self._fake_quantize(n) if n.name in self.fusable else None
        if out is None and self.onednn and n.target is CONV2D and not n.kwargs:
            out = conv2d(*self.fetch_args_kwargs_from_env(n)[0])
        if out is None:
            with torch.no_grad():
                out = self.run_node(n)
            if cache is not None and n.name in cache.names:
                cache.values[n.name] = out
        return out


def run_keeping(gm: GraphModule, args: tuple, keep: set[str], constants: Constants | None = None,
                fusable: frozenset[str] = frozenset()) -> dict[str, Any]:
    """One whole run of `gm` on `args`: the values named in `keep` (the rest freed after their last use)."""
    runner = Stepper(gm, keep, constants, fusable)
    runner.start(args)
    runner.finish()
    return runner.values


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD, _M_MMAP_MAX = -1, -2, -3, -4
_KEEP = 2**31 - 1  # bytes of free heap kept rather than given back (mallopt takes an int)
_PAD = 64 << 20  # a thread arena's heap size (HEAP_MAX_SIZE on 64-bit): as top pad, no empty heap is unmapped
_TOP_PAD_DEFAULT = 128 << 10
_MMAP_AFTER = 32 << 20  # the mmap threshold glibc's adaptive setting reaches at most, and soon in a torch process
_TRIM_AFTER = 64 << 20  # the trim threshold it then reaches (2 x 32 MB)
_MMAP_MAX_DEFAULT = 65536


def _glibc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:  # musl or another C library: nothing to tune
        return None


@contextlib.contextmanager
def heap_kept() -> Iterator[bool]:
    """Large blocks served from the heap and freed memory kept there while the report runs (glibc; elsewhere a
    no-op), then given back. A batch's activations are tens of MB each: glibc maps every block above 32 MB
    afresh and unmaps it on free, and gives a large freed heap top back, so every op's output was faulted in
    page by page, which cost more than the op (a clone of 77 MB: 46 ms, 8 ms from the kept heap). Yields
    whether it applied. Process-wide while it lasts; afterwards glibc keeps fixed thresholds (mallopt turns its
    adaptive ones off), set to where the adaptive ones end up: blocks from 32 MB mapped, trimming above 64 MB.

    Other threads (the report's workers) allocate from their own arenas, made of 64 MB heaps that glibc unmaps
    as soon as one is empty, whatever the trim threshold: a sub-batch's activation of tens of MB has a heap
    to itself, so each was faulted in afresh (~4,000-6,500 page faults per MobileNetV2 input on the worker, ~10%
    of its CPU time). glibc keeps an empty heap when the heap before it could not give back `top pad` bytes,
    which with a top pad of a whole heap (64 MB) is never: the heaps stay, and are served again."""
    libc = _glibc()
    if libc is None:
        yield False
        return
    libc.mallopt(_M_MMAP_MAX, 0)
    libc.mallopt(_M_TRIM_THRESHOLD, _KEEP)
    libc.mallopt(_M_TOP_PAD, _PAD)
    try:
        yield True
    finally:
        libc.mallopt(_M_TOP_PAD, _TOP_PAD_DEFAULT)
        libc.mallopt(_M_MMAP_MAX, _MMAP_MAX_DEFAULT)
        libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_AFTER)
        libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_AFTER)
        libc.malloc_trim(0)


@contextlib.contextmanager
def gc_frozen() -> Iterator[bool]:
    """The objects alive when the report starts (torch, the graphs and their thousands of nodes) moved out of
    the cyclic garbage collector's sight while it runs (`gc.freeze`), then back: a batch allocates enough
    tuples and dicts to trigger collections, and each one walked all of them (~9% of the report's CPU time on
    MobileNetV2). Garbage made during the report is still collected. Yields whether it applied: not when the
    process had frozen objects already (a server's own `gc.freeze` is left as it is)."""
    if gc.get_freeze_count():
        yield False
        return
    gc.freeze()
    try:
        yield True
    finally:
        gc.unfreeze()
