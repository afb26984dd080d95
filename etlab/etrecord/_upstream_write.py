"""Writing an ETRecord in upstream ExecuTorch's layout (`ETRecord.save(path, format="upstream")`).

The layout is the one `_upstream` reads (see its docstring), so upstream's `parse_etrecord` and
Inspector read the file, and so does etlab. Programs are torch.export JSON in the schema version
upstream's deserializer accepts: etlab writes torch's current schema and drops the fields upstream's
copy of it does not have (a field it does not know makes its loader fail); edge programs name their
operators as executorch's edge ops, and each delegate call carries its lowered module inline (the
original program as nested JSON, its tensors, processed bytes and compile specs base64-encoded), as
upstream writes them. Debug handles go into node metadata. Tensors are `torch.save` members, which
upstream loads with `torch.load(weights_only=True)`.

Only what upstream can represent is written: node debug handles that are lists of more than one
handle, and delegate debug maps inside lowered modules, are kept only in the top-level maps.
"""

from __future__ import annotations

import base64
import io
import json
import zipfile

import torch
from torch.export import ExportedProgram

from etlab.etrecord._archive import UPSTREAM_IDENTIFIER, write_file
from etlab.etrecord._graphs import _export_json, _with_named_lowered_modules
from etlab.etrecord._named import upstream_named_data
from etlab.etrecord._torch_pickle import dump_torch_bytes
from etlab.etrecord._upstream import ATEN, DELEGATE_TARGET, EDGE, EDGE_OP_PREFIX
from etlab.facts.fx import graph_modules
from etlab.facts.lowered import LoweredBackendModule, lowered_modules

UPSTREAM_SCHEMA_VERSION = {"major": 5, "minor": 4}  # what upstream's deserializer (ExecuTorch 1.x) accepts
# Fields of torch's export schema that upstream's copy lacks, by where they occur.
_PROGRAM_ONLY = ("guards_code", "torch_version")
_GRAPH_MODULE_ONLY = ("metadata", "treespec_namedtuple_fields")
_DROPPED_ANYWHERE = ("is_hop_single_tensor_return", "forward_arg_names", "sym_float_values")
# Argument kinds torch writes that upstream's schema cannot read.
_NEW_ARGUMENT_KINDS = frozenset({"as_complex", "as_float_lists", "as_int_lists", "as_nested_tensors",
                                 "as_optional_tensor", "as_string_to_argument", "as_sym_float", "as_sym_floats"})


def _b64(data: bytes) -> str:
    return base64.b64encode(bytes(data)).decode("ascii")


def _downgrade(obj, what: str) -> None:
    """Drops (in place) the fields torch's schema has and upstream's does not; refuses argument kinds
    upstream cannot read, naming them."""
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
            continue
        if not isinstance(item, dict):
            continue
        for key in _DROPPED_ANYWHERE:
            item.pop(key, None)
        if "name" in item and "arg" in item:  # a NamedArgument
            item.pop("kind", None)
        if "graph" in item and "signature" in item:  # a GraphModule
            for key in _GRAPH_MODULE_ONLY:
                item.pop(key, None)
        if len(item) == 1 and next(iter(item)) in _NEW_ARGUMENT_KINDS:
            raise ValueError(f"{what}: an argument of kind {next(iter(item))!r}, which upstream's ETRecord "
                             "schema cannot represent")
        stack.extend(item.values())


