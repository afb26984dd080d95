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

import json
import math
import re

import torch

from etlab.errors import FormatError
from etlab.etrecord._archive import load_json
from etlab.etrecord._graph_check import check_target
from etlab.etrecord._graphs import ProgramReader
from etlab.etrecord._named import named_data_doc, parse_upstream_named_data
from etlab.etrecord._program_json import DELEGATE_TARGET, EDGE_OP_PREFIX
from etlab.etrecord._torch_pickle import load_torch_bytes
from etlab.etrecord._upstream_json import (  # noqa: F401 (the JSON half, torch-free; callers use both)
    ATEN,
    EDGE,
    MAPS,
    PARTS,
    VALUES,
    _base64,
    debug_handle_map,
    delegate_map,
    export_graph_id,
    is_upstream_entry,
    num_outs_map,
    program_bases,
    program_ops,
)
from etlab.etrecord._values import TensorStore, TensorTable, encode_value

_MAX_NESTED_DELEGATES = 16


def torch_value(entries, name: str, where: str):
    """A torch.save member of an upstream record, loaded with the restricted loader; None when the record does not
    have it."""
    return load_torch_bytes(entries[name], f"{where}: entry {name!r}") if name in entries else None


class DocumentBuilder:
    """Upstream programs -> etlab program documents (one list) sharing one tensor store."""

    def __init__(self, where: str):
        self.where = where
        self.store = TensorStore()
        self.docs: list[dict | None] = []
        self._targets_ok: set[str] = set()

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
        self._translate_graph(program["graph_module"]["graph"], doc, where, depth)
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

    def _translate_graph(self, graph: dict, doc: dict, where: str, depth: int) -> None:
        nodes = graph.get("nodes")
        if not isinstance(nodes, list):
            raise FormatError(f"{where}: the graph has no node list")
        handles = {}
        for node in nodes:
            if not isinstance(node, dict) or not isinstance(node.get("target"), str) \
                    or not isinstance(node.get("name"), str):
                raise FormatError(f"{where}: a node without a name or target")
            target = node["target"]
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
        if handles:
            doc["debug_handles"][""] = handles

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

    def reader(self) -> ProgramReader:
        """A ProgramReader over the documents built so far and their shared tensor store."""
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


class UpstreamLoader:
    """Rebuilds an upstream ETRecord's programs on first use, by base name: its torch.save members
    are read (by `_torch_pickle`) and its JSON translated and validated only then."""

    def __init__(self, entries: dict[str, bytes], where: str):
        self.entries, self.where = entries, where
        self._built: dict[str, object] = {}
        self.docs = _ExampleInputsIndex(entries)

    def program(self, base: str):
        """The upstream record's program named `base`, rebuilt (graph JSON, state dict, constants) on first use and
        cached."""
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
