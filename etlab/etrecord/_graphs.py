"""ExportedPrograms in an ETRecord: torch.export's JSON for the graph, our tensor store for the data.

A program is stored as one JSON document (all in the file's `programs` list):
- "export": the graph, signature, range constraints and module call graph in torch.export's JSON
  schema (`torch._export.serde`), written without its pickled state dict / constants / inputs;
- "state_dict", "constants": name -> tensor index in the file's tensor store (deduplicated);
- "example_inputs": the (args, kwargs) the program was exported with, if any;
- "debug_handles": graph path -> node name -> debug handle (torch's JSON drops node.meta keys it
  does not know; "" is the top graph, control-flow branches are named by their module path);
- "delegates": each LoweredBackendModule the graphs call: backend id, processed bytes, compile
  specs, its delegate debug map, its original program (another document, stored recursively) and
  its named data, when it has any (`_named`: the blobs its payload refers to by key);
- "delegation_refusals" (optional): graph path -> node name -> [backend, category, reason, hint],
  why a partitioner left the node out (`facts.lowered.DELEGATION_REFUSAL_META`).

Rebuilding checks the JSON first (`_graph_check.sanitize_program`): torch's deserializer would
otherwise evaluate expressions and guard code from the file. What does not survive the round
trip: node metadata other than stack_trace, nn_module_stack, torch_fn, debug handles and delegation
refusals (source_fn_stack, from_node and custom metadata are dropped), and custom (script) objects.
"""

from __future__ import annotations

import copy
import json
import logging

import torch
from torch._export.serde import schema
from torch._export.serde import serialize as serde
from torch.export import ExportedProgram
from torch.fx import GraphModule

from etlab.errors import FormatError
from etlab.etrecord._archive import dump_json
from etlab.etrecord._graph_check import check_name, sanitize_program
from etlab.etrecord._named import named_data_doc, named_data_from_doc
from etlab.etrecord._schema_json import deserialize_program
from etlab.etrecord._values import TensorStore, TensorTable, decode_value, encode_value
from etlab.facts.fx import copy_graph_module, graph_modules
from etlab.facts.lowered import (
    DELEGATION_REFUSAL_META,
    REFUSAL_CATEGORIES,
    CompileSpec,
    DelegationRefusal,
    LoweredBackendModule,
    executorch_call_delegate,
    lowered_modules,
)

log = logging.getLogger(__name__)


class ProgramWriter:
    """Turns ExportedPrograms into JSON documents sharing one tensor store."""

    def __init__(self, store: TensorStore):
        self.store = store
        self.docs: list[dict | None] = []
        self._ids: dict[int, int] = {}
        self._keep: list[ExportedProgram] = []  # keeps id()s unique while writing

    def add(self, ep: ExportedProgram, what: str) -> int:
        """The document index of an ExportedProgram, writing it on first sight (a program given twice is stored
        once); a TypeError names anything else."""
        if not isinstance(ep, ExportedProgram):
            raise TypeError(f"{what}: expected a torch.export.ExportedProgram, got {type(ep).__name__}")
        if id(ep) in self._ids:
            return self._ids[id(ep)]
        index = self._ids[id(ep)] = len(self.docs)
        self._keep.append(ep)
        self.docs.append(None)  # reserved: a program's lowered modules get larger indices
        self.docs[index] = self._document(ep, what)
        return index

    def _document(self, ep: ExportedProgram, what: str) -> dict:
        lowered = lowered_modules(ep.graph_module)
        delegates = []
        for path, attr, mod in lowered:
            entry = {
                "graph": path, "attr": attr, "backend_id": mod.backend_id,
                "processed": self.store.add_bytes(mod.processed_bytes, f"{what}: {attr} processed bytes"),
                "compile_specs": [[c.key, self.store.add_bytes(bytes(c.value), f"{what}: compile spec {c.key}")]
                                  for c in mod.compile_specs],
                "debug_handle_map": [[k, _handles_json(v)] for k, v in mod.debug_handle_map.items()],
                "original_module": self.add(mod.original_module, f"{what}: {attr}.original_module"),
            }
            named = named_data_doc(getattr(mod, "named_data_store_output", None), self.store, f"{what}: {attr}")
            if named is not None:  # the blobs the payload refers to by key (XNNPACK's weights)
                entry["named_data"] = named
            delegates.append(entry)
        doc = _export_json(ep if not lowered else _with_named_lowered_modules(ep), what)
        state_dict = []
        for name, t in ep.state_dict.items():
            state_dict.append([name, self.store.add(t, f"{what}: state_dict[{name!r}]"),
                               isinstance(t, torch.nn.Parameter), bool(t.requires_grad)])
        constants = []
        for name, t in ep.constants.items():
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"{what}: constant {name!r} is a {type(t).__name__}; an ETRecord records only "
                                 "tensor constants")
            constants.append([name, self.store.add(t, f"{what}: constant {name!r}")])
        example = None
        if ep.example_inputs is not None:
            try:  # optional: only a fallback for representative inputs
                example = encode_value(tuple(ep.example_inputs), self.store, f"{what}: example inputs")
            except (ValueError, TypeError) as e:
                log.info("%s: example inputs not recorded: %s", what, e)
        debug_handles, refusals = {}, {}
        for path, sub in graph_modules(ep.graph_module).items():
            handles = {n.name: _handles_json(n.meta["debug_handle"]) for n in sub.graph.nodes
                       if n.meta.get("debug_handle") is not None}
            if handles:
                debug_handles[path] = handles
            refused = {n.name: [r.backend, r.category, r.reason, r.hint] for n in sub.graph.nodes
                       if isinstance(r := n.meta.get(DELEGATION_REFUSAL_META), DelegationRefusal)}
            if refused:
                refusals[path] = refused
        out = {
            "export": doc, "state_dict": state_dict, "constants": constants,
            "example_inputs": example,
            "debug_handles": debug_handles, "delegates": delegates,
        }
        if refusals:
            out["delegation_refusals"] = refusals
        return out


