"""Makes a torch.export JSON program from a file safe to hand to torch's deserializer.

torch's deserializer trusts its input in ways a file from elsewhere must not be trusted:
- symbolic-shape expressions go through `sympy.sympify`, which evaluates Python;
- `guards_code` is compiled into a function when the program is unlifted;
- a node's target may name any attribute of `torch`, `math` or `operator`;
- custom objects are unpickled.

- node, argument and parameter names become Python identifiers and attribute paths in the code
  torch.fx generates (and compiles) for the graph;

So before deserializing, every expression must be a plain sympy expression over shape symbols,
every value name a plain (dotted) identifier and every parameter or module path
a dotted path of letters, digits, '_' and '-', guards and non-essential metadata are dropped, every
target must be a registered operator (`torch.ops.<namespace>.<op>.<overload>`, a higher-order
operator) or one of a fixed set of Python scalar functions, and custom objects are refused.
Tensor metadata must describe a dense CPU tensor: strided layout (sparse tensors are refused),
a known dtype, non-negative sizes, strides and storage offset; layout and device arguments too.

Replaying a graph (`check_replayable`, before any node runs) is stricter: every target must be
a pure operator on etlab's allowlist (`etlab.ops`), so a recorded graph cannot reach
`aten::from_file`, `aten::save`, an in-place `fill_` or anything else with an effect.
"""

from __future__ import annotations

import importlib
import json
import re

import torch

from etlab import ops
from etlab.errors import FormatError

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_OP_TARGET = re.compile(rf"torch\.ops\.({_IDENT})\.({_IDENT})(?:\.({_IDENT}))?")
# Python callables torch.export puts in graphs for symbolic integer arithmetic.
SCALAR_TARGETS = frozenset({
    *(f"_operator.{n}" for n in ("getitem", "add", "sub", "mul", "floordiv", "truediv", "mod", "pow", "neg",
                                 "pos", "abs", "eq", "ne", "lt", "le", "gt", "ge", "and_", "or_", "xor", "not_",
                                 "invert", "lshift", "rshift")),
    *(f"math.{n}" for n in ("ceil", "floor", "trunc", "sqrt")),
    *(f"torch.{n}" for n in ("sym_int", "sym_float", "sym_max", "sym_min", "sym_not", "sym_ite", "sym_sqrt",
                             "sym_sum", "_sym_sqrt")),
})
# Node metadata worth keeping; the rest (source_fn_stack, from_node, custom) is dropped.
KEPT_METADATA = ("stack_trace", "nn_module_stack", "torch_fn")

# sympy's srepr/str vocabulary for shape expressions; anything else in an expression is refused.
_EXPR_NAMES = frozenset({
    "Symbol", "Integer", "Float", "Rational", "Add", "Mul", "Pow", "Max", "Min", "Abs", "Mod", "floor", "ceiling",
    "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "StrictLessThan", "StrictGreaterThan", "LessThan", "GreaterThan",
    "Equality", "Unequality", "And", "Or", "Not", "Piecewise", "ExprCondPair", "oo", "zoo", "nan", "Infinity",
    "NegativeInfinity", "int_oo", "IntInfinity", "NegativeIntInfinity", "true", "false", "True", "False",
    "BooleanTrue", "BooleanFalse", "Half", "One", "Zero", "NegativeOne", "sqrt",
    "FloorDiv", "ModularIndexing", "Where", "PythonMod", "CleanDiv", "CeilToInt", "FloorToInt", "CeilDiv",
    "LShift", "RShift", "PowByNatural", "FloatPow", "FloatTrueDiv", "IntTrueDiv",
    "IsNonOverlappingAndDenseIndicator", "TruncToFloat", "TruncToInt", "RoundToInt", "RoundDecimal", "ToFloat",
    "Identity",
    # assumptions given as keywords in Symbol(...)
    "positive", "negative", "integer", "real", "nonnegative", "nonpositive", "finite", "commutative", "zero",
    "nonzero", "even", "odd",
})
_SYMBOL_NAME = re.compile(r"[a-z]{1,4}\d{1,9}")
_EXPR_TOKEN = re.compile(r"\s+|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<num>\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)"
                         r"|'(?P<str>[A-Za-z0-9_]*)'|(?P<op>\*\*|//|==|!=|<=|>=|[-+*/%(),<>=~&|])")
