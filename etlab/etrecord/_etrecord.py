"""ETRecord: what was compiled, kept for the devtools to join with what ran.

    edge = to_edge(torch.export.export(model, inputs), generate_etrecord=True)
    et = edge.to_executorch()
    et.get_etrecord().save("model.etrecord")       # or generate_etrecord(path, edge, et)
    record = parse_etrecord("model.etrecord")
    record.edge_dialect_program                     # rebuilt on first access
    record.program_info()                           # what the Inspector needs; no graph rebuilt

Names and attributes mirror upstream ExecuTorch's `devtools.etrecord`. By default the file is an
etlab zip (see `_archive`): nothing in it is pickled, and weights shared by the programs are
stored once. `save(path, format="upstream")` writes upstream's layout instead (`_upstream_write`),
and `parse_etrecord` reads either (upstream's through `_upstream`, without running pickle code).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from torch.export import ExportedProgram

from etlab.etrecord import _info
from etlab.etrecord._archive import FORMAT, VERSION, dump_json, write_archive
from etlab.etrecord._graphs import ProgramWriter
from etlab.etrecord._maps import main_method
from etlab.etrecord._values import TensorStore, encode_value
from etlab.facts.program_info import DebugHandle, MethodInfo, OpInfo, ProgramInfo

EDGE_GRAPH = "edge_dialect_exported_program"
ATEN_GRAPH = "exported_program"
# Names extra recorded modules may not contain (upstream's reserved ETRecord names).
RESERVED_NAMES = ("ETRECORD_V0", ATEN_GRAPH, "export_graph_id", EDGE_GRAPH, "et_dialect_graph_module",
                  "debug_handle_map", "delegate_map", "instruction_id_to_num_outs_map", "reference_outputs",
                  "representative_inputs")


class _Programs:
    """Named programs, each either in memory or rebuilt from the file on first use."""

    def __init__(self, programs: Mapping[str, ExportedProgram] | None = None, loader=None,
                 ids: Mapping[str, int] | None = None, on_load=None):
        self._programs = dict(programs or {})
        self._loader, self._ids = loader, dict(ids or {})
        self._on_load = on_load  # called as on_load(name, program) after a program is rebuilt

    def names(self) -> list[str]:
        return list(dict.fromkeys([*self._programs, *self._ids]))

    def __contains__(self, name) -> bool:
        return name in self._programs or name in self._ids

    def __len__(self) -> int:
        return len(self.names())

    def get(self, name: str) -> ExportedProgram | None:
        if name not in self._programs and name in self._ids:
            self._programs[name] = self._loader.program(self._ids[name])
            if self._on_load is not None:
                self._on_load(name, self._programs[name])
        return self._programs.get(name)

    def all(self) -> dict[str, ExportedProgram]:
        return {name: self.get(name) for name in self.names()}

    def set(self, name: str, ep: ExportedProgram) -> None:
        self._programs[name] = ep
        self._ids.pop(name, None)


class _GraphLookup(Mapping):
    """ProgramInfo.graphs: upstream's graph names -> programs, rebuilt only when looked up."""

    def __init__(self, record: ETRecord):
        self._record = record

    def _resolve(self, key: str):
        r = self._record
        for prefix, programs in ((EDGE_GRAPH, r._edge), (ATEN_GRAPH, r._aten)):
            if key == prefix:
                main = main_method(programs.names())
                return programs, main
            if key.startswith(prefix + "/"):
                return programs, key[len(prefix) + 1:]
        return r._graph_map, key

    def __getitem__(self, key):
        programs, name = self._resolve(key)
        if name is None or name not in programs:
            raise KeyError(key)
        return programs.get(name)

    def __iter__(self):
        r = self._record
        keys = []
        for prefix, programs in ((EDGE_GRAPH, r._edge), (ATEN_GRAPH, r._aten)):
            if programs.names():
                keys.append(prefix)
                keys.extend(f"{prefix}/{m}" for m in programs.names())
        keys.extend(r._graph_map.names())
        return iter(keys)

    def __len__(self):
        return sum(1 for _ in self)


def _is_bundled(obj) -> bool:
    return hasattr(obj, "method_test_suites") and hasattr(obj, "executorch_program")


