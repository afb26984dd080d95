"""Reading `torch.save` bytes (upstream ETRecord members) without running any pickle code.

A `torch.save` file is a zip: `<dir>/data.pkl` (a pickle of the value), `<dir>/data/<key>` (one
raw storage per key) and a few bookkeeping entries. `pickle.load` would call whatever callables
the pickle names; here the opcode stream is tokenized by `pickletools.genops` (a disassembler:
it decodes arguments, calls nothing) and run on a small stack machine that knows only:

- plain values: None, bools, ints, floats, str, bytes; tuples, lists, dicts (and OrderedDict());
- storages, as persistent ids `('storage', torch.<Dtype>Storage, key, 'cpu', numel)`, whose
  bytes must be the zip entry `data/<key>` of exactly `numel` elements;
- tensors, through `torch._utils._rebuild_tensor_v2` (size, stride and offset checked against
  the storage) and parameters through `torch._utils._rebuild_parameter`.

Any other global, a REDUCE of anything else, BUILD, object creation, extensions or a malformed
stream is a FormatError naming the member. Sizes are bounded (opcodes, memo, nesting), and the
zip itself is checked before anything is read: one top directory, only torch's entry names, no
encryption, declared sizes within the member's size.

A memo lets a pickle share one container many times: 60 lists each holding the previous one twice
take 225 bytes and 2**60 elements when walked as a tree. So the decoded value is walked once per
object (`check_value`), and its size as a tree (what any consumer that recurses over it visits) is
bounded in proportion to the pickle (`element_budget`), so every later walk stays linear in the
file's size; error messages describe values without printing them (`_brief`).
"""

from __future__ import annotations

import io
import math
import pickletools
import re
import zipfile
from collections import OrderedDict

import torch

from etlab.errors import FormatError

# torch.<Name>Storage -> element type of a typed storage (what torch.save writes for dense tensors).
STORAGE_DTYPES: dict[str, torch.dtype] = {
    "FloatStorage": torch.float32, "DoubleStorage": torch.float64, "HalfStorage": torch.float16,
    "BFloat16Storage": torch.bfloat16, "LongStorage": torch.int64, "IntStorage": torch.int32,
    "ShortStorage": torch.int16, "CharStorage": torch.int8, "ByteStorage": torch.uint8,
    "BoolStorage": torch.bool, "ComplexFloatStorage": torch.complex64, "ComplexDoubleStorage": torch.complex128,
}
STORAGE_NAMES = {dtype: name for name, dtype in STORAGE_DTYPES.items()}
MAX_OPCODES = 1 << 20
MAX_DEPTH = 64
MAX_RANK = 64
# Elements of the decoded value counted as a tree (a shared container once per reference). A pickle
# that shares no container spells each element out (at least one opcode each); one that repeats a
# value (the same inputs several times) a few times over. So: up to FREE_ELEMENTS, then
# ELEMENTS_PER_OPCODE per opcode, never more than MAX_ELEMENTS.
FREE_ELEMENTS = 1 << 16
ELEMENTS_PER_OPCODE = 64
MAX_ELEMENTS = 1 << 20
_MAX_DIM = 1 << 62  # sizes, strides and offsets of a tensor (a product of 64 of them stays small)
_BOOKKEEPING = re.compile(r"(?:version|\.format_version|\.storage_alignment|byteorder|\.data/serialization_id"
                          r"|\.data/version)")
_STORAGE_KEY = re.compile(r"[0-9]{1,9}")


class _Global:
    """A callable or class the pickle named; only ever compared, never called."""

    def __init__(self, module: str, name: str):
        self.module, self.name = module, name

    def __repr__(self) -> str:
        return f"{self.module}.{self.name}"


_REBUILD_TENSOR = ("torch._utils", "_rebuild_tensor_v2")
_REBUILD_PARAMETER = ("torch._utils", "_rebuild_parameter")
_ORDERED_DICT = ("collections", "OrderedDict")
_TORCH_SIZE = ("torch", "Size")
_ALLOWED_GLOBALS = frozenset({_REBUILD_TENSOR, _REBUILD_PARAMETER, _ORDERED_DICT, _TORCH_SIZE,
                              *(("torch", n) for n in STORAGE_DTYPES)})


class _Storage:
    """A storage the pickle refers to: its element type and its elements (a flat tensor)."""

    def __init__(self, dtype: torch.dtype, flat: torch.Tensor):
        self.dtype, self.flat = dtype, flat


