"""The dataset of a report over many inputs (`quantization_report(..., dataset=)`): checked one input at a
time against the shapes the program was compiled for, a DataLoader's batches split into single inputs, and
inputs stacked into the batches the torch passes run on."""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import torch
from torch.fx import GraphModule

from etlab.devtools._quant_debug import _as_inputs


def split_item(item: tuple, example: tuple) -> list[tuple]:
    """An item of the dataset as inputs of the program: itself, or, when its tensors carry k times the
    example's batch of 1 in dim 0 (a DataLoader's batch), its k rows."""
    first = item[0] if item and isinstance(item[0], torch.Tensor) else None
    ex = example[0] if example and isinstance(example[0], torch.Tensor) else None
    if first is None or ex is None or ex.dim() == 0 or ex.shape[0] != 1 or first.dim() != ex.dim() \
            or first.shape[0] == 1 or first.shape[1:] != ex.shape[1:]:
        return [item]
    k = first.shape[0]
    if not all(isinstance(t, torch.Tensor) and t.dim() >= 1 and t.shape[0] == k for t in item):
        return [item]
    return [tuple(t[i:i + 1] for t in item) for i in range(k)]


def check_input(item: tuple, example: tuple, index: int) -> tuple:
    if len(item) != len(example):
        raise ValueError(f"dataset item {index}: {len(item)} input(s), the model takes {len(example)}")
    for k, (x, e) in enumerate(zip(item, example)):
        if isinstance(e, torch.Tensor):
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"dataset item {index}: input {k} is a {type(x).__name__}, not a tensor")
            if x.shape != e.shape or x.dtype != e.dtype:
                raise ValueError(f"dataset item {index}: input {k} is {x.dtype} {list(x.shape)}, the program takes "
                                 f"{e.dtype} {list(e.shape)} (one shape: the program is compiled for it)")
    return item


def graph_inputs(gm: GraphModule) -> tuple | None:
    """The (fake) tensors a converted graph was exported with, one per user input: the shapes the program
    takes; None when a placeholder has no static tensor value recorded."""
    vals = tuple(n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder")
    if not vals or not all(isinstance(v, torch.Tensor) and all(isinstance(d, int) for d in v.shape) for v in vals):
        return None
    return vals


def dataset_inputs(dataset, example: tuple | None, limit: int | None, shapes: tuple | None = None):
    """(example, iterator of checked single inputs, total count or None). shapes: what one input looks like
    (the program's inputs; default the example, else the first item)."""
    if isinstance(dataset, (torch.Tensor, str, bytes)) or not isinstance(dataset, Iterable):
        raise TypeError(f"dataset must be an iterable of the model's inputs (tensors or tuples of tensors), "
                        f"got {type(dataset).__name__}")
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive int, got {limit!r}")
    total = None
    try:
        total = len(dataset)
    except TypeError:
        pass
    it = iter(dataset)
    try:
        head = _as_inputs(next(it))
    except StopIteration:
        raise ValueError("dataset is empty: a report over a dataset needs at least one input") from None
    ref = shapes if shapes is not None else example if example is not None else head
    first = split_item(head, ref)
    example = first[0] if example is None else example
    if total is not None and len(first) > 1:
        total *= len(first)

    def stream():
        n = 0
        for item in itertools.chain([head], it):
            for x in split_item(_as_inputs(item), ref):
                if limit is not None and n >= limit:
                    return
                yield check_input(x, ref, n)
                n += 1

    if limit is not None:
        total = limit if total is None else min(total, limit)
    return example, stream(), total


def stack(chunk: list[tuple], channels_last: bool = False) -> tuple:
    """A batch of inputs as the graphs' arguments; channels_last: 4-D float images laid out channels-last
    (oneDNN's convolutions run ~1.5x faster on it, and every later activation keeps it)."""
    def arg(k: int):
        x = chunk[0][k]
        if not isinstance(x, torch.Tensor):
            return x
        x = torch.cat([c[k] for c in chunk])
        if channels_last and x.dim() == 4 and x.is_floating_point():
            x = x.contiguous(memory_format=torch.channels_last)
        return x

    return tuple(arg(k) for k in range(len(chunk[0])))



def has_batch_of_one(example: tuple) -> bool:
    """Inputs that can be stacked into a batch: every tensor has dim 0 of size 1."""
    tensors = [x for x in example if isinstance(x, torch.Tensor)]
    return bool(tensors) and all(x.dim() and x.shape[0] == 1 for x in tensors)