def _bundled_reference_outputs(bundled) -> dict[str, list]:
    out = {}
    for suite in bundled.method_test_suites:
        out[suite.method_name] = []
        for case in suite.test_cases:
            if not case.expected_outputs:
                raise ValueError(f"method {suite.method_name!r}: a test case has no expected outputs")
            out[suite.method_name].append(case.expected_outputs)
    return out


def _bundled_representative_inputs(bundled):
    for suite in bundled.method_test_suites:
        if suite.method_name == "forward":
            if not suite.test_cases:
                raise ValueError("method 'forward' has no test cases to take representative inputs from")
            return suite.test_cases[0].inputs
    return None


class ETRecord:
    """A compiled program's record: ATen and edge programs, debug maps, inputs and reference outputs.

    Build one with `ETRecord.from_sources` (what `ExecutorchProgramManager.get_etrecord()` gives),
    `generate_etrecord`, or the `add_*` methods; read one with `parse_etrecord`.
    """

    def __init__(self, exported_program=None, export_graph_id: int | None = None, edge_dialect_program=None,
                 graph_map: dict[str, ExportedProgram] | None = None, _debug_handle_map: dict | None = None,
                 _delegate_map: dict | None = None, _instruction_id_to_num_outs_map: dict | None = None,
                 _reference_outputs: dict | None = None, _representative_inputs=None):
        self._aten = _Programs(_as_method_dict(exported_program, "exported_program"))
        self.export_graph_id = export_graph_id
        self._edge = _Programs(_as_method_dict(edge_dialect_program, "edge_dialect_program"))
        self._graph_map = _Programs(graph_map)
        self._debug_handle_map = _debug_handle_map
        self._delegate_map = _delegate_map
        self._instruction_id_to_num_outs_map = _instruction_id_to_num_outs_map
        self._reference_outputs = _reference_outputs
        self._representative_inputs = _representative_inputs
        self._ops: dict[str, dict[int, list[OpInfo]]] = {}  # from the file; else computed from the graphs

    # -- upstream-shaped attributes ---------------------------------------------------------------------

    @property
    def exported_program(self) -> ExportedProgram | None:
        """The ATen-dialect program of "forward" (or of the only method), as upstream records it."""
        main = main_method(self._aten.names())
        return self._aten.get(main) if main is not None else None

    @exported_program.setter
    def exported_program(self, value) -> None:
        self._aten = _Programs(_as_method_dict(value, "exported_program"))

    @property
    def exported_programs(self) -> dict[str, ExportedProgram]:
        """The ATen-dialect program of every method recorded."""
        return self._aten.all()

    @property
    def edge_dialect_program(self) -> ExportedProgram | dict[str, ExportedProgram] | None:
        """The edge program: an ExportedProgram for one method, else a dict by method (as upstream)."""
        names = self._edge.names()
        if not names:
            return None
        return self._edge.get(names[0]) if len(names) == 1 else self._edge.all()

    @edge_dialect_program.setter
    def edge_dialect_program(self, value) -> None:
        self._edge = _Programs(_as_method_dict(value, "edge_dialect_program"))
        self._ops.clear()

    @property
    def graph_map(self) -> dict[str, ExportedProgram]:
        """Extra recorded programs by "<name>/<method>"."""
        return self._graph_map.all()

    @property
    def methods(self) -> list[str]:
        """The methods the record knows, in the order it holds them: those with an edge program, then those with only
        debug maps."""
        return list(dict.fromkeys([*self._edge.names(), *(self._debug_handle_map or {})]))

    def edge_program(self, method: str = "forward") -> ExportedProgram:
        """The recorded edge-dialect program of `method` (a KeyError lists the methods recorded)."""
        if method not in self._edge:
            raise KeyError(f"no edge program for method {method!r}; methods are {self._edge.names()}")
        return self._edge.get(method)

    # -- building ---------------------------------------------------------------------------------------

    @classmethod
    def from_sources(cls, sources, representative_inputs=None, reference_outputs=None) -> ETRecord:
        """From the compiler's `ETRecordSources` (programs at each stage and the emitter's maps).

        An ETRecord passed in is returned as is (with the inputs / outputs given set on it)."""
        if isinstance(sources, ETRecord):
            record = sources
            if representative_inputs is not None:
                record.update_representative_inputs(representative_inputs)
            if reference_outputs is not None:
                record.update_reference_outputs(reference_outputs)
            return record
        record = cls(exported_program=dict(sources.exported_program) if sources.exported_program else None,
                     edge_dialect_program=dict(sources.edge_dialect_program),
                     _debug_handle_map=dict(sources.debug_handle_map),
                     _delegate_map=dict(sources.delegate_map),
                     _instruction_id_to_num_outs_map=dict(sources.instruction_id_to_num_outs_map))
        main = record.exported_program
        record.export_graph_id = id(main.graph) if main is not None else None
        if representative_inputs is not None:
            record.update_representative_inputs(representative_inputs)
        if reference_outputs is not None:
            record.update_reference_outputs(reference_outputs)
        return record

    def copy(self) -> ETRecord:
        """A shallow copy with the programs but without the executorch-program data (as upstream)."""
        out = ETRecord(export_graph_id=self.export_graph_id)
        out._aten, out._edge, out._graph_map = self._aten, self._edge, self._graph_map
        return out

    def add_exported_program(self, exported_program) -> None:
        """Records the ATen-dialect program(s) (one, or a dict by method); once only, as upstream."""
        if self._aten.names() or self.export_graph_id is not None:
            raise RuntimeError("Exported program already exists in the ETRecord.")
        if exported_program is None:
            return
        self._aten = _Programs(_as_method_dict(exported_program, "exported_program"))
        main = self.exported_program
        self.export_graph_id = id(main.graph) if main is not None else None

    def add_edge_dialect_program(self, edge_dialect_program) -> None:
        """Records the edge program(s): an EdgeProgramManager, an ExportedProgram or a dict by method; once only."""
        if self._edge.names():
            raise RuntimeError("Edge dialect program already exists in the ETRecord.")
        self.edge_dialect_program = _edge_methods(edge_dialect_program)

    def add_executorch_program(self, executorch_program) -> None:
        """Records the emitter's maps (debug handles, delegates, outputs per instruction) of an
        ExecutorchProgramManager, or of a BundledProgram's program with its test cases' inputs and
        expected outputs; once only."""
        if any(v is not None for v in (self._debug_handle_map, self._delegate_map,
                                       self._instruction_id_to_num_outs_map, self._reference_outputs,
                                       self._representative_inputs)):
            raise RuntimeError("Executorch program data already exists in the ETRecord.")
        program = executorch_program
        if _is_bundled(executorch_program):
            self._reference_outputs = _bundled_reference_outputs(executorch_program)
            self._representative_inputs = _bundled_representative_inputs(executorch_program)
            program = executorch_program.executorch_program
        for attr in ("debug_handle_map", "delegate_map", "instruction_id_to_num_outs_map"):
            if not hasattr(program, attr):
                raise TypeError(f"executorch_program must be an ExecutorchProgramManager (from to_executorch()) or a "
                                f"BundledProgram; {type(program).__name__} has no {attr}")
        self._debug_handle_map = dict(program.debug_handle_map)
        self._delegate_map = dict(program.delegate_map)
        self._instruction_id_to_num_outs_map = dict(program.instruction_id_to_num_outs_map)

    def add_extra_export_modules(self, extra_recorded_export_modules: dict) -> None:
        """Records more programs by name (`graph_map["<name>/<method>"]`); reserved names are refused."""
        for name, module in extra_recorded_export_modules.items():
            if not isinstance(name, str) or any(r in name for r in RESERVED_NAMES):
                raise RuntimeError(f"The name {name!r} provided in the extra_recorded_export_modules dict is a "
                                   "reserved name in the ETRecord namespace.")
            for method, ep in _edge_methods(module).items():
                self._graph_map.set(f"{name}/{method}", ep)

    def update_representative_inputs(self, representative_inputs) -> None:
        """The inputs the recorded program is re-run on for numeric comparisons (positional, "forward");
        a BundledProgram gives its first "forward" test case's inputs."""
        if _is_bundled(representative_inputs):
            representative_inputs = _bundled_representative_inputs(representative_inputs)
        self._representative_inputs = representative_inputs

    def update_reference_outputs(self, reference_outputs) -> None:
        """Expected outputs: {method: [outputs per test case]}, a list (for "forward"), or a BundledProgram."""
        if _is_bundled(reference_outputs):
            reference_outputs = _bundled_reference_outputs(reference_outputs)
        elif isinstance(reference_outputs, list):
            reference_outputs = {"forward": reference_outputs}
        self._reference_outputs = reference_outputs

    # -- what the Inspector needs -----------------------------------------------------------------------

    def ops(self, method: str) -> dict[int, list[OpInfo]]:
        """Debug handle -> graph nodes carrying it, for one method."""
        if method not in self._ops:
            self._ops[method] = _info.collect_ops(self.edge_program(method)) if method in self._edge else {}
        return self._ops[method]

    def intermediate_outputs(self, method: str = "forward", inputs=None) -> dict[DebugHandle, object]:
        """Runs the recorded edge program on `inputs` (default: the representative inputs for "forward",
        else the program's example inputs) and returns every recorded node's output by debug handle."""
        if inputs is None:
            inputs = self._inputs_for(method)
            if inputs is None:
                raise ValueError(f"method {method!r}: the ETRecord has no representative or example inputs")
        return _info.intermediate_outputs(self.edge_program(method), inputs)

    def _inputs_for(self, method: str):
        if self._representative_inputs is not None and method == main_method(self.methods):
            return self._representative_inputs
        if method not in self._edge:
            return None
        return self.edge_program(method).example_inputs

    def _has_inputs(self, method: str) -> bool:
        if self._representative_inputs is not None and method == main_method(self.methods):
            return True
        return self._example_inputs_recorded(method)

    def _example_inputs_recorded(self, method: str) -> bool:
        if method not in self._edge:
            return False
        loaded = self._edge._programs.get(method)
        if loaded is not None:
            return loaded.example_inputs is not None
        reader, index = self._edge._loader, self._edge._ids.get(method)
        return reader is not None and index is not None and reader.docs[index].get("example_inputs") is not None

    def program_info(self) -> ProgramInfo:
        """Per method: instruction -> debug handles, delegates, ops, reference outputs and (lazily)
        the AOT intermediate outputs; plus the recorded graphs by name."""
        methods: dict[str, MethodInfo] = {}
        for method in self.methods:
            aot = (lambda m=method: self.intermediate_outputs(m)) if self._has_inputs(method) else None
            methods[method] = _info.method_info(
                (self._debug_handle_map or {}).get(method), (self._delegate_map or {}).get(method),
                (self._instruction_id_to_num_outs_map or {}).get(method), self.ops(method),
                (self._reference_outputs or {}).get(method), aot)
        return ProgramInfo(methods=methods, graphs=_GraphLookup(self))

    # -- saving -----------------------------------------------------------------------------------------

    def save(self, path, format: str = "etlab") -> None:
        """Writes the record (atomically to a path, or to a binary file).

        format="etlab" (the default): etlab's zip of JSON and raw tensors, which loads without pickle.
        format="upstream": upstream ExecuTorch's layout (torch.export JSON and torch.save members),
        which upstream's `parse_etrecord` / Inspector read, and etlab too."""
        from etlab.etrecord._serde_speed import fast_serialization

        with fast_serialization():
            self._save(path, format)

    def _save(self, path, format: str) -> None:
        if format not in ("etlab", "upstream"):
            raise ValueError(f"ETRecord.save: format must be 'etlab' or 'upstream', got {format!r}")
        if not (self._edge.names() and self._debug_handle_map):
            raise RuntimeError("ETRecord must contain edge dialect program and executorch program to be saved")
        if format == "upstream":
            from etlab.etrecord._upstream_write import save_upstream  # torch.save and upstream's schema: only here

            save_upstream(self, os.fspath(path) if isinstance(path, os.PathLike) else path)
            return
        store = TensorStore()
        writer = ProgramWriter(store)
        manifest = {
            "format": FORMAT, "version": VERSION,
            "edge_dialect_program": {m: writer.add(ep, f"edge program {m!r}") for m, ep in self._edge.all().items()},
            "exported_program": {m: writer.add(ep, f"ATen program {m!r}") for m, ep in self._aten.all().items()},
            "graph_map": {k: writer.add(ep, f"recorded module {k!r}") for k, ep in self._graph_map.all().items()},
            "export_graph_id": self.export_graph_id,
            "debug_handle_map": _per_method(self._debug_handle_map, lambda m: [[int(i), [int(h) for h in hs]]
                                                                               for i, hs in m.items()]),
            "delegate_map": _per_method(self._delegate_map, lambda m: [
                [int(i), str(e["name"]), [[k, [int(h) for h in hs]] for k, hs in (e.get("delegate_map") or {}).items()]]
                for i, e in m.items()]),
            "instruction_id_to_num_outs_map": _per_method(self._instruction_id_to_num_outs_map,
                                                          lambda m: [[int(i), int(n)] for i, n in m.items()]),
            "representative_inputs": None if self._representative_inputs is None else
            {"value": encode_value(self._representative_inputs, store, "representative inputs")},
            "reference_outputs": None if self._reference_outputs is None else
            {m: encode_value(v, store, f"reference outputs of {m!r}") for m, v in self._reference_outputs.items()},
            "ops": {m: _info.ops_to_json(self.ops(m)) for m in self.methods},
        }
        manifest["programs"] = writer.docs
        manifest["tensors"] = store.index_json()
        if isinstance(path, (str, os.PathLike)):
            path = os.fspath(path)
        write_archive(path, dump_json(manifest), store.blob())

    def __repr__(self) -> str:
        return (f"ETRecord(methods={self.methods}, aten={self._aten.names()}, "
                f"graph_map={self._graph_map.names()}, representative_inputs="
                f"{'yes' if self._representative_inputs is not None else 'no'})")