class _Mark:
    pass


_MARK = _Mark()


def _entries(data: bytes, where: str) -> tuple[str, dict[str, zipfile.ZipInfo], zipfile.ZipFile]:
    """The torch zip's top directory and entries (by name below it), checked."""
    if not data.startswith(b"PK"):
        hint = " (a legacy pickle-only torch.save file, which etlab never loads)" if data[:1] == b"\x80" else ""
        raise FormatError(f"{where}: not a torch.save zip{hint}")
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
        infos = zf.infolist()
    except Exception as e:  # zipfile raises many kinds on a damaged directory
        raise FormatError(f"{where}: not a readable torch.save zip ({type(e).__name__}: {e})") from None
    tops = {info.filename.split("/", 1)[0] for info in infos}
    top = next(iter(tops)) if len(tops) == 1 else ""
    if not re.fullmatch(r"[A-Za-z0-9_.\-]{1,200}", top) or top in (".", ".."):
        raise FormatError(f"{where}: a torch.save zip has exactly one plain top directory, found {sorted(tops)[:4]}")
    out: dict[str, zipfile.ZipInfo] = {}
    total = 0
    for info in infos:
        rest = info.filename[len(top) + 1:] if info.filename.startswith(top + "/") else ""
        is_storage = rest.startswith("data/") and _STORAGE_KEY.fullmatch(rest[5:])
        if not (rest == "data.pkl" or is_storage or _BOOKKEEPING.fullmatch(rest)):
            raise FormatError(f"{where}: unexpected entry {info.filename[:120]!r} in a torch.save zip")
        if rest in out:
            raise FormatError(f"{where}: entry {info.filename!r} appears twice")
        if info.flag_bits & 0x1 or info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise FormatError(f"{where}: entry {info.filename!r} is encrypted or uses unsupported compression")
        total += info.file_size
        if total > max(len(data), 1) * 4 + (1 << 20):  # torch stores entries uncompressed
            raise FormatError(f"{where}: entries declare {total} bytes in a {len(data)}-byte member; "
                              "refusing a possible zip bomb")
        out[rest] = info
    if "data.pkl" not in out:
        raise FormatError(f"{where}: a torch.save zip without data.pkl")
    return top, out, zf


def _read(zf: zipfile.ZipFile, info: zipfile.ZipInfo, where: str) -> bytes:
    try:
        data = zf.read(info)
    except Exception as e:
        raise FormatError(f"{where}: entry {info.filename!r} is corrupt ({type(e).__name__}: {e})") from None
    if len(data) != info.file_size:
        raise FormatError(f"{where}: entry {info.filename!r} is shorter than it declares")
    return data