def _handles_json(handles):
    if isinstance(handles, int):
        return handles
    return [int(h) for h in handles]


def _with_named_lowered_modules(ep: ExportedProgram) -> ExportedProgram:
    """A shallow copy whose lowered modules carry `module_name`, which torch's serializer writes
    (as "<module_name>-<backend_id>") in place of the module; the caller's program is untouched."""
    gm = copy_graph_module(ep.graph_module)
    for sub in graph_modules(gm).values():
        for name, child in list(sub.named_children()):
            if isinstance(child, LoweredBackendModule):
                named = copy.copy(child)
                named.__dict__["module_name"] = name
                setattr(sub, name, named)
    out = copy.copy(ep)
    out._graph_module = gm
    return out


def _export_json(ep: ExportedProgram, what: str) -> dict:
    """torch.export's JSON for the program's graph, signature and shapes (no tensors).

    This is `torch._export.serde.serialize.serialize` minus its canonical-form self-check (a deep
    copy of the whole program, half the time) and its pickling of state dict, constants and inputs."""
    try:
        with serde._enable_graph_inputs_of_type_nn_module(ep.example_inputs):
            ep.validate()
            graph_serializer = serde.GraphModuleSerializer(ep.graph_signature, ep.module_call_graph)
            graph_module = graph_serializer.serialize(ep.graph_module)
            if graph_serializer.custom_objs:
                raise ValueError("it holds custom (script) objects, which an ETRecord does not record")
            program = schema.ExportedProgram(
                graph_module=graph_module, opset_version={"aten": torch._C._get_max_operator_version()},
                range_constraints=serde.serialize_range_constraints(ep.range_constraints),
                schema_version=schema.SchemaVersion(major=serde.SCHEMA_VERSION[0], minor=serde.SCHEMA_VERSION[1]),
                verifiers=[v.dialect for v in ep.verifiers], torch_version=torch.__version__, guards_code=[])
            doc = json.loads(serde._to_json_bytes(program))
    except Exception as e:
        raise ValueError(f"{what}: torch.export could not serialize the program ({type(e).__name__}: {e})") from e
    sanitize_program(doc, what)  # the same trimming a reader applies, so files hold only what is read
    return doc


# -- reading --------------------------------------------------------------------------------------------