class UpstreamProgramWriter:
    """ExportedPrograms as upstream's serialized program parts."""

    def program_json(self, ep: ExportedProgram, what: str, edge: bool) -> dict:
        """The program's JSON as upstream writes it (see the module docstring)."""
        lowered = lowered_modules(ep.graph_module)
        doc = _export_json(_with_named_lowered_modules(ep) if lowered else ep, what)
        for key in _PROGRAM_ONLY:
            doc.pop(key, None)
        doc["schema_version"] = dict(UPSTREAM_SCHEMA_VERSION)
        doc["dialect"] = "EDGE" if edge else doc["verifiers"][0] if doc.get("verifiers") else "TRAINING"
        if edge:
            doc["verifiers"] = ["EDGE"]
        by_attr = {attr: mod for path, attr, mod in lowered if path == ""}
        if len(by_attr) != len(lowered):
            raise ValueError(f"{what}: a delegate inside a control-flow branch; upstream's layout records "
                             "delegates of the top graph only")
        handles = {n.name: n.meta["debug_handle"] for n in graph_modules(ep.graph_module)[""].graph.nodes
                   if n.meta.get("debug_handle") is not None}
        for node in doc["graph_module"]["graph"]["nodes"]:
            handle = handles.get(node.get("name"))
            if isinstance(handle, (list, tuple)) and len(handle) == 1:
                handle = handle[0]
            if type(handle) is int:
                node.setdefault("metadata", {})["debug_handle"] = str(handle)
            if node["target"] == DELEGATE_TARGET:
                self._inline_lowered_module(node, by_attr, what)
        _downgrade(doc, what)
        if edge:
            _to_edge_names(doc)
            for entry in doc["graph_module"].get("module_call_graph") or []:
                # as upstream's edge programs record it: names of a graph that lowering rewrote are
                # not checked against it (upstream's loader would refuse a name no longer in the graph)
                if isinstance(entry.get("signature"), dict):
                    entry["signature"]["inputs"], entry["signature"]["outputs"] = [], []
        return doc

    def _inline_lowered_module(self, node: dict, by_attr: dict[str, LoweredBackendModule], what: str) -> None:
        placeholder = node["inputs"][0]["arg"].get("as_string", "")
        attr = placeholder.rsplit("-", 1)[0]
        mod = by_attr.get(attr)
        if mod is None:
            raise ValueError(f"{what}: delegate call {node.get('name')!r} names no lowered module")
        original = mod.original_module
        lowered = {
            "original_module": self.program_json(original, f"{what}: {attr}.original_module", edge=True),
            "original_state_dict": _b64(dump_torch_bytes(dict(original.state_dict))),
            "original_constants": _b64(dump_torch_bytes(dict(original.constants))),
            "processed_bytes": _b64(mod.processed_bytes),
            "compile_specs": [{"key": c.key, "value": _b64(c.value)} for c in mod.compile_specs],
            "backend_id": mod.backend_id,
            "named_data_store": upstream_named_data(getattr(mod, "named_data_store_output", None)),
        }
        node["inputs"][0] = {"name": attr, "arg": {"as_string": json.dumps(lowered)}}

    def parts(self, ep: ExportedProgram, base: str, what: str, edge: bool) -> list[tuple[str, bytes]]:
        """The four entries of one program: JSON, state dict, constants, example inputs."""
        for name, value in ep.constants.items():
            if not isinstance(value, torch.Tensor):
                raise ValueError(f"{what}: constant {name!r} is a {type(value).__name__}; only tensor constants "
                                 "are recorded")
        example = b"" if ep.example_inputs is None else dump_torch_bytes(ep.example_inputs)
        return [(base, json.dumps(self.program_json(ep, what, edge)).encode("utf-8")),
                (f"{base}_state_dict", dump_torch_bytes(dict(ep.state_dict))),
                (f"{base}_constants", dump_torch_bytes(dict(ep.constants))),
                (f"{base}_example_inputs", example)]


def _to_edge_names(obj) -> None:
    """torch.ops.<ns>.<op>.<overload> node targets -> executorch's edge-op names (higher-order ops stay)."""
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            target = item.get("target")
            if isinstance(target, str) and "inputs" in item and target.startswith("torch.ops.") and \
                    not target.startswith("torch.ops.higher_order."):
                item["target"] = EDGE_OP_PREFIX + target[len("torch.ops."):]
            stack.extend(item.values())


def _keyed(maps: dict | None, encode) -> bytes | None:
    if maps is None:
        return None
    return json.dumps({str(m): {str(int(i)): encode(v) for i, v in per.items()} for m, per in maps.items()}).encode()


def _handles(value):
    handles = [int(h) for h in value] if isinstance(value, (list, tuple)) else [int(value)]
    return handles[0] if len(handles) == 1 else handles


def save_upstream(record, path) -> None:
    """Writes `record` (an ETRecord) in upstream's layout, atomically to a path or to a binary file."""
    writer = UpstreamProgramWriter()
    entries: list[tuple[str, bytes]] = [(UPSTREAM_IDENTIFIER, b"")]
    aten = record._aten.all()
    main = "forward" if "forward" in aten else (next(iter(aten)) if len(aten) == 1 else None)
    if main is not None:  # upstream records one ATen program
        entries += writer.parts(aten[main], ATEN, f"ATen program {main!r}", edge=False)
    for method, ep in record._edge.all().items():
        entries += writer.parts(ep, f"{EDGE}/{method}", f"edge program {method!r}", edge=True)
    for key, ep in record._graph_map.all().items():
        entries += writer.parts(ep, key, f"recorded module {key!r}", edge=True)
    maps = [
        ("debug_handle_map", _keyed(record._debug_handle_map, _handles)),
        ("delegate_map", _keyed(record._delegate_map, lambda e: {
            "name": str(e["name"]),
            "delegate_map": {str(k): _handles(v) for k, v in (e.get("delegate_map") or {}).items()}})),
        ("instruction_id_to_num_outs_map", _keyed(record._instruction_id_to_num_outs_map, int)),
    ]
    entries += [(name, data) for name, data in maps if data is not None]
    if record._reference_outputs is not None:
        entries.append(("reference_outputs", dump_torch_bytes(record._reference_outputs)))
    if record._representative_inputs is not None:
        entries.append(("representative_inputs", dump_torch_bytes(record._representative_inputs)))
    if record.export_graph_id is not None:
        entries.append(("export_graph_id", json.dumps(int(record.export_graph_id)).encode()))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in entries:
            zf.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), data)
    write_file(path, buf.getvalue())