class _Machine:
    """The stack machine over genops' opcodes; see the module docstring for what it accepts."""

    def __init__(self, where: str, zf: zipfile.ZipFile, infos: dict[str, zipfile.ZipInfo]):
        self.where, self.zf, self.infos = where, zf, infos
        self.stack: list = []
        self.memo: dict[int, object] = {}
        self.storages: dict[str, _Storage] = {}

    def fail(self, what: str):
        return FormatError(f"{self.where}: {what}; etlab reads only tensors, storages, plain containers "
                           "and scalars from a torch.save pickle")

    def pop_mark(self) -> list:
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i] is _MARK:
                items = self.stack[i + 1:]
                del self.stack[i:]
                return items
        raise self.fail("a pickle takes items to a MARK that is not there")

    def pop(self):
        if not self.stack or self.stack[-1] is _MARK:
            raise self.fail("a pickle opcode pops from an empty stack")
        return self.stack.pop()

    def global_(self, module, name) -> _Global:
        if not (isinstance(module, str) and isinstance(name, str)) or (module, name) not in _ALLOWED_GLOBALS:
            raise self.fail(f"the pickle names {_brief(module)}.{_brief(name)}, which is not a tensor-rebuild "
                            "function or storage type")
        return _Global(module, name)

    def storage(self, pid) -> _Storage:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], _Global)
                and pid[1].module == "torch" and pid[1].name in STORAGE_DTYPES):
            raise self.fail(f"persistent id {_brief(pid)} is not a typed storage")
        _, kind, key, location, numel = pid
        if not isinstance(key, str) or not _STORAGE_KEY.fullmatch(key) or f"data/{key}" not in self.infos:
            raise self.fail(f"storage key {_brief(key, 40)!r} names no data entry")
        if location != "cpu" or type(numel) is not int or numel < 0:
            raise self.fail(f"storage {key!r} is not a CPU storage of a non-negative size")
        dtype = STORAGE_DTYPES[kind.name]
        cached = self.storages.get(key)
        if cached is None:
            raw = _read(self.zf, self.infos[f"data/{key}"], self.where)
            if len(raw) != numel * dtype.itemsize:
                raise self.fail(f"storage {key!r} holds {len(raw)} bytes, not {numel} {dtype} elements")
            flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
            cached = self.storages[key] = _Storage(dtype, flat.view(dtype) if raw else torch.empty(0, dtype=dtype))
        elif cached.dtype != dtype:
            raise self.fail(f"storage {key!r} is used with two element types")
        return cached

    def rebuild_tensor(self, args) -> torch.Tensor:
        if not (isinstance(args, tuple) and len(args) in (6, 7) and isinstance(args[0], _Storage)):
            raise self.fail("_rebuild_tensor_v2 called with unexpected arguments")
        storage, offset, size, stride, requires_grad, hooks = args[:6]
        flat = storage.flat
        if len(args) == 7 and not (args[6] is None or (isinstance(args[6], dict) and not args[6])):
            raise self.fail("a tensor carries extra metadata")
        if not _ints(size) or not _ints(stride) or len(size) != len(stride) or len(size) > MAX_RANK:
            raise self.fail("a tensor's size and stride are not matching lists of non-negative integers")
        if type(offset) is not int or not 0 <= offset < _MAX_DIM or not isinstance(requires_grad, bool) \
                or not _empty_dict(hooks):
            raise self.fail("a tensor's offset, requires_grad or hooks are malformed")
        numel = math.prod(size)
        if numel > flat.numel():  # only overlapping (e.g. zero) strides could: a small file, a huge tensor
            raise self.fail(f"a tensor of size {list(size)[:8]} has more elements than its storage ({flat.numel()})")
        if numel and offset + sum((n - 1) * s for n, s in zip(size, stride)) >= flat.numel():
            raise self.fail(f"a tensor of size {list(size)} and stride {list(stride)} at offset {offset} lies "
                            f"outside its storage of {flat.numel()} elements")
        t = flat.as_strided(tuple(size), tuple(stride), offset) if numel else torch.empty(tuple(size), dtype=flat.dtype)
        if requires_grad:
            if not (t.is_floating_point() or t.is_complex()):
                raise self.fail(f"a {t.dtype} tensor requires grad")
            t.requires_grad_(True)
        return t

    def reduce(self, func, args):
        if not isinstance(func, _Global) or not isinstance(args, tuple):
            raise self.fail(f"REDUCE on {_brief(func, 60)}")
        key = (func.module, func.name)
        if key == _REBUILD_TENSOR:
            return self.rebuild_tensor(args)
        if key == _REBUILD_PARAMETER:
            if len(args) != 3 or not isinstance(args[0], torch.Tensor) or not isinstance(args[1], bool) \
                    or not _empty_dict(args[2]):
                raise self.fail("_rebuild_parameter called with unexpected arguments")
            data = args[0].detach()
            if args[1] and not (data.is_floating_point() or data.is_complex()):
                raise self.fail(f"a {data.dtype} parameter requires grad")
            return torch.nn.Parameter(data, requires_grad=args[1])
        if key == _ORDERED_DICT and args == ():
            return OrderedDict()
        if key == _TORCH_SIZE and len(args) == 1 and isinstance(args[0], tuple) and _ints(args[0]):
            return torch.Size(args[0])
        raise self.fail(f"REDUCE of {func} with these arguments")

    def run(self, pkl: bytes):
        """The pickle's value; `self.opcodes` is how many opcodes it took."""
        count = self.opcodes = 0
        try:
            ops = pickletools.genops(io.BytesIO(pkl))
            for opcode, arg, _ in ops:
                count = self.opcodes = count + 1
                if count > MAX_OPCODES:
                    raise self.fail(f"the pickle has more than {MAX_OPCODES} opcodes")
                done, value = self.step(opcode.name, arg)
                if done:
                    return value
        except FormatError:
            raise
        except RecursionError:
            raise self.fail("the pickle is nested too deeply") from None
        except (ValueError, TypeError, KeyError, IndexError, OverflowError, UnicodeDecodeError, EOFError) as e:
            raise self.fail(f"malformed pickle ({type(e).__name__}: {str(e)[:120]})") from None
        raise self.fail("the pickle ends without STOP")

    def step(self, name: str, arg):
        s = self.stack
        if name in ("PROTO", "FRAME"):
            if name == "PROTO" and not 2 <= arg <= 5:
                raise self.fail(f"pickle protocol {arg}")
        elif name in ("NONE", "NEWTRUE", "NEWFALSE"):
            s.append({"NONE": None, "NEWTRUE": True, "NEWFALSE": False}[name])
        elif name in ("BININT", "BININT1", "BININT2", "LONG1", "LONG4", "INT", "LONG", "BINFLOAT", "FLOAT",
                      "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8", "UNICODE", "BINBYTES", "SHORT_BINBYTES",
                      "BINBYTES8"):
            s.append(arg)
        elif name in ("BINSTRING", "SHORT_BINSTRING", "STRING"):
            s.append(arg if isinstance(arg, str) else bytes(arg).decode("latin-1"))
        elif name == "MARK":
            s.append(_MARK)
        elif name == "EMPTY_TUPLE":
            s.append(())
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            n = int(name[-1])
            items = [self.pop() for _ in range(n)][::-1]
            s.append(tuple(items))
        elif name == "TUPLE":
            s.append(tuple(self.pop_mark()))
        elif name == "EMPTY_LIST":
            s.append([])
        elif name == "LIST":
            s.append(self.pop_mark())
        elif name == "EMPTY_DICT":
            s.append({})
        elif name == "DICT":
            items = self.pop_mark()
            s.append(self._dict({}, items))
        elif name == "APPEND":
            value = self.pop()
            self._list(self.pop_peek()).append(value)
        elif name == "APPENDS":
            items = self.pop_mark()
            self._list(self.pop_peek()).extend(items)
        elif name == "SETITEM":
            value, key = self.pop(), self.pop()
            self._dict(self.pop_peek(), [key, value])
        elif name == "SETITEMS":
            items = self.pop_mark()
            self._dict(self.pop_peek(), items)
        elif name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):
            if not s or s[-1] is _MARK:
                raise self.fail("memoizing an empty stack")
            if len(self.memo) >= MAX_OPCODES:
                raise self.fail("the pickle's memo is too large")
            self.memo[len(self.memo) if name == "MEMOIZE" else int(arg)] = s[-1]
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            if int(arg) not in self.memo:
                raise self.fail(f"the pickle refers to memo entry {arg}, which it never stored")
            s.append(self.memo[int(arg)])
        elif name == "GLOBAL":
            module, _, attr = str(arg).partition(" ")
            s.append(self.global_(module, attr))
        elif name == "STACK_GLOBAL":
            attr, module = self.pop(), self.pop()
            s.append(self.global_(module, attr))
        elif name == "BINPERSID":
            s.append(self.storage(self.pop()))
        elif name == "REDUCE":
            args, func = self.pop(), self.pop()
            s.append(self.reduce(func, args))
        elif name == "POP":
            self.pop()
        elif name == "POP_MARK":
            self.pop_mark()
        elif name == "DUP":
            s.append(self.pop_peek())
        elif name == "STOP":
            result = self.pop()
            if s:
                raise self.fail("the pickle leaves items on its stack")
            return True, result
        else:
            raise self.fail(f"pickle opcode {name}")
        return False, None

    def pop_peek(self):
        if not self.stack or self.stack[-1] is _MARK:
            raise self.fail("a pickle opcode needs a value on an empty stack")
        return self.stack[-1]

    def _list(self, target) -> list:
        if not isinstance(target, list):
            raise self.fail(f"APPEND to a {type(target).__name__}")
        return target

    def _dict(self, target, items: list) -> dict:
        if not isinstance(target, dict) or len(items) % 2:
            raise self.fail(f"SETITEM on a {type(target).__name__}")
        for k in range(0, len(items), 2):
            key = items[k]
            if not isinstance(key, (str, int, float, bool, type(None), tuple)) or (isinstance(key, tuple) and \
                    not all(isinstance(x, (str, int, float, bool, type(None))) for x in key)):
                raise self.fail(f"a dict key of type {type(key).__name__}")
            target[key] = items[k + 1]
        return target