class ProgramReader:
    """Rebuilds the programs of a file on demand (each at most once)."""

    def __init__(self, docs: list, tensors: TensorTable, where: str):
        if not isinstance(docs, list):
            raise FormatError(f"{where}: 'programs' must be a list")
        self.docs = dict(enumerate(docs))
        self.tensors = tensors
        self.where = where
        self._built: dict[int, ExportedProgram] = {}
        for index, doc in self.docs.items():
            self._check_document(index, doc)

    def check_id(self, index, what: str) -> int:
        """The program index a record entry refers to, if the file holds it; a FormatError naming the entry
        otherwise."""
        if type(index) is not int or index not in self.docs:
            raise FormatError(f"{self.where}: {what} refers to program {index!r}, which the file does not hold")
        return index

    def _check_document(self, index: int, doc) -> None:
        where = f"{self.where}: program {index}"
        if not isinstance(doc, dict):
            raise FormatError(f"{where} is not an object")
        sanitize_program(doc.get("export"), where)
        for key in ("state_dict", "constants", "delegates"):
            if not isinstance(doc.get(key), list):
                raise FormatError(f"{where}: {key!r} must be a list")
        for item in doc["state_dict"]:
            if not (isinstance(item, list) and len(item) == 4 and isinstance(item[0], str)):
                raise FormatError(f"{where}: bad state_dict entry {str(item)[:80]}")
            self.tensors.check_index(item[1], f"program {index} state_dict[{item[0]!r}]")
        for item in doc["constants"]:
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
                raise FormatError(f"{where}: bad constants entry {str(item)[:80]}")
            self.tensors.check_index(item[1], f"program {index} constants[{item[0]!r}]")
        if not isinstance(doc.get("debug_handles"), dict) or not all(
                isinstance(v, dict) for v in doc["debug_handles"].values()):
            raise FormatError(f"{where}: 'debug_handles' must map graph paths to node -> handle objects")
        _check_refusals(doc.get("delegation_refusals", {}), where)
        for d in doc["delegates"]:
            if not isinstance(d, dict) or not all(isinstance(d.get(k), str) for k in ("graph", "attr", "backend_id")):
                raise FormatError(f"{where}: a delegate entry lacks graph / attr / backend_id")
            if not d["attr"].isidentifier() or d["attr"].startswith("_"):
                raise FormatError(f"{where}: delegate attribute {d['attr'][:80]!r} is not a plain identifier")
            check_name(d["graph"], where, "delegate graph path")
            self.tensors.check_index(d.get("processed"), f"program {index} delegate {d['attr']!r}")
            child = self.check_id(d.get("original_module"), f"program {index} delegate {d['attr']!r}")
            if child <= index:  # children are written after their parent: no cycles
                raise FormatError(f"{where}: delegate {d['attr']!r} refers back to program {child}")
            specs, dmap = d.get("compile_specs"), d.get("debug_handle_map")
            if not isinstance(specs, list) or not all(isinstance(s, list) and len(s) == 2 and isinstance(s[0], str)
                                                      for s in specs):
                raise FormatError(f"{where}: delegate {d['attr']!r} has malformed compile_specs")
            for _, tensor in specs:
                self.tensors.check_index(tensor, f"program {index} delegate {d['attr']!r} compile spec")
            if not isinstance(dmap, list) or not all(isinstance(p, list) and len(p) == 2 for p in dmap):
                raise FormatError(f"{where}: delegate {d['attr']!r} has a malformed debug_handle_map")
            if not isinstance(d.get("named_data", {}), dict):
                raise FormatError(f"{where}: delegate {d['attr']!r} has malformed named data")

    def program(self, index: int) -> ExportedProgram:
        """The ExportedProgram at `index`, rebuilt from its document on first use and cached."""
        index = self.check_id(index, "a graph")
        ep = self._built.get(index)
        if ep is None:
            ep = self._built[index] = self._rebuild(index)
        return ep

    def _rebuild(self, index: int) -> ExportedProgram:
        where = f"{self.where}: program {index}"
        doc = self.docs[index]
        state_dict = {}
        for name, tensor, is_param, requires_grad in doc["state_dict"]:
            t = self.tensors.tensor(tensor, f"state_dict[{name!r}]")
            if is_param and requires_grad and not (t.is_floating_point() or t.is_complex()):
                raise FormatError(f"{where}: state_dict[{name!r}] is a {t.dtype} parameter that requires grad "
                                  "(only floating-point and complex tensors can)")
            state_dict[name] = torch.nn.Parameter(t, requires_grad=bool(requires_grad)) if is_param else t
        constants = {name: self.tensors.tensor(tensor, f"constants[{name!r}]") for name, tensor in doc["constants"]}
        example = doc.get("example_inputs")
        example = decode_value(example, self.tensors, "example inputs") if example is not None else None
        if example is not None and not (isinstance(example, tuple) and len(example) == 2):
            raise FormatError(f"{where}: example inputs are not an (args, kwargs) pair")
        try:
            # a private copy of the document (torch's deserializer may keep and change its lists)
            ep = deserialize_program(json.loads(dump_json(doc["export"])), state_dict, constants, example)
        except FormatError:
            raise
        except Exception as e:  # torch raises many kinds on a malformed document
            raise FormatError(f"{where}: torch.export could not rebuild the program "
                              f"({type(e).__name__}: {str(e)[:300]})") from None
        modules = graph_modules(ep.graph_module)
        for d in doc["delegates"]:
            self._restore_delegate(modules, d, where)
        self._restore_debug_handles(modules, doc["debug_handles"], where)  # get_attr nodes of delegates too
        _restore_refusals(modules, doc.get("delegation_refusals", {}), where)
        for gm in modules.values():
            gm.recompile()
        return ep

    @staticmethod
    def _restore_debug_handles(modules: dict[str, GraphModule], table: dict, where: str) -> None:
        for by_name, handles in _per_graph(modules, table, where, "debug handles"):
            for name, handle in handles.items():
                ok = type(handle) is int or (isinstance(handle, list) and all(type(h) is int for h in handle))
                if not ok:
                    raise FormatError(f"{where}: debug handle of node {name!r} is not an int or a list of ints")
                if name in by_name:
                    by_name[name].meta["debug_handle"] = handle if type(handle) is int else list(handle)

    def _restore_delegate(self, modules: dict[str, GraphModule], d: dict, where: str) -> None:
        gm = modules.get(d["graph"])
        if gm is None:
            raise FormatError(f"{where}: delegate {d['attr']!r} is in graph {d['graph']!r}, which the program lacks")
        dmap = {}
        for key, handles in d["debug_handle_map"]:
            if not isinstance(key, (int, str)) or not (isinstance(handles, list) and
                                                       all(type(h) is int for h in handles)):
                raise FormatError(f"{where}: delegate {d['attr']!r} has a malformed debug_handle_map entry")
            dmap[key] = tuple(handles)
        lowered = LoweredBackendModule(
            d["backend_id"], self.tensors.raw_bytes(d["processed"], "processed bytes"),
            [CompileSpec(key, self.tensors.raw_bytes(t, "compile spec")) for key, t in d["compile_specs"]],
            self.program(d["original_module"]), dmap,
            named_data_from_doc(d.get("named_data"), self.tensors, f"{where}: delegate {d['attr']!r}"))
        placeholder = f"{d['attr']}-{d['backend_id']}"
        calls = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is executorch_call_delegate
                 and n.args and n.args[0] == placeholder]
        if not calls:
            raise FormatError(f"{where}: no executorch_call_delegate calls delegate {d['attr']!r}")
        if hasattr(gm, d["attr"]):
            raise FormatError(f"{where}: delegate name {d['attr']!r} clashes with an attribute of its graph")
        gm.add_submodule(d["attr"], lowered)
        for call in calls:
            with gm.graph.inserting_before(call):
                attr = gm.graph.get_attr(d["attr"])
            call.args = (attr, *call.args[1:])