def _per_method(maps: dict | None, encode) -> dict | None:
    return None if maps is None else {str(m): encode(v) for m, v in maps.items()}


def _as_method_dict(programs, what: str) -> dict[str, ExportedProgram]:
    if programs is None:
        return {}
    if isinstance(programs, ExportedProgram):
        return {"forward": programs}
    if isinstance(programs, Mapping):
        for name, ep in programs.items():
            if not isinstance(ep, ExportedProgram):
                raise TypeError(f"{what}[{name!r}] must be an ExportedProgram, got {type(ep).__name__}")
        return dict(programs)
    raise TypeError(f"{what} must be an ExportedProgram or a dict of them, got {type(programs).__name__}")


def _edge_methods(program) -> dict[str, ExportedProgram]:
    """An EdgeProgramManager, ExportedProgram or {method: ExportedProgram} as {method: ExportedProgram}."""
    if hasattr(program, "methods") and callable(getattr(program, "exported_program", None)):
        return {m: program.exported_program(m) for m in sorted(program.methods)}
    if hasattr(program, "exported_program") and isinstance(program.exported_program, ExportedProgram):
        return {"forward": program.exported_program}
    return _as_method_dict(program, "edge_dialect_program")


def generate_etrecord(et_record, edge_dialect_program, executorch_program, exported_program=None,
                      extra_recorded_export_modules: dict | None = None) -> None:
    """Builds an ETRecord from the compile stages and saves it to `et_record` (a path or binary file).

    edge_dialect_program: an EdgeProgramManager (from to_edge) or an ExportedProgram; executorch_program:
    the ExecutorchProgramManager (from to_executorch) or a BundledProgram; exported_program: the
    ATen program(s) from torch.export; extra_recorded_export_modules: {name: program or manager}.

    >>> import os, tempfile, torch
    >>> from etlab.compiler import to_edge
    >>> from etlab.etrecord import parse_etrecord
    >>> class AddMul(torch.nn.Module):
    ...     def forward(self, x, y):
    ...         return x * y + x
    >>> exported = torch.export.export(AddMul(), (torch.ones(2, 2), torch.ones(2, 2)))
    >>> edge = to_edge(exported)
    >>> with tempfile.TemporaryDirectory() as d:
    ...     generate_etrecord(os.path.join(d, "model.etrecord"), edge, edge.to_executorch(), exported)
    ...     record = parse_etrecord(os.path.join(d, "model.etrecord"))
    >>> record.methods
    ['forward']
    >>> {handle: [op.name for op in ops] for handle, ops in record.ops("forward").items()}  # what events join to
    {1: ['mul'], 2: ['add']}
    """
    record = ETRecord()
    record.add_exported_program(exported_program)
    record.add_edge_dialect_program(edge_dialect_program)
    record.add_executorch_program(executorch_program)
    if extra_recorded_export_modules is not None:
        record.add_extra_export_modules(extra_recorded_export_modules)
    record.save(et_record)

