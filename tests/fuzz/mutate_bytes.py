"""Byte-level mutations (flips, boundary words, splices, truncation) and the boundary values every
mutator draws from (tests/fuzz/mutate.py says what each mutator module is for)."""

from __future__ import annotations

import random
import struct

INT_CODES = {1: "B", 2: "H", 4: "I", 8: "Q"}
BOUNDARY_INTS = (0, 1, 2, 3, 4, 7, 8, 15, 16, 31, 32, 63, 64, 127, 128, 255, 256, 4095, 4096, 65535, 65536,
                 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1)
BOUNDARY_FLOATS = (0.0, -0.0, 1.0, -1.0, 1e-45, 3.4e38, 1e308, float("inf"), float("-inf"), float("nan"))
MAX_INPUT = 4 << 20  # mutations never grow an input past this


# -- primitive value choices ----------------------------------------------------------------------


def int_value(rng: random.Random, old: int, width: int, signed: bool) -> int:
    """A value for an integer field of `width` bytes: a boundary, a neighbour of the old value, or random."""
    bits = 8 * width
    r = rng.random()
    if r < 0.45:
        v = rng.choice(BOUNDARY_INTS)
        v = -v if signed and rng.random() < 0.3 else v
    elif r < 0.8:
        v = old + rng.choice((-1, 1, -2, 2, -4, 4, 8, 16, -16, 64, 1024))
    elif r < 0.9:
        v = old * rng.choice((2, 3, 256, 65536)) if old else rng.randrange(1 << min(bits, 20))
    else:
        v = rng.getrandbits(bits)
    return v & ((1 << bits) - 1)  # stored as raw bits, two's complement for signed fields


def pack_int(buf: bytearray, pos: int, width: int, value: int) -> None:
    struct.pack_into("<" + INT_CODES[width], buf, pos, value & ((1 << 8 * width) - 1))


def mutate_bytes(rng: random.Random, buf: bytearray) -> None:
    """One blind byte-level change: bit flip, boundary word, copy, insert, delete or truncate."""
    n = len(buf)
    if n == 0:
        buf.extend(rng.randbytes(rng.randrange(1, 64)))
        return
    op = rng.randrange(8)
    at = rng.randrange(n)
    if op == 0:
        buf[at] ^= 1 << rng.randrange(8)
    elif op == 1:
        buf[at] = rng.choice((0, 1, 0x7F, 0x80, 0xFF, rng.randrange(256)))
    elif op == 2 and n >= 8:
        width = rng.choice((2, 4, 8))
        at = rng.randrange(n - width + 1)
        pack_int(buf, at, width, int_value(rng, 0, width, True))
    elif op == 3:  # copy a chunk over another place
        length = rng.randrange(1, min(64, n) + 1)
        src, dst = rng.randrange(n - length + 1), rng.randrange(n - length + 1)
        buf[dst : dst + length] = buf[src : src + length]
    elif op == 4 and n < MAX_INPUT:
        buf[at:at] = rng.randbytes(rng.randrange(1, 32)) if rng.random() < 0.5 else buf[at : at + rng.randrange(1, 256)]
    elif op == 5:
        del buf[at : at + rng.randrange(1, 64)]
    elif op == 6:
        del buf[rng.randrange(n):]
    else:
        buf[at : at + 4] = rng.randbytes(4)
