"""Reading upstream ExecuTorch's ETRecord layout, with the same checks as etlab's own.

Upstream's ETRecord (`executorch.devtools.etrecord`, 1.x) is a zip of:
- `ETRECORD_V0` (empty: the identifier);
- per program, under a base name (`exported_program`, `edge_dialect_exported_program/<method>`, the
  older single `edge_dialect_exported_program`, or `<module>/<method>` for `graph_map`): the
  program's torch.export JSON (with executorch's edge-op names and delegate calls), and
  `<base>_state_dict`, `<base>_constants`, `<base>_example_inputs`, each a `torch.save` zip;
- JSON maps `debug_handle_map`, `delegate_map`, `instruction_id_to_num_outs_map` (by method, keys
  as strings), `export_graph_id`;
- `torch.save` zips `reference_outputs` ({method: [outputs]}) and `representative_inputs` (a list).

Nothing here runs pickle code: the torch.save members go through `_torch_pickle` (tensors,
storages, plain containers and scalars only). Each program's JSON is translated into etlab's
program document (edge-op names to `torch.ops` names, debug handles out of the node metadata, each
delegate's lowered module, whose original program and tensors upstream inlines as a JSON string
with base64 parts, into a delegate entry) and then goes through `ProgramReader`: the same JSON
validator and operator checks as an etlab ETRecord, the same lazy rebuild, the same replay
allowlist. The Inspector's op table is read from the JSON directly, so it needs no rebuild.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re

import torch

from etlab.errors import FormatError
from etlab.etrecord._archive import UPSTREAM_IDENTIFIER, load_json
from etlab.etrecord._graph_check import SCALAR_TARGETS, check_target, resolve_operator
from etlab.etrecord._graphs import ProgramReader
from etlab.etrecord._named import named_data_doc, parse_upstream_named_data
from etlab.etrecord._torch_pickle import load_torch_bytes
from etlab.etrecord._values import TensorStore, TensorTable, encode_value
from etlab.facts.program_info import OpInfo
from etlab.facts.source import module_hierarchy

EDGE = "edge_dialect_exported_program"
ATEN = "exported_program"
MAPS = ("debug_handle_map", "delegate_map", "instruction_id_to_num_outs_map", "export_graph_id")
VALUES = ("reference_outputs", "representative_inputs")
PARTS = ("_state_dict", "_constants", "_example_inputs")
EDGE_OP_PREFIX = "executorch.exir.dialects.edge.ops."
DELEGATE_TARGET = "torch.ops.higher_order.executorch_call_delegate"
_SEGMENT = r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,199}"
_PROGRAM_NAME = re.compile(rf"{_SEGMENT}(?:/{_SEGMENT}){{0,3}}")
_MAX_NESTED_DELEGATES = 16


def is_upstream_entry(name: str) -> bool:
    """Whether an upstream ETRecord may hold an entry of this name (see the module docstring)."""
    if name == UPSTREAM_IDENTIFIER or name in MAPS or name in VALUES:
        return True
    for part in PARTS:
        if name.endswith(part):
            name = name[:-len(part)]
            break
    return bool(_PROGRAM_NAME.fullmatch(name)) and ".." not in name


def _base64(text, where: str, what: str) -> bytes:
    if not isinstance(text, str):
        raise FormatError(f"{where}: {what} is not a base64 string")
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise FormatError(f"{where}: {what} is not valid base64") from None


def _int_keys(mapping, where: str, what: str) -> dict:
    if not isinstance(mapping, dict):
        raise FormatError(f"{where}: {what} must be an object keyed by instruction id")
    out = {}
    for key, value in mapping.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and len(key) < 10):
            raise FormatError(f"{where}: {what}: key {str(key)[:40]!r} is not an instruction id")
        out[int(key)] = value
    return out


def _handles(value, where: str, what: str) -> list[int]:
    if type(value) is int:
        return [value]
    if isinstance(value, list) and all(type(h) is int for h in value):
        return list(value)
    raise FormatError(f"{where}: {what}: {str(value)[:60]} is not a debug handle or a list of them")


def _per_method(entries, name: str, where: str) -> dict | None:
    if name not in entries:
        return None
    data = load_json(entries, name, where)
    if not isinstance(data, dict) or not all(isinstance(m, str) for m in data):
        raise FormatError(f"{where}: {name!r} must be an object keyed by method name")
    return data


def debug_handle_map(entries, where: str) -> dict | None:
    maps = _per_method(entries, "debug_handle_map", where)
    if maps is None:
        return None
    return {m: {i: _handles(h, where, f"debug_handle_map[{m!r}]") for i, h in
                _int_keys(v, where, f"debug_handle_map[{m!r}]").items()} for m, v in maps.items()}


def delegate_map(entries, where: str) -> dict | None:
    maps = _per_method(entries, "delegate_map", where)
    if maps is None:
        return None
    out = {}
    for method, per in maps.items():
        what = f"delegate_map[{method!r}]"
        out[method] = {}
        for instruction, entry in _int_keys(per, where, what).items():
            if not (isinstance(entry, dict) and isinstance(entry.get("name"), str)
                    and isinstance(entry.get("delegate_map"), dict)):
                raise FormatError(f"{where}: {what}[{instruction}] lacks a backend name or a delegate map")
            dmap = {}
            for ident, handles in entry["delegate_map"].items():
                key = int(ident) if ident.isascii() and ident.isdigit() and len(ident) < 10 else ident
                dmap[key] = tuple(_handles(handles, where, what))
            out[method][instruction] = {"name": entry["name"], "delegate_map": dmap}
    return out


def num_outs_map(entries, where: str) -> dict | None:
    maps = _per_method(entries, "instruction_id_to_num_outs_map", where)
    if maps is None:
        return None
    out = {}
    for method, per in maps.items():
        out[method] = {}
        for instruction, n in _int_keys(per, where, f"instruction_id_to_num_outs_map[{method!r}]").items():
            if type(n) is not int or n < 0:  # upstream may record a list for a multi-output op
                if not (isinstance(n, list) and all(type(x) is int for x in n)):
                    raise FormatError(f"{where}: instruction_id_to_num_outs_map[{method!r}][{instruction}] "
                                      "is not a count")
                n = len(n)
            out[method][instruction] = n
    return out


def export_graph_id(entries, where: str) -> int | None:
    if "export_graph_id" not in entries:
        return None
    value = load_json(entries, "export_graph_id", where)
    if type(value) is not int:
        raise FormatError(f"{where}: export_graph_id is not an integer")
    return value


def torch_value(entries, name: str, where: str):
    return load_torch_bytes(entries[name], f"{where}: entry {name!r}") if name in entries else None


class DocumentBuilder:
    """Upstream programs -> etlab program documents (one list) sharing one tensor store."""

    def __init__(self, where: str, with_tensors: bool = True):
        self.where = where
        self.with_tensors = with_tensors  # False: only the op table (`ops`), no torch.save member is read
        self.store = TensorStore()
        self.docs: list[dict | None] = []
        self.ops_by_doc: dict[int, dict[int, list[OpInfo]]] = {}
        self._targets_ok: set[str] = set()
        self._op_types: dict[tuple[str, str], str] = {}
        self._hierarchies: dict[str, dict] = {}

    def add(self, program: dict, state_dict, constants, example_inputs, what: str, depth: int = 0) -> int:
        """Adds one program (and, first after it, its delegates' original programs); returns its index."""
        where = f"{self.where}: {what}"
        if depth > _MAX_NESTED_DELEGATES:
            raise FormatError(f"{where}: delegates nested more than {_MAX_NESTED_DELEGATES} deep")
        if not isinstance(program, dict) or not isinstance(program.get("graph_module"), dict) or \
                not isinstance(program["graph_module"].get("graph"), dict):
            raise FormatError(f"{where}: not a torch.export program (no graph_module.graph)")
        index = len(self.docs)
        self.docs.append(None)
        doc = {"export": program, "delegates": [], "debug_handles": {},
               "state_dict": self._tensors(state_dict, where, "state dict", params=True),
               "constants": self._tensors(constants, where, "constants", params=False),
               "example_inputs": None}
        if example_inputs is not None:
            if not (isinstance(example_inputs, tuple) and len(example_inputs) == 2):
                raise FormatError(f"{where}: example inputs are not an (args, kwargs) pair")
            try:
                doc["example_inputs"] = encode_value(example_inputs, self.store, f"{what} example inputs")
            except (TypeError, ValueError) as e:
                raise FormatError(f"{where}: example inputs: {e}") from None
        program.pop("dialect", None)  # upstream's older field; the verifiers list says the same
        # torch knows the ATen and training verifiers, not executorch's EDGE (whose checks, edge ops
        # with out-variant kernels, etlab's replay allowlist makes anyway)
        program["verifiers"] = ["ATEN" if program.get("verifiers") == ["ATEN"] else "TRAINING"]
        program["schema_version"] = {"major": torch._export.serde.schema.SCHEMA_VERSION[0],
                                     "minor": torch._export.serde.schema.SCHEMA_VERSION[1]}
        self.ops_by_doc[index] = self._translate_graph(program["graph_module"]["graph"], doc, where, depth)
        if self.with_tensors:  # (a rebuild) nodes of nested graphs (cond branches), non-finite floats
            _normalize(program["graph_module"], where)
        self.docs[index] = doc
        return index

    def _tensors(self, value, where: str, what: str, params: bool) -> list:
        if value is None:
            return []
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise FormatError(f"{where}: the {what} is not a dict keyed by name")
        out = []
        for name, t in value.items():
            if not isinstance(t, torch.Tensor):
                raise FormatError(f"{where}: {what}[{name!r}] is a {type(t).__name__}, not a tensor "
                                  "(custom objects are not loaded)")
            try:
                index = self.store.add(t, f"{what}[{name!r}]")
            except ValueError as e:
                raise FormatError(f"{where}: {e}") from None
            if params:
                out.append([name, index, isinstance(t, torch.nn.Parameter), bool(t.requires_grad)])
            else:
                out.append([name, index])
        return out

    def _translate_graph(self, graph: dict, doc: dict, where: str, depth: int) -> dict[int, list[OpInfo]]:
        nodes = graph.get("nodes")
        if not isinstance(nodes, list):
            raise FormatError(f"{where}: the graph has no node list")
        ops: dict[int, list[OpInfo]] = {}
        handles = {}
        for node in nodes:
            if not isinstance(node, dict) or not isinstance(node.get("target"), str) \
                    or not isinstance(node.get("name"), str):
                raise FormatError(f"{where}: a node without a name or target")
            written = target = node["target"]
            if target.startswith(EDGE_OP_PREFIX):
                target = node["target"] = "torch.ops." + target[len(EDGE_OP_PREFIX):]
            if target not in self._targets_ok:  # each distinct target checked once (an LSTM repeats a few)
                check_target(target, f"{where}: node {node['name'][:80]!r}")
                self._targets_ok.add(target)
            meta = node.get("metadata") if isinstance(node.get("metadata"), dict) else {}
            if target == DELEGATE_TARGET:
                self._translate_delegate(node, doc, where, depth)
            _tuple_outputs_as_getitems(node, target)
            handle = meta.get("debug_handle")
            if handle is None:
                continue
            if not (isinstance(handle, str) and handle.isascii() and handle.isdigit() and len(handle) < 10):
                raise FormatError(f"{where}: node {node['name'][:80]!r} has debug handle {str(handle)[:40]!r}, "
                                  "not an integer")
            handles[node["name"]] = int(handle)
            if target != "_operator.getitem":
                ops.setdefault(int(handle), []).append(self._op_info(node["name"], written, target, meta, where))
        if handles:
            doc["debug_handles"][""] = handles
        return ops

    def _op_info(self, name: str, written: str, target: str, meta: dict, where: str) -> OpInfo:
        """The node's OpInfo, read from its JSON. Its op type is what upstream's Inspector shows for
        the node it deserializes (the target's `__name__`): "aten.addmm.default" for an edge op,
        "scalar_tensor.default" for a plain torch op (upstream's edge graphs hold a few), "add" for
        operator.add."""
        op = self._op_types.get((written, target))
        if op is not None:
            pass
        elif written.startswith(EDGE_OP_PREFIX):
            op = written[len(EDGE_OP_PREFIX):]
        elif target in SCALAR_TARGETS:
            op = target.rpartition(".")[2]
        else:
            found = resolve_operator(target)
            if found is None:
                raise FormatError(f"{where}: node {name[:80]!r}: unknown operator {target[:120]!r}")
            op = found.name() if isinstance(found, torch._ops.HigherOrderOperator) else found.__name__
        self._op_types[(written, target)] = op
        trace = meta.get("stack_trace") if isinstance(meta.get("stack_trace"), str) else None
        text = meta.get("nn_module_stack")
        hierarchy = self._hierarchies.get(text) if isinstance(text, str) else None
        if hierarchy is None:  # nodes of one module share their stack text: parsed once per text
            hierarchy = module_hierarchy(_nn_module_stack(text, where))
            if isinstance(text, str) and hierarchy is not None:
                self._hierarchies[text] = hierarchy
        return OpInfo(name, op, trace, dict(hierarchy) if hierarchy is not None else None)

    def _translate_delegate(self, node: dict, doc: dict, where: str, depth: int) -> None:
        """Upstream inlines the lowered module as a JSON string argument; etlab's document keeps it
        as a delegate entry and the argument as the `<attr>-<backend>` placeholder its reader resolves."""
        inputs = node.get("inputs")
        if not (isinstance(inputs, list) and inputs and isinstance(inputs[0], dict)
                and isinstance(inputs[0].get("arg"), dict) and isinstance(inputs[0]["arg"].get("as_string"), str)
                and isinstance(inputs[0].get("name"), str)):
            raise FormatError(f"{where}: delegate call {node['name'][:80]!r} does not start with its lowered module")
        attr = inputs[0]["name"]
        if not attr.isidentifier() or attr.startswith("_") or len(attr) > 200:
            raise FormatError(f"{where}: lowered module name {attr[:80]!r} is not a plain identifier")
        try:
            lowered = json.loads(inputs[0]["arg"]["as_string"])
        except (ValueError, RecursionError):
            raise FormatError(f"{where}: lowered module {attr!r} is not valid JSON") from None
        if not isinstance(lowered, dict) or not isinstance(lowered.get("backend_id"), str) or \
                not re.fullmatch(r"[A-Za-z0-9_]{1,100}", lowered["backend_id"]):
            raise FormatError(f"{where}: lowered module {attr!r} has no plain backend id")
        at = f"lowered module {attr!r}"
        specs = lowered.get("compile_specs") or []
        if not isinstance(specs, list) or not all(isinstance(s, dict) and isinstance(s.get("key"), str)
                                                  for s in specs):
            raise FormatError(f"{where}: {at} has malformed compile specs")
        if not self.with_tensors:
            self.add(lowered.get("original_module"), None, None, None, f"{at} original program", depth + 1)
            return
        child = self.add(lowered.get("original_module"),
                         load_torch_bytes(_base64(lowered.get("original_state_dict"), where, f"{at} state dict"),
                                          f"{where}: {at} state dict"),
                         load_torch_bytes(_base64(lowered.get("original_constants"), where, f"{at} constants"),
                                          f"{where}: {at} constants"),
                         None, f"{at} original program", depth + 1)
        entry = {
            "graph": "", "attr": attr, "backend_id": lowered["backend_id"],
            "processed": self.store.add_bytes(_base64(lowered.get("processed_bytes"), where, f"{at} bytes")),
            "compile_specs": [[s["key"], self.store.add_bytes(_base64(s.get("value"), where, f"{at} compile spec"))]
                              for s in specs],
            "debug_handle_map": [],  # upstream keeps it in the top-level delegate_map only
            "original_module": child,
        }
        named = named_data_doc(parse_upstream_named_data(lowered.get("named_data_store"), f"{where}: {at}"),
                               self.store, f"{where}: {at}")
        if named is not None:
            entry["named_data"] = named
        doc["delegates"].append(entry)
        inputs[0] = {"name": "", "arg": {"as_string": f"{attr}-{lowered['backend_id']}"}}
        for item in inputs[1:]:  # upstream names the operands delegate_arg_<i>: positional, as etlab's calls are
            name = item.get("name") if isinstance(item, dict) else None
            if isinstance(name, str) and name.startswith("delegate_arg_"):
                item["name"] = ""

    def ops(self) -> dict[int, list[OpInfo]]:
        """Debug handle -> nodes of the programs added (a program, then its delegates' originals)."""
        out: dict[int, list[OpInfo]] = {}
        for index in sorted(self.ops_by_doc):
            for handle, infos in self.ops_by_doc[index].items():
                out.setdefault(handle, []).extend(infos)
        return out

    def reader(self) -> ProgramReader:
        tensors = TensorTable(self.store.index_json(), bytearray(self.store.blob()), self.where)
        return ProgramReader(self.docs, tensors, self.where)


def _tuple_outputs_as_getitems(node: dict, target: str) -> None:
    """Upstream's schema writes a higher-order op's tuple result (an XNNPACK delegate call's) as one
    `as_tensors` output without `is_hop_single_tensor_return`; torch 2.13's reader takes the missing
    flag for a one-value result and fails. The flag set, it reads the tuple as getitems, as written."""
    outputs = node.get("outputs")
    if (target.startswith("torch.ops.higher_order.") and "is_hop_single_tensor_return" not in node
            and isinstance(outputs, list) and len(outputs) == 1 and isinstance(outputs[0], dict)
            and "as_tensors" in outputs[0]):
        node["is_hop_single_tensor_return"] = True


_NON_FINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}


