"""The graphs of an ETRecord read from their torch.export JSON alone: no torch, no rebuilt program.

A recorded program is torch.export's serialized graph: nodes with string targets, named values,
tensor metadata (dtype enum, sizes) and node metadata (stack trace, nn_module_stack, torch_fn), and
in etlab's layout side tables for debug handles, delegates and delegation refusals (upstream's
layout keeps the debug handle in the node metadata and inlines each lowered module as a JSON
string). Drawing a graph (Model Explorer's adapter) or naming a record's ops (the Inspector's cold
start) needs only these facts; rebuilding the ExportedProgram with torch costs seconds on a large
graph. `JsonProgram` is that graph as torch.fx would hold it after deserialization: the same node
names (a single-tensor node is named after its output), `getitem` nodes unpacking multi-output
nodes (with the parent's metadata, as torch's deserializer gives them), placeholders first.

Every value is checked as it is read (types, nesting, sizes): a malformed document is a FormatError
naming the file and the member. Operators are checked by form only (`torch.ops.<ns>.<op>[.<overload>]`
or a known Python scalar function); whether torch registers them is checked when a program is
rebuilt (`_graph_check`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from etlab.errors import Error, FormatError

EDGE_OP_PREFIX = "executorch.exir.dialects.edge.ops."
DELEGATE_TARGET = "torch.ops.higher_order.executorch_call_delegate"
GETITEM = "_operator.getitem"
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
OP_TARGET = re.compile(rf"torch\.ops\.({_IDENT})\.({_IDENT})(?:\.({_IDENT}))?")
DUNDER_OPS = frozenset({"__and__", "__or__", "__xor__", "__lshift__", "__rshift__"})
# Python callables torch.export puts in graphs for symbolic integer arithmetic.
SCALAR_TARGETS = frozenset({
    *(f"_operator.{n}" for n in ("getitem", "add", "sub", "mul", "floordiv", "truediv", "mod", "pow", "neg",
                                 "pos", "abs", "eq", "ne", "lt", "le", "gt", "ge", "and_", "or_", "xor", "not_",
                                 "invert", "lshift", "rshift")),
    *(f"math.{n}" for n in ("ceil", "floor", "trunc", "sqrt")),
    *(f"torch.{n}" for n in ("sym_int", "sym_float", "sym_max", "sym_min", "sym_not", "sym_ite", "sym_sqrt",
                             "sym_sum", "_sym_sqrt")),
})

# torch.export's serialized ScalarType enum -> (torch dtype name, bytes per element)
DTYPES = {1: ("uint8", 1), 2: ("int8", 1), 3: ("int16", 2), 4: ("int32", 4), 5: ("int64", 8), 6: ("float16", 2),
          7: ("float32", 4), 8: ("float64", 8), 9: ("complex32", 4), 10: ("complex64", 8), 11: ("complex128", 16),
          12: ("bool", 1), 13: ("bfloat16", 2), 28: ("uint16", 2), 29: ("float8_e4m3fn", 1), 30: ("float8_e5m2", 1),
          31: ("float8_e4m3fnuz", 1), 32: ("float8_e5m2fnuz", 1), 33: ("float8_e8m0fnu", 1), 34: ("uint32", 4),
          35: ("uint64", 8)}

MAX_NODES = 2_000_000  # per graph: far beyond any real program, bounds the work a crafted file causes
MAX_NAME = 1000
MAX_TEXT = 1 << 20  # a stack trace or module stack
MAX_RANK = 64
MAX_NESTED_DELEGATES = 16

# Argument kinds that name values (the node's inputs, in the order torch.fx lists them).
_ONE_TENSOR = "as_tensor"
_MANY_TENSORS = ("as_tensors",)
_SYM = ("as_sym_int", "as_sym_float", "as_sym_bool")
_MANY_SYM = ("as_sym_ints", "as_sym_floats", "as_sym_bools")


class Unsupported(Error):
    """A well-formed program this reader does not mirror (the caller rebuilds it with torch instead)."""


@dataclass
class TensorMeta:
    """A JSON graph node's tensor: its dims (ints, or a symbolic size's text), dtype and element size."""

    dims: list  # ints, or the expression text of a symbolic size without a hint
    dtype: str
    itemsize: int


@dataclass
class JsonNode:
    """One node as torch.fx holds it after deserialization."""

    name: str
    op: str  # "placeholder" | "call_function" | "output"
    serialized: str = ""  # the name the file gives the node (torch.fx names a single-result node after its result)
    own_handle: int | None = None  # the debug handle upstream's layout writes in the node's own metadata
    target: str = ""  # the serialized target with edge ops as torch.ops names ("" for placeholders)
    written: str = ""  # the target as the file writes it (upstream's edge ops under their own module)
    inputs: list[str] = field(default_factory=list)  # names of the values it reads, deduplicated, in order
    val: object = None  # TensorMeta, a list of them (multi-output), or None
    stack_trace: str = ""
    module_stack: dict | None = None  # key -> (module path, type name)
    torch_fn: tuple | None = None
    debug_handle: object = None  # int or list of ints
    refusal: list | None = None  # [backend, category, reason, hint]
    delegate: Delegate | None = None  # set on executorch_call_delegate calls
    operands: list = field(default_factory=list)  # a delegate call's positional operands: a name, or None
    index: int = 0  # a getitem's output index
    outputs: list = field(default_factory=list)  # an output node's values: names, or None for constants


@dataclass
class Delegate:
    """A delegated partition in a JSON graph: the attribute holding it, its backend, and its original program."""

    attr: str
    backend: str
    original: JsonProgram


@dataclass
class JsonProgram:
    """A program read from a record's JSON graph without rebuilding torch objects: its nodes and user inputs, for
    viewers that only draw it."""

    nodes: list[JsonNode]
    user_inputs: set[str]
    where: str

    def node_map(self) -> dict[str, JsonNode]:
        """The nodes by name."""
        return {n.name: n for n in self.nodes}


def op_name(target: str) -> str:
    """`etlab.facts.fx.op_name` of a serialized target: 'aten.add.Tensor', 'executorch_call_delegate',
    'getitem', 'ceil', 'torch.sym_max'."""
    if target.startswith(EDGE_OP_PREFIX):
        return target[len(EDGE_OP_PREFIX):]
    if target.startswith("torch.ops.higher_order."):
        return target[len("torch.ops.higher_order."):]
    if target.startswith("torch.ops."):
        return target[len("torch.ops."):]
    module, _, name = target.rpartition(".")
    return name if module in ("_operator", "math", "builtins", "operator") else target


def op_type(written: str) -> str:
    """What upstream's Inspector shows as a node's op type (its target's `__name__`): "aten.addmm.default"
    for an edge op, "scalar_tensor.default" for a torch op, "executorch_call_delegate" for a
    higher-order op, "add" for operator.add. FormatError (by the caller) when None: not an operator."""
    if written.startswith(EDGE_OP_PREFIX):
        return written[len(EDGE_OP_PREFIX):]
    if written in SCALAR_TARGETS:
        return written.rpartition(".")[2]
    m = OP_TARGET.fullmatch(written)
    if m is None:
        return ""
    ns, op, overload = m.groups()
    if ns == "higher_order":
        return op if overload is None else ""
    return f"{op}.{overload}" if overload is not None else ""


def check_target_form(target, where: str) -> str:
    """The node's target with edge ops as torch.ops names, if it has an operator's form."""
    if not isinstance(target, str) or len(target) > MAX_NAME:
        raise FormatError(f"{where}: a node target is not a short string")
    if target.startswith(EDGE_OP_PREFIX):
        target = "torch.ops." + target[len(EDGE_OP_PREFIX):]
    if target in SCALAR_TARGETS:
        return target
    m = OP_TARGET.fullmatch(target)
    if m is None or any(part.startswith("__") and part not in DUNDER_OPS for part in m.groups() if part):
        raise FormatError(f"{where}: unknown operator {target[:120]!r}")
    return target


def parse_module_stack(text, where: str) -> dict | None:
    """torch.export's serialized nn_module_stack ("key,path,type;...", commas inside brackets kept)."""
    if not isinstance(text, str) or not text:
        return None
    out = {}
    for item in text.split(";"):
        if "(" not in item and "[" not in item:  # no brackets: commas only separate (most entries)
            parts = item.split(",")
            if len(parts) != 3:
                raise FormatError(f"{where}: an nn_module_stack entry {item[:80]!r} is not key,path,type")
            out[parts[0]] = (parts[1], parts[2])
            continue
        parts, start, depth = [], 0, 0
        for i, c in enumerate(item):
            if c in "[(":
                depth += 1
            elif c in ")]":
                depth -= 1
            elif c == "," and depth == 0:
                parts.append(item[start:i])
                start = i + 1
        parts.append(item[start:])
        if len(parts) != 3:
            raise FormatError(f"{where}: an nn_module_stack entry {item[:80]!r} is not key,path,type")
        out[parts[0]] = (parts[1], parts[2])
    return out


# -- checked access ------------------------------------------------------------------------------------


def _dict(value, where: str, what: str) -> dict:
    if not isinstance(value, dict):
        raise FormatError(f"{where}: {what} is not an object")
    return value


def _list(value, where: str, what: str, limit: int = MAX_NODES) -> list:
    if not isinstance(value, list):
        raise FormatError(f"{where}: {what} is not a list")
    if len(value) > limit:
        raise FormatError(f"{where}: {what} has {len(value)} entries (more than {limit})")
    return value


def _name(value, where: str, what: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_NAME:
        raise FormatError(f"{where}: {what} is not a name (a non-empty short string)")
    return value


def _text(value, where: str, what: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise FormatError(f"{where}: {what} is not a string of at most {MAX_TEXT} characters")
    return value


def _arg_names(arg, where: str) -> list[str]:
    """Names of the values one serialized argument refers to (one-key objects of torch's schema)."""
    if not isinstance(arg, dict) or len(arg) != 1:
        raise FormatError(f"{where}: an argument is not a one-key object")
    (kind, value), = arg.items()
    if kind == _ONE_TENSOR:
        return [_name(_dict(value, where, kind).get("name"), where, "a tensor argument's name")]
    if kind in _MANY_TENSORS:
        return [_name(_dict(v, where, kind).get("name"), where, "a tensor argument's name")
                for v in _list(value, where, kind)]
    if kind == "as_optional_tensors":
        out = []
        for v in _list(value, where, kind):
            if isinstance(v, dict) and _ONE_TENSOR in v:
                out += _arg_names(v, where)
        return out
    if kind in _SYM:
        v = _dict(value, where, kind)
        return [_name(v["as_name"], where, "a symbolic argument's name")] if "as_name" in v else []
    if kind in _MANY_SYM:
        return [n for v in _list(value, where, kind) for n in _arg_names({kind[:-1]: v}, where)]
    if kind == "as_custom_obj":
        return [_name(_dict(value, where, kind).get("name"), where, "a custom object's name")]
    return []  # constants, graphs (get_attr: not drawn), strings (a lowered module's placeholder)


def _tensor_meta(meta, where: str, what: str) -> TensorMeta:
    meta = _dict(meta, where, what)
    dtype = meta.get("dtype")
    if type(dtype) is not int or dtype not in DTYPES:
        raise FormatError(f"{where}: {what} has unknown dtype {str(dtype)[:20]}")
    dims = []
    for size in _list(meta.get("sizes"), where, f"{what} sizes", MAX_RANK):
        size = _dict(size, where, f"{what} size")
        if type(size.get("as_int")) is int:
            dims.append(size["as_int"])
            continue
        expr = size.get("as_expr")
        if not isinstance(expr, dict):
            raise FormatError(f"{where}: {what} has a size that is neither an int nor an expression")
        hint = expr.get("hint")
        if isinstance(hint, dict) and type(hint.get("as_int")) is int:
            dims.append(hint["as_int"])
        else:
            dims.append(_text(expr.get("expr_str"), where, f"{what} size expression")[:200])
    name, size = DTYPES[dtype]
    return TensorMeta(dims, name, size)


class _GraphReader:
    """One serialized graph (`graph_module.graph`) -> JsonProgram nodes."""

    def __init__(self, program: dict, where: str, handles: dict, refusals: dict, delegate_of, upstream: bool,
                 ops_only: bool = False):
        self.where = where
        self.ops_only = ops_only  # leave out what only a drawing uses: the nodes' inputs and tensor metadata
        gm = _dict(_dict(program, where, "the program").get("graph_module"), where, "graph_module")
        self.graph = _dict(gm.get("graph"), where, "graph_module.graph")
        self.tensors = _dict(self.graph.get("tensor_values", {}), where, "tensor_values")
        self.handles, self.refusals, self.delegate_of, self.upstream = handles, refusals, delegate_of, upstream
        self.stacks: dict[str, dict | None] = {}
        signature = _dict(gm.get("signature", {}), where, "signature")
        self.user_inputs = set()
        for spec in _list(signature.get("input_specs", []), where, "input_specs"):
            spec = _dict(spec, where, "an input spec")
            if "user_input" in spec:
                arg = _dict(_dict(spec["user_input"], where, "a user input").get("arg"), where, "a user input")
                self.user_inputs.update(_arg_names(arg, where))

    def val(self, name: str):
        if self.ops_only:
            return None
        meta = self.tensors.get(name)
        return _tensor_meta(meta, self.where, f"tensor {name[:80]!r}") if meta is not None else None

    def read(self) -> JsonProgram:
        nodes: list[JsonNode] = []
        for arg in _list(self.graph.get("inputs"), self.where, "graph inputs"):
            for name in _arg_names(arg, self.where):
                nodes.append(JsonNode(name=name, op="placeholder", val=self.val(name)))
        for raw in _list(self.graph.get("nodes"), self.where, "graph nodes"):
            nodes += self._node(raw)
        outputs = []
        for arg in _list(self.graph.get("outputs"), self.where, "graph outputs"):
            names = _arg_names(arg, self.where)
            outputs.append(names[0] if len(names) == 1 and next(iter(arg)) in (_ONE_TENSOR, *_SYM) else None)
        nodes.append(JsonNode(name="output", op="output", outputs=outputs))
        for node in nodes:  # debug handles are restored by node name, as the full reader restores them
            node.debug_handle = self.handles.get(node.name)
        return JsonProgram(nodes, self.user_inputs, self.where)

    def _node(self, raw) -> list[JsonNode]:
        raw = _dict(raw, self.where, "a node")
        serialized = raw.get("name")
        at = f"{self.where}: node {str(serialized)[:80]!r}"
        target = check_target_form(raw.get("target"), at)
        meta = _dict(raw.get("metadata") or {}, at, "metadata")
        inputs = []
        raw_inputs = _list(raw.get("inputs"), at, "inputs")
        for item in () if self.ops_only else raw_inputs:
            for name in _arg_names(_dict(item, at, "an input").get("arg"), at):
                if name not in inputs:
                    inputs.append(name)
        outputs = _list(raw.get("outputs"), at, "outputs")
        trace = _text(meta.get("stack_trace"), at, "stack_trace")
        text = _text(meta.get("nn_module_stack"), at, "nn_module_stack")
        if text not in self.stacks:  # the nodes of one module share their text: parsed once, shared
            self.stacks[text] = parse_module_stack(text, at)
        stack = self.stacks[text]
        fn = _text(meta.get("torch_fn"), at, "torch_fn")
        common = {"stack_trace": trace, "module_stack": stack, "torch_fn": tuple(fn.split(";")) if fn else None}
        node = JsonNode(name="", op="call_function", target=target, written=raw["target"], inputs=inputs, **common)
        if target == DELEGATE_TARGET:
            node.delegate = self.delegate_of(raw_inputs, at)
            for item in () if self.ops_only else raw_inputs[1:]:
                arg = _dict(item, at, "an input").get("arg")
                names = _arg_names(arg, at)
                node.operands.append(names[0] if len(names) == 1 and _ONE_TENSOR in arg else None)
        hop = target.startswith("torch.ops.higher_order.")
        single = len(outputs) == 1 and isinstance(outputs[0], dict)
        kind = next(iter(outputs[0]), "") if single else ""
        getitems: list[tuple[str, object, int]] = []  # (name, value, index in the node's results)
        # torch's schema defaults the flag to False: a higher-order op's one result is then a 1-tuple
        if hop and not raw.get("is_hop_single_tensor_return", False) and kind in (_ONE_TENSOR, *_SYM):
            names = _arg_names(outputs[0], at)
            if len(names) != 1:
                raise Unsupported(f"{at}: a higher-order op's single result that is not one value")
            node.name = _name(serialized, at, "name")
            getitems = [(names[0], self.val(names[0]), 0)]
        elif single and _ONE_TENSOR in outputs[0]:
            node.name = _arg_names(outputs[0], at)[0]
            node.val = self.val(node.name)
        elif single and any(k in outputs[0] for k in _SYM):
            names = _arg_names(outputs[0], at)
            if not names:
                raise Unsupported(f"{at}: a symbolic result without a name")
            node.name = names[0]
        elif (single and "as_none" in outputs[0]) or not outputs:
            raise Unsupported(f"{at}: a node without a result")  # torch renames it; not mirrored here
        else:
            node.name = _name(serialized, at, "name")
            items = _list(outputs[0].get("as_tensors"), at, "as_tensors") if single and "as_tensors" in outputs[0] \
                else outputs
            for index, item in enumerate(items):
                item = _dict(item, at, "an output")
                if "name" in item and len(item) == 1:
                    item = {_ONE_TENSOR: item}
                kind = next(iter(item), "")
                if kind in (_ONE_TENSOR, *_SYM):
                    name = _arg_names(item, at)
                    if name:
                        getitems.append((name[0], self.val(name[0]), index))
                elif kind != "as_none":
                    raise Unsupported(f"{at}: an output of kind {kind!r}")
        node.serialized = serialized if isinstance(serialized, str) else ""
        if self.upstream:
            node.own_handle = self._handle(meta, at)
            if node.own_handle is not None:  # the full reader puts it on the node of that name
                self.handles[node.serialized] = node.own_handle
        node.refusal = self.refusals.get(node.name)
        if getitems:
            node.val = [v for _, v, _ in getitems]
        out = [node]
        for name, val, index in getitems:
            out.append(JsonNode(name=name, op="call_function", target=GETITEM, inputs=[node.name], val=val,
                                index=index, **common))
        return out

    def _handle(self, meta: dict, at: str):
        handle = meta.get("debug_handle")
        if handle is None:
            return None
        if not (isinstance(handle, str) and handle.isascii() and handle.isdigit() and len(handle) < 10):
            raise FormatError(f"{at}: debug handle {str(handle)[:40]!r} is not an integer")
        return int(handle)


def _handle_table(table, where: str) -> dict:
    table = _dict(table or {}, where, "debug_handles")
    top = _dict(table.get("", {}), where, "debug_handles of the top graph")
    for name, h in top.items():
        if not (type(h) is int or (isinstance(h, list) and all(type(x) is int for x in h))):
            raise FormatError(f"{where}: debug handle of node {str(name)[:80]!r} is not an int or a list of ints")
    return top


def _refusal_table(table, where: str) -> dict:
    top = _dict(_dict(table or {}, where, "delegation_refusals").get("", {}), where, "delegation_refusals")
    for name, r in top.items():
        if not (isinstance(r, list) and len(r) == 4 and all(isinstance(x, str) and len(x) <= 4000 for x in r)):
            raise FormatError(f"{where}: delegation refusal of node {str(name)[:80]!r} is not "
                              "[backend, category, reason, hint] (short strings)")
    return top


def etlab_program(docs: list, index: int, where: str, depth: int = 0) -> JsonProgram:
    """Program `index` of an etlab ETRecord's `programs` list (its delegates' originals read too)."""
    if depth > MAX_NESTED_DELEGATES:
        raise FormatError(f"{where}: delegates nested more than {MAX_NESTED_DELEGATES} deep")
    if type(index) is not int or not 0 <= index < len(docs):
        raise FormatError(f"{where}: refers to program {index!r}, which the file does not hold")
    at = f"{where}: program {index}"
    doc = _dict(docs[index], at, "the program")
    delegates = {}
    for d in _list(doc.get("delegates", []), at, "delegates"):
        d = _dict(d, at, "a delegate entry")
        if not all(isinstance(d.get(k), str) for k in ("graph", "attr", "backend_id")):
            raise FormatError(f"{at}: a delegate entry lacks graph / attr / backend_id")
        child = d.get("original_module")
        if type(child) is not int or child <= index:
            raise FormatError(f"{at}: delegate {d['attr'][:80]!r} refers to program {str(child)[:20]}")
        if d["graph"] == "":
            delegates[f"{d['attr']}-{d['backend_id']}"] = d

    def delegate_of(inputs: list, node_at: str) -> Delegate:
        first = inputs[0].get("arg") if inputs and isinstance(inputs[0], dict) else None
        key = first.get("as_string") if isinstance(first, dict) else None
        d = delegates.get(key) if isinstance(key, str) else None
        if d is None:
            raise FormatError(f"{node_at}: the delegate call's lowered module {str(key)[:80]!r} is not in the file")
        return Delegate(d["attr"], d["backend_id"], etlab_program(docs, d["original_module"], where, depth + 1))

    reader = _GraphReader(doc.get("export"), at, _handle_table(doc.get("debug_handles"), at),
                          _refusal_table(doc.get("delegation_refusals"), at), delegate_of, upstream=False)
    return reader.read()


def upstream_program(program, where: str, depth: int = 0, *, ops_only: bool = False) -> JsonProgram:
    """An upstream ETRecord program's JSON (lowered modules inlined as JSON strings, read too).
    `ops_only`: the nodes with their names, targets, handles, metadata and delegates, without the
    inputs (and a delegate call's operands) and tensor metadata, which only a drawing uses and which
    are most of a node's JSON: what the Inspector's op table reads (`_upstream_json.program_ops`),
    in about two thirds of the time."""
    if depth > MAX_NESTED_DELEGATES:
        raise FormatError(f"{where}: delegates nested more than {MAX_NESTED_DELEGATES} deep")

    def delegate_of(inputs: list, node_at: str) -> Delegate:
        first = inputs[0] if inputs and isinstance(inputs[0], dict) else {}
        arg = first.get("arg")
        text = arg.get("as_string") if isinstance(arg, dict) else None
        attr = first.get("name")
        if not isinstance(text, str) or not isinstance(attr, str) or not attr.isidentifier() or len(attr) > 200:
            raise FormatError(f"{node_at}: a delegate call that does not start with its lowered module")
        try:
            lowered = json.loads(text)
        except (ValueError, RecursionError):
            raise FormatError(f"{node_at}: lowered module {attr!r} is not valid JSON") from None
        if not isinstance(lowered, dict) or not isinstance(lowered.get("backend_id"), str) or \
                not re.fullmatch(r"[A-Za-z0-9_]{1,100}", lowered["backend_id"]):
            raise FormatError(f"{node_at}: lowered module {attr!r} has no plain backend id")
        original = upstream_program(lowered.get("original_module"), f"{where}: lowered module {attr!r}", depth + 1,
                                    ops_only=ops_only)
        return Delegate(attr, lowered["backend_id"], original)

    return _GraphReader(program, where, {}, {}, delegate_of, upstream=True, ops_only=ops_only).read()