_MAX_EXPR = 4096
_SAFE_NAME = re.compile(r"[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)*")
_SAFE_SPEC_TEXT = re.compile(r"[A-Za-z0-9_. \-]*")
# graph tables keyed by value / symbol names
_NAME_KEYED = frozenset({"tensor_values", "sym_int_values", "sym_bool_values", "sym_float_values",
                         "custom_obj_values", "range_constraints", "treespec_namedtuple_fields"})
# characters Python (or str.splitlines) treats as line breaks, other than "\n": kept out of metadata
_LINE_BREAKS = re.compile("[\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


# A parameter's, buffer's or module's path as the model names it: nn.Module.add_module takes any name
# without a dot, and model libraries use '-' (torchvision's RegNet: `trunk_output.block1.block1-0`). These
# only ever reach torch.fx's generated code inside a quoted getattr(..., "name"), so a '-' is harmless
# there; quotes, backslashes, spaces and line breaks stay refused.
_SAFE_PATH = re.compile(r"[A-Za-z0-9_\-]+(?:\.[A-Za-z0-9_\-]+)*")
PATH_KEYS = frozenset({"fqn", "parameter_name", "buffer_name", "tensor_constant_name", "custom_obj_name"})


def check_name(value, where: str, what: str) -> None:
    """A value or argument name: a plain (dotted) Python identifier, as torch.fx generates code with it."""
    if isinstance(value, str) and value and not _SAFE_NAME.fullmatch(value):
        raise FormatError(f"{where}: {what} {value[:80]!r} is not a plain (dotted) identifier")


def check_path(value, where: str, what: str) -> None:
    """A parameter/buffer/module path: dotted names of letters, digits, '_' and '-'."""
    if isinstance(value, str) and value and not _SAFE_PATH.fullmatch(value):
        raise FormatError(f"{where}: {what} {value[:80]!r} is not a plain dotted path of letters, digits, '_' and '-'")


def _check_spec(text, where: str, depth: int = 0) -> None:
    """A pytree spec (JSON, with JSON strings nested as contexts) holding only plain names."""
    if depth > 32:
        raise FormatError(f"{where}: a pytree spec is nested too deeply")
    try:
        data = json.loads(text)
    except (ValueError, TypeError, RecursionError):
        raise FormatError(f"{where}: a pytree spec is not valid JSON") from None
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
            stack.extend(item.keys())
        elif isinstance(item, str):
            if item[:1] in ("[", "{") or item == "null":
                _check_spec(item, where, depth + 1)
            elif not _SAFE_SPEC_TEXT.fullmatch(item):
                raise FormatError(f"{where}: a pytree spec holds text {item[:80]!r} that is not a plain name")


def check_expr(expr: str, where: str) -> None:
    """Refuses anything but names, numbers and operators of a shape expression."""
    if not isinstance(expr, str) or len(expr) > _MAX_EXPR:
        raise FormatError(f"{where}: a symbolic expression is not a string of at most {_MAX_EXPR} characters")
    pos, depth = 0, 0
    while pos < len(expr):
        m = _EXPR_TOKEN.match(expr, pos)
        if m is None:
            raise FormatError(f"{where}: symbolic expression {expr[:80]!r} has an unexpected character at {pos}")
        name, text, op = m.group("name"), m.group("str"), m.group("op")
        if name is not None and name not in _EXPR_NAMES and not _SYMBOL_NAME.fullmatch(name):
            raise FormatError(f"{where}: symbolic expression {expr[:80]!r} uses unknown name {name!r}")
        if text is not None and not _SYMBOL_NAME.fullmatch(text):
            raise FormatError(f"{where}: symbolic expression {expr[:80]!r} names symbol {text!r}")
        if op == "(":
            depth += 1
            if depth > 64:
                raise FormatError(f"{where}: symbolic expression nested too deeply")
        elif op == ")":
            depth -= 1
        pos = m.end()


# ATen operators whose names are dunders (transformers' attention masks use aten.__and__.Tensor);
# any other "__" name stays refused, so a target never reaches a Python attribute.
_DUNDER_OPS = frozenset({"__and__", "__or__", "__xor__", "__lshift__", "__rshift__"})


def check_target(target, where: str) -> None:
    """Checks that a JSON graph node's target names an operator registered in this process
    (torch.ops.<ns>.<op>.<overload>) or one of the known scalar functions (operator.add, ...); a FormatError
    naming `where` otherwise, so a hostile record cannot name an arbitrary callable."""
    if not isinstance(target, str):
        raise FormatError(f"{where}: a node target is not a string")
    if target in SCALAR_TARGETS:
        return
    m = _OP_TARGET.fullmatch(target)
    if m is None or any(part.startswith("__") and part not in _DUNDER_OPS for part in m.groups() if part):
        raise FormatError(f"{where}: unknown operator {target!r}")
    if resolve_operator(target) is None:
        raise FormatError(f"{where}: unknown operator {target!r} (not registered in this process)")


def resolve_operator(target: str):
    """The OpOverload or HigherOrderOperator `torch.ops.<ns>.<op>[.<overload>]` names, or None."""
    m = _OP_TARGET.fullmatch(target)
    if m is None:
        return None
    ns, op, overload = m.groups()
    try:
        if ns == "higher_order":
            found = getattr(torch.ops.higher_order, op) if overload is None else None
            return found if isinstance(found, torch._ops.HigherOrderOperator) else None
        if overload is None:
            return None
        if ns == "quantized_decomposed":  # torch registers these ops only when this module is imported
            importlib.import_module("torch.ao.quantization.fx._decomposed")
        packet = getattr(getattr(torch.ops, ns), op)
        found = getattr(packet, overload)
    except (AttributeError, RuntimeError):
        return None
    return found if isinstance(found, torch._ops.OpOverload) else None


# torch.export's serialized enums (torch._export.serde.schema): Layout.Strided and the dtypes it knows.
_STRIDED_LAYOUT = 7
_KNOWN_DTYPES = frozenset({*range(1, 14), 28, 29, 30, 31, 32, 33, 34, 35})
_DEVICES = frozenset({"cpu", "meta"})
_TENSOR_META_KEYS = frozenset({"dtype", "sizes", "strides", "layout", "device"})


def _nonnegative_ints(items, where: str, what: str) -> None:
    for item in items if isinstance(items, list) else [items]:
        if isinstance(item, dict) and "as_int" in item:
            v = item["as_int"]
            if type(v) is not int or v < 0:
                raise FormatError(f"{where}: {what} {v!r} is not a non-negative integer")


def _member(value, allowed) -> bool:
    """`value in allowed`, False for a value that cannot be one (a list where a name belongs)."""
    try:
        return value in allowed
    except TypeError:  # unhashable: a JSON list or object
        return False


def check_tensor_meta(meta: dict, where: str) -> None:
    """A serialized TensorMeta: strided, known dtype, CPU, non-negative sizes/strides/offset."""
    if meta.get("layout") != _STRIDED_LAYOUT:
        raise FormatError(f"{where}: layout {meta.get('layout')!r} is not strided; sparse and other layouts are not "
                          "supported")
    if not _member(meta.get("dtype"), _KNOWN_DTYPES):
        raise FormatError(f"{where}: dtype {meta.get('dtype')!r} is not a supported element type")
    device = meta.get("device")
    if not isinstance(device, dict) or not _member(device.get("type"), _DEVICES):
        raise FormatError(f"{where}: device {str(device)[:40]} is not the CPU")
    _nonnegative_ints(meta.get("sizes"), where, "size")
    _nonnegative_ints(meta.get("strides"), where, "stride")
    _nonnegative_ints(meta.get("storage_offset"), where, "storage offset")


def _check_argument(arg: dict, where: str) -> None:
    if "as_layout" in arg and arg["as_layout"] != _STRIDED_LAYOUT:
        raise FormatError(f"{where}: layout argument {arg['as_layout']!r} is not strided")
    device = arg.get("as_device")
    if isinstance(device, dict) and not _member(device.get("type"), _DEVICES):
        raise FormatError(f"{where}: device argument {str(arg['as_device'])[:40]} is not the CPU")
    if "as_scalar_type" in arg and not _member(arg["as_scalar_type"], _KNOWN_DTYPES):
        raise FormatError(f"{where}: dtype argument {arg['as_scalar_type']!r} is not a supported element type")


def sanitize_program(doc, where: str) -> None:
    """Checks (and trims, in place) one torch.export JSON program; raises FormatError if unsafe."""
    if not isinstance(doc, dict) or not isinstance(doc.get("graph_module"), dict):
        raise FormatError(f"{where}: not a torch.export program (no graph_module)")
    doc["guards_code"] = []
    doc["graph_module"]["metadata"] = {}
    _walk(doc, where, 0)


def _walk(obj, where: str, depth: int) -> None:
    """Checks one JSON value and what it holds. Only lists and dicts are descended into (a scalar
    holds nothing to check): a program has a scalar for about every other value, and a call per
    scalar was a tenth of an ETRecord save."""
    if depth > 200:
        raise FormatError(f"{where}: the program is nested too deeply")
    if isinstance(obj, list):
        for item in obj:
            if isinstance(item, (dict, list)):
                _walk(item, where, depth + 1)
        return
    if not isinstance(obj, dict):
        return
    if "as_custom_obj" in obj or obj.get("custom_obj_values"):
        raise FormatError(f"{where}: the program holds a custom (script) object, which an ETRecord cannot load")
    if "expr_str" in obj:
        check_expr(obj["expr_str"], where)
    if _TENSOR_META_KEYS <= obj.keys():
        check_tensor_meta(obj, where)
    _check_argument(obj, where)
    if "as_operator" in obj and obj["as_operator"] is not None:
        check_target(obj["as_operator"], where)
    if "target" in obj and "inputs" in obj and "outputs" in obj:  # a node
        check_target(obj["target"], f"{where}: node {obj.get('name')!r}")
        meta = obj.get("metadata")
        if isinstance(meta, dict):
            obj["metadata"] = {k: _LINE_BREAKS.sub(" ", v) for k, v in meta.items()
                               if k in KEPT_METADATA and isinstance(v, str)}
    for key, value in obj.items():
        if key in PATH_KEYS:
            check_path(value, where, key)
        elif key in ("name", "as_name") or key.endswith("_name"):
            check_name(value, where, key)
        elif key == "forward_arg_names" and isinstance(value, list):
            for arg in value:
                check_name(arg, where, "forward argument name")
        elif key in _NAME_KEYED and isinstance(value, dict):
            for name in value:
                check_name(name, where, f"{key} key")
            if key == "tensor_values":
                for name, meta in value.items():
                    if not isinstance(meta, dict):
                        raise FormatError(f"{where}: tensor {name!r} has no metadata")
                    check_tensor_meta(meta, f"{where}: tensor {name!r}")
        elif key in ("in_spec", "out_spec") and isinstance(value, str):
            _check_spec(value, where)
        if isinstance(value, (dict, list)):
            _walk(value, where, depth + 1)


# -- replay ----------------------------------------------------------------------------------------------

def _python_scalar_function(target) -> bool:
    """One of SCALAR_TARGETS (operator.add, math.ceil, torch.sym_max, ...), by identity."""
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__name__", "")
    qualified = f"{'_operator' if module == 'operator' else module}.{name}"
    return qualified in SCALAR_TARGETS and callable(target)


def check_replayable(gm, where: str, *, extra_targets=()) -> None:
    """Raises FormatError naming the first node whose target graph replay may not run.

    Allowed: pure operators on etlab.ops's allowlist, torch.cond, the Python scalar functions of
    symbolic-shape arithmetic, and `extra_targets` (the caller's own, e.g. delegate calls). Also
    every tensor a node is recorded to produce must be a dense tensor of a supported dtype.
    Checks the graph and every subgraph (cond branches) under it."""
    import operator

    for path, sub in gm.named_modules():
        if not isinstance(sub, torch.fx.GraphModule):
            continue
        for node in sub.graph.nodes:
            at = f"{where}: node {node.name!r}" + (f" in {path!r}" if path else "")
            if node.op == "call_function":
                target = node.target
                ok = (target is operator.getitem or target in extra_targets or _python_scalar_function(target)
                      or ops.allows_replay(target))
                if not ok:
                    name = getattr(target, "__name__", None) if not isinstance(target, torch._ops.OpOverload) \
                        else str(target)
                    raise FormatError(f"{at}: operator {name or target!r} is not one etlab replays (only pure "
                                      "operators of etlab.ops's allowlist run on a recorded graph)")
            elif node.op not in ("placeholder", "output", "get_attr"):
                raise FormatError(f"{at}: {node.op} nodes are not replayed")
            check_replay_value(node.meta.get("val"), at)


def check_replay_value(value, where: str) -> None:
    """A tensor (or nested tuple/list of them) replay will hand to an operator: dense, supported dtype."""
    if isinstance(value, (list, tuple)):
        for v in value:
            check_replay_value(v, where)
        return
    if not isinstance(value, torch.Tensor):
        return
    if value.layout != torch.strided:
        raise FormatError(f"{where}: a {value.layout} tensor; only strided (dense) tensors are replayed")
    if value.dtype not in ops.SUPPORTED_DTYPES:
        raise FormatError(f"{where}: dtype {value.dtype} is not one etlab's kernels support")