def _normalize(obj, where: str, depth: int = 0):
    """Edge-op names in nested graphs to torch.ops names; non-finite floats (upstream writes bare
    JSON `-Infinity`) to the strings torch's schema uses. Returns the (possibly replaced) value."""
    if depth > 200:
        raise FormatError(f"{where}: the program is nested too deeply")
    if isinstance(obj, float) and not math.isfinite(obj):
        return "NaN" if math.isnan(obj) else _NON_FINITE[obj]
    if isinstance(obj, list):
        for i, item in enumerate(obj):
            obj[i] = _normalize(item, where, depth + 1)
    elif isinstance(obj, dict):
        target = obj.get("target")
        if isinstance(target, str) and target.startswith(EDGE_OP_PREFIX) and "inputs" in obj:
            obj["target"] = "torch.ops." + target[len(EDGE_OP_PREFIX):]
        for key, value in obj.items():
            obj[key] = _normalize(value, where, depth + 1)
    return obj


def _nn_module_stack(text, where: str) -> dict | None:
    """torch.export's serialized nn_module_stack ("key,path,type;...", commas inside brackets kept)."""
    if not isinstance(text, str) or not text:
        return None
    out = {}
    for item in text.split(";"):
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


def program_bases(entries: dict[str, bytes]) -> list[str]:
    """Base names of the programs an upstream ETRecord holds (entries that are not parts or maps)."""
    return [n for n in entries if n != UPSTREAM_IDENTIFIER and n not in MAPS and n not in VALUES
            and not n.endswith(PARTS)]