def _empty_dict(value) -> bool:
    return isinstance(value, dict) and not value


def _ints(value) -> bool:
    return isinstance(value, tuple) and all(type(v) is int and 0 <= v < _MAX_DIM for v in value)


def _brief(value, limit: int = 80) -> str:
    """A value as an error message shows it, in bounded time: str() of a shared container graph would
    expand it, and str() of a huge int raises."""
    if isinstance(value, str):
        return value[:limit]
    if isinstance(value, bytes):
        return repr(value[:limit])
    if isinstance(value, (bool, float, type(None), _Global)) or (type(value) is int and value.bit_length() <= 64):
        return str(value)[:limit]
    if type(value) is int:
        return f"an int of {value.bit_length()} bits"
    if isinstance(value, (list, tuple, dict)):
        return f"a {type(value).__name__} of {len(value)} items"
    return f"a {type(value).__name__.lstrip('_')}"


_PLAIN = (type(None), bool, int, float, str, bytes, torch.Tensor)


def element_budget(opcodes: int) -> int:
    """How many elements (as a tree) a pickle of `opcodes` opcodes may decode to; see FREE_ELEMENTS."""
    return min(MAX_ELEMENTS, max(FREE_ELEMENTS, ELEMENTS_PER_OPCODE * opcodes))