# A refusal's text fields are sentences; anything longer is not one etlab wrote.
_MAX_REFUSAL_TEXT = 4000


def _check_refusals(table, where: str) -> None:
    """'delegation_refusals': graph path -> node name -> [backend, category, reason, hint] of strings,
    the category one of REFUSAL_CATEGORIES."""
    if not isinstance(table, dict) or not all(isinstance(v, dict) for v in table.values()):
        raise FormatError(f"{where}: 'delegation_refusals' must map graph paths to node -> refusal objects")
    for path, refused in table.items():
        for name, r in refused.items():
            if not (isinstance(r, list) and len(r) == 4 and all(isinstance(x, str) and len(x) <= _MAX_REFUSAL_TEXT
                                                                  for x in r)):
                raise FormatError(f"{where}: delegation refusal of node {str(name)[:80]!r} in graph {str(path)[:80]!r} "
                                  "is not [backend, category, reason, hint] (short strings)")
            if r[1] not in REFUSAL_CATEGORIES:
                raise FormatError(f"{where}: delegation refusal of node {str(name)[:80]!r} has unknown category "
                                  f"{r[1][:40]!r} (expected one of {', '.join(REFUSAL_CATEGORIES)})")


def _per_graph(modules: dict[str, GraphModule], table: dict, where: str, what: str):
    """(node name -> node, entries) for each graph path of a per-graph node table ("" the top graph);
    a path the program lacks is logged and skipped."""
    for path, entries in table.items():
        gm = modules.get(path)
        if gm is None:
            log.warning("%s: no graph %r to put %s on", where, path, what)
            continue
        yield {n.name: n for n in gm.graph.nodes}, entries


def _restore_refusals(modules: dict[str, GraphModule], table: dict, where: str) -> None:
    for by_name, refused in _per_graph(modules, table, where, "delegation refusals"):
        for name, (backend, category, reason, hint) in refused.items():
            if name in by_name:
                by_name[name].meta[DELEGATION_REFUSAL_META] = DelegationRefusal(backend, category, reason, hint)