def program_ops(entries: dict[str, bytes], base: str, where: str) -> dict[int, list[OpInfo]]:
    """The op table of one program (and its delegates' original programs), read from its JSON only:
    what the Inspector needs, without reading a tensor or rebuilding a graph."""
    builder = DocumentBuilder(where, with_tensors=False)
    builder.add(load_json(entries, base, where), None, None, None, f"program {base!r}")
    return builder.ops()


class UpstreamLoader:
    """Rebuilds an upstream ETRecord's programs on first use, by base name: its torch.save members
    are read (by `_torch_pickle`) and its JSON translated and validated only then."""

    def __init__(self, entries: dict[str, bytes], where: str):
        self.entries, self.where = entries, where
        self._built: dict[str, object] = {}
        self.docs = _ExampleInputsIndex(entries)

    def program(self, base: str):
        if base not in self._built:
            builder = DocumentBuilder(self.where)
            builder.add(load_json(self.entries, base, self.where),
                        torch_value(self.entries, base + "_state_dict", self.where),
                        torch_value(self.entries, base + "_constants", self.where),
                        torch_value(self.entries, base + "_example_inputs", self.where), f"program {base!r}")
            self._built[base] = builder.reader().program(0)
        return self._built[base]


class _ExampleInputsIndex:
    """`docs[base].get("example_inputs")` as etlab's reader answers it: whether a program recorded
    example inputs (upstream writes an empty member when it did not)."""

    def __init__(self, entries: dict[str, bytes]):
        self._entries = entries

    def __getitem__(self, base: str) -> dict:
        return {"example_inputs": True if self._entries.get(base + "_example_inputs") else None}