def check_value(value, where: str, budget: int = MAX_ELEMENTS) -> None:
    """Refuses values nested deeper than MAX_DEPTH or holding themselves, larger than `budget` elements
    when walked as a tree, or holding anything but plain values, containers and tensors (a bare
    storage or global). Each container is walked once (by id), so the check is linear in the pickle."""
    _Walk(where, budget).visit(value, 0)


class _Walk:
    """One walk of `check_value`: per container, its height and its size as a tree, computed once."""

    def __init__(self, where: str, budget: int):
        self.where, self.budget = where, budget
        self.done: dict[int, tuple[int, int]] = {}  # id -> (height, elements as a tree)
        self.active: set[int] = set()  # containers on the current path (a memo can make one hold itself)

    def fail(self, what: str) -> FormatError:
        return FormatError(f"{self.where}: {what}")

    def visit(self, value, depth: int) -> tuple[int, int]:
        """(height, tree size) of `value` reached at `depth`; raises when a bound is passed."""
        if not isinstance(value, (list, tuple, dict)):
            if not isinstance(value, _PLAIN):
                raise self.fail(f"the pickle's value holds a bare {type(value).__name__.lstrip('_')}")
            return 0, 1
        key = id(value)
        known = self.done.get(key)
        if known is None:
            if key in self.active:
                raise self.fail(f"the value holds itself (nested more than {MAX_DEPTH} levels deep)")
            if depth > MAX_DEPTH:
                raise self.fail(f"the value is nested more than {MAX_DEPTH} levels deep")
            self.active.add(key)
            height, size = 0, 1
            for item in (value.values() if isinstance(value, dict) else value):
                h, n = self.visit(item, depth + 1)
                height, size = max(height, h + 1), size + n
                if size > self.budget:
                    raise self.fail(f"the value has more than {self.budget} elements when its shared containers "
                                    "are counted once per reference (a pickle that reuses containers to expand "
                                    "far beyond its size)")
            self.active.discard(key)
            known = self.done[key] = (height, size)
        if depth + known[0] > MAX_DEPTH:
            raise self.fail(f"the value is nested more than {MAX_DEPTH} levels deep")
        return known


def load_torch_bytes(data: bytes, where: str):
    """The value a `torch.save` zip holds (tensors, plain containers, scalars), or FormatError.

    Empty bytes are None (upstream writes an empty member for "no example inputs")."""
    if not data:
        return None
    _, infos, zf = _entries(bytes(data), where)
    byteorder = infos.get("byteorder")
    if byteorder is not None and _read(zf, byteorder, where).strip() not in (b"little",):
        raise FormatError(f"{where}: big-endian torch.save data is not supported")
    machine = _Machine(where, zf, infos)
    value = machine.run(_read(zf, infos["data.pkl"], where))
    check_value(value, where, element_budget(machine.opcodes))
    return value


def dump_torch_bytes(value) -> bytes:
    """`torch.save` bytes of a value (what upstream's loader, `torch.load(weights_only=True)`, reads)."""
    buf = io.BytesIO()
    torch.save(value, buf)
    return buf.getvalue()
