"""Load-time bounds check of operators that take explicit sizes, strides and a storage offset.

`as_strided_copy` reads its input through the strides it is given. Torch checks those against
the storage when the kernel runs; a program whose arguments are known at load is refused at load
instead, with the value and instruction named, so a bad file never reaches a kernel.
"""

from __future__ import annotations

import torch

from etlab.runtime._errors import LoadError
from etlab.runtime._values import ValueTable

_STRIDED = {"aten::as_strided_copy", "aten::as_strided"}


def strided_extent(sizes, strides, offset: int) -> int:
    """Elements of storage a (sizes, strides, offset) view reaches: offset + 1 + sum((n - 1) * stride),
    or 0 when the view is empty. Python ints: no overflow."""
    if any(n == 0 for n in sizes):
        return 0
    return offset + 1 + sum((n - 1) * s for n, s in zip(sizes, strides))


def check_view_arguments(op: str, pos: list, table: ValueTable, args: list[int], site) -> None:
    """Refuses a static as_strided call whose view does not fit its input's storage."""
    if op not in _STRIDED or len(pos) < 3 or not isinstance(pos[0], torch.Tensor):
        return
    if not table.is_static_shape(args[0]) or any(table.resolver(s) is not None for s in args[1:4]):
        return  # known only at run time: torch's own check applies
    src, sizes, strides = pos[0], pos[1], pos[2]
    offset = pos[3] if len(pos) > 3 and pos[3] is not None else src.storage_offset()
    if not isinstance(sizes, list) or not isinstance(strides, list) or len(sizes) != len(strides):
        raise LoadError(f"{site}: sizes and strides must be int lists of one length")
    if any(n < 0 for n in sizes) or any(s < 0 for s in strides) or offset < 0:
        raise LoadError(f"{site}: negative size, stride or storage offset ({sizes}, {strides}, {offset})")
    available = src.untyped_storage().nbytes() // src.element_size()
    needed = strided_extent(sizes, strides, offset)
    if needed > available:
        raise LoadError(f"{site}: view of sizes {sizes}, strides {strides}, storage offset {offset} reaches "
                        f"{needed} elements, but value {args[0]}'s storage holds {available}")
