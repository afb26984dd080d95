"""Model-level mutation: decode a seed into the schema dataclasses, change one leaf (an index, a size,
an enum, a list) and encode it again: a well-formed file with hostile meaning."""

from __future__ import annotations

import copy
import dataclasses
import enum
import random

from tests.fuzz.mutate_bytes import BOUNDARY_FLOATS, int_value, mutate_bytes

# -- model-level mutation -------------------------------------------------------------------------


def _leaves(obj, out: list, depth: int = 0) -> list:
    """(container, key) of every mutable leaf of a dataclass tree: ints, floats, enums, strings, lists."""
    if depth > 40:
        return out
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name)
            if isinstance(v, (memoryview, bytes, bytearray)):
                out.append((obj, f.name))
            elif isinstance(v, list) or dataclasses.is_dataclass(v) or isinstance(v, (int, float, str)) or v is None:
                out.append((obj, f.name))
                if isinstance(v, list) or dataclasses.is_dataclass(v):
                    _leaves(v, out, depth + 1)
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:256]):
            out.append((obj, i))
            if dataclasses.is_dataclass(v) or isinstance(v, list):
                _leaves(v, out, depth + 1)
    return out


def _get(container, key):
    return container[key] if isinstance(container, list) else getattr(container, key)


def _set(container, key, value) -> None:
    if isinstance(container, list):
        container[key] = value
    else:
        setattr(container, key, value)


def _new_leaf(rng: random.Random, old, donors: list):
    """A replacement for one leaf value that keeps its Python type (so the encoder accepts it)."""
    if isinstance(old, bool):
        return not old
    if isinstance(old, enum.IntEnum):
        members = list(type(old))
        return rng.choice(members)
    if isinstance(old, int):
        v = int_value(rng, old, 8, True)
        v = v - (1 << 64) if v >= 1 << 63 else v
        return rng.choice((v, old + 1, old - 1, -1, 0, old * 2, 2**31 - 1, 2**32 - 1, -(2**31)))
    if isinstance(old, float):
        return rng.choice(BOUNDARY_FLOATS)
    if isinstance(old, str):
        return rng.choice(("", old + "x", old[: len(old) // 2], "../../x", "\u00e9" * 3, old * 2,
                           rng.choice(donors) if donors else old))
    if isinstance(old, (memoryview, bytes, bytearray)):
        b = bytearray(old)
        mutate_bytes(rng, b)
        return bytes(b)
    if isinstance(old, list):
        lst = list(old)
        op = rng.randrange(5)
        if op == 0 or not lst:
            return []
        if op == 1:
            del lst[rng.randrange(len(lst))]
        elif op == 2:
            lst.insert(rng.randrange(len(lst) + 1), copy.deepcopy(rng.choice(lst)))
        elif op == 3:
            rng.shuffle(lst)
        else:
            lst.extend(copy.deepcopy(lst[: rng.randrange(1, 4)]))
        return lst
    if old is None or dataclasses.is_dataclass(old):
        return None if old is not None else old
    return old


class ModelMutator:
    """Decodes a seed once; each call changes one to three leaves, encodes, and restores the seed.

    Why restore instead of copying: deep-copying a decoded program per input would cost more
    than the loader under test; a change and its undo are cheap.
    """

    def __init__(self, decode, encode, data: bytes):
        self.model = decode(data)
        self.encode = encode
        # Every change is undone before the next call, so the leaves found once stay valid.
        self.leaves = _leaves(self.model, [])
        self.donors = [v for c, k in self.leaves if isinstance(v := _get(c, k), str)][:64]

    def __call__(self, rng: random.Random) -> bytes | None:
        leaves = self.leaves
        undo = []
        try:
            for _ in range(rng.choice((1, 1, 1, 2, 3))):
                container, key = rng.choice(leaves)
                old = _get(container, key)
                undo.append((container, key, old))
                _set(container, key, _new_leaf(rng, old, self.donors))
            return self.encode(self.model)
        except Exception:  # the encoder refuses values it cannot store: not an input
            return None
        finally:
            for container, key, old in reversed(undo):
                _set(container, key, old)
