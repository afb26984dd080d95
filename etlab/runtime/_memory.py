"""Where tensor data lives at run time: planned arenas, constant segments, external data.

Every tensor the runtime builds is a view over bytes it does not copy: a slice of a method's
arena (one per memory id of the plan), of the program's constant segment, or of a `.ptd`
entry. Each view gets its own non-resizable storage covering exactly its planned bytes, so a
kernel that tries to grow a tensor past its planned size fails instead of overwriting a
neighbour in the arena.
"""

from __future__ import annotations

import math
import mmap
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from etlab.runtime._errors import LoadError


def element_size(dtype: torch.dtype) -> int:
    """Bytes per element of a dtype."""
    return torch.empty(0, dtype=dtype).element_size()


def fixed_empty(dtype: torch.dtype) -> torch.Tensor:
    """An empty tensor whose storage cannot grow: a kernel writing into it fails instead of
    allocating whatever size a file asks for. `set_` still re-points it (inputs, views, moves)."""
    return torch.frombuffer(bytearray(8), dtype=torch.uint8)[:0].view(dtype)


def dim_order_strides(sizes: list[int], dim_order: list[int] | None) -> list[int]:
    """Strides of a dense tensor whose dimensions are laid out outermost-first in `dim_order`."""
    order = list(dim_order) if dim_order else list(range(len(sizes)))
    strides = [0] * len(sizes)
    step = 1
    for d in reversed(order):
        strides[d] = step
        step *= max(sizes[d], 1)
    return strides


# Largest tensor (bytes) a file may describe: far above any arena, far below int64 overflow in
# torch's own size arithmetic (sizes x strides x element size).
MAX_TENSOR_BYTES = 1 << 48
MAX_RANK = 16


def check_dim_order(sizes: list[int], dim_order: list[int] | None, what: str) -> None:
    """Checks a tensor's shape metadata before any tensor is built from it: rank, sizes, and
    dim_order a permutation. The strides are then derived from dim_order, so they are consistent."""
    if len(sizes) > MAX_RANK:
        raise LoadError(f"{what}: {len(sizes)} dimensions (at most {MAX_RANK})")
    if dim_order and sorted(dim_order) != list(range(len(sizes))):
        raise LoadError(f"{what}: dim_order {list(dim_order)} is not a permutation of the {len(sizes)} dimensions")
    if any(s < 0 for s in sizes):
        raise LoadError(f"{what}: negative size in {list(sizes)}")
    # Python ints do not overflow: this bounds what torch later computes in int64.
    if math.prod(max(s, 1) for s in sizes) * 8 > MAX_TENSOR_BYTES:
        raise LoadError(f"{what}: sizes {list(sizes)} describe more than {MAX_TENSOR_BYTES} bytes")


def reshape_in_place(t: torch.Tensor, sizes, dim_order=None) -> None:
    """Gives `t` new sizes within its own memory, laid out in `dim_order`; fails past its capacity."""
    sizes = list(sizes)
    if list(t.shape) != sizes:
        t.set_(t.untyped_storage(), t.storage_offset(), sizes, dim_order_strides(sizes, dim_order))


def nbytes_of(sizes: list[int], dtype: torch.dtype) -> int:
    """Bytes a dense tensor of `sizes` and `dtype` takes."""
    return math.prod(sizes) * element_size(dtype)


def view_of(buffer, offset: int, sizes: list[int], dim_order: list[int] | None, dtype: torch.dtype) -> torch.Tensor:
    """A tensor over buffer[offset : offset + nbytes] that shares its memory (bounds checked by the caller)."""
    strides = dim_order_strides(sizes, dim_order)
    count = math.prod(sizes)
    if count == 0:
        return fixed_empty(dtype).as_strided(sizes, strides)
    with warnings.catch_warnings():
        # Constant data is a read-only mapping; nothing writes it (out arguments are checked at bind time).
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        flat = torch.frombuffer(buffer, dtype=dtype, count=count, offset=offset)
    return flat.as_strided(sizes, strides)


@dataclass
class Arenas:
    """One zero-filled buffer per memory id of a plan (id 0 is reserved and stays None)."""

    tensors: list[torch.Tensor | None]
    arrays: list[np.ndarray | None]

    @property
    def total_bytes(self) -> int:
        """The bytes of all arenas together (what the plan costs at run time)."""
        return sum(t.numel() for t in self.tensors if t is not None)


_LAZY_ARENA_BYTES = 1 << 20


def _zeroed(size: int) -> np.ndarray:
    """`size` zero bytes. Large arenas are anonymous mappings: the system hands out zero pages as
    they are first touched, so a plan that declares more than it uses costs only what it uses."""
    if size < _LAZY_ARENA_BYTES:
        return np.zeros(size, dtype=np.uint8)
    return np.frombuffer(mmap.mmap(-1, size), dtype=np.uint8)


def allocate_arenas(sizes: list[int], what: str, shared: dict[int, tuple[torch.Tensor, np.ndarray]] | None = None,
                    ) -> Arenas:
    """One arena per memory id; `shared` gives the ones the method shares with others (already sized)."""
    tensors: list[torch.Tensor | None] = [None]
    arrays: list[np.ndarray | None] = [None]
    for mem_id, size in enumerate(sizes[1:], start=1):
        if size < 0:
            raise LoadError(f"{what}: memory arena {mem_id} has negative size {size}")
        if shared and mem_id in shared:
            tensor, array = shared[mem_id]
            tensors.append(tensor)
            arrays.append(array)
            continue
        try:
            array = _zeroed(size)
        except (OSError, MemoryError, OverflowError, ValueError) as e:
            raise LoadError(f"{what}: cannot allocate memory arena {mem_id} of {size} bytes ({e})") from None
        tensors.append(torch.from_numpy(array))
        arrays.append(array)
    return Arenas(tensors, arrays)


def planned_tensor(arenas: Arenas, mem_id: int, offset: int, sizes: list[int], dim_order: list[int] | None,
                   dtype: torch.dtype, what: str) -> torch.Tensor:
    """A tensor viewing its planned place in an arena; a LoadError naming the value when the memory id or the byte
    range is outside the plan (a hostile file's offsets never reach other memory)."""
    if not 0 < mem_id < len(arenas.arrays):
        raise LoadError(f"{what}: memory id {mem_id} is not one of the plan's arenas 1..{len(arenas.arrays) - 1}")
    size = len(arenas.arrays[mem_id])
    nbytes = nbytes_of(sizes, dtype)
    if offset < 0 or offset + nbytes > size:
        raise LoadError(f"{what}: {nbytes} bytes at offset {offset} overrun arena {mem_id} ({size} bytes)")
    return view_of(arenas.arrays[mem_id], offset, sizes, dim_order, dtype)


def data_tensor(data, offset: int, sizes: list[int], dim_order: list[int] | None, dtype: torch.dtype,
                what: str) -> torch.Tensor:
    """A zero-copy tensor over constant or external bytes `data` (bytes, memoryview or mmap view)."""
    nbytes = nbytes_of(sizes, dtype)
    if offset < 0 or offset + nbytes > len(data):
        raise LoadError(f"{what}: needs {nbytes} bytes at offset {offset}, but its data holds {len(data)} bytes")
    return view_of(data, offset, sizes, dim_order, dtype)
