"""What the Inspector joins a run with, read from an ETRecord file without importing torch.

`etlab inspect run.etdp --etrecord model.etrecord` needs the debug-handle, delegate and output-count
maps and the op tables: all JSON in an etlab ETRecord's manifest. Building an `ETRecord` (whose
module, like the graph and tensor code, imports torch) would cost more than the rest of the command
together. So `read_program_info` reads and checks the manifest's maps and op tables itself, with the
same checks and messages as `parse_etrecord`, and builds the `ProgramInfo` from them; whatever
needs torch is left to the full `parse_etrecord` path, run once, on first use, from the same
entries (no second read of the file): the recorded graphs (`ProgramInfo.graphs`), the AOT
intermediate outputs (the numeric gap replays the graph) and the reference outputs (tensors). The
programs' JSON and the tensor index are checked then, before anything of them is used.

Upstream ExecuTorch's ETRecords keep their op tables in the programs' torch.export JSON, read here
without torch too (`_upstream_json.upstream_program_facts`: op types from the targets' names, whether
torch registers each operator is checked when a graph is rebuilt); their values (torch.save members)
and graphs are read on first use.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from etlab.errors import FormatError
from etlab.etrecord._archive import etlab_manifest, read_any_archive
from etlab.etrecord._maps import (
    debug_handle_map,
    delegate_map,
    main_method,
    method_info,
    num_outs_map,
    ops_from_json,
    per_method,
    program_ids,
)
from etlab.etrecord._upstream_json import upstream_program_facts
from etlab.facts.program_info import MethodInfo, ProgramInfo


class _FullRecord:
    """The ETRecord of the same entries, parsed (with torch) on first use only."""

    def __init__(self, entries: dict[str, bytes], where: str, upstream: bool):
        self._args = (entries, where, upstream)
        self._record = None

    def record(self):
        if self._record is None:
            from etlab.etrecord._parse import record_from_entries

            self._record = record_from_entries(*self._args)
        return self._record


class _LazyGraphs(Mapping):
    """`ProgramInfo.graphs` of the full record, which is parsed when a graph is first looked up."""

    def __init__(self, full: _FullRecord):
        self._full = full
        self._graphs = None

    def _get(self) -> Mapping:
        if self._graphs is None:
            self._graphs = self._full.record().program_info().graphs
        return self._graphs

    def __getitem__(self, key):
        return self._get()[key]

    def __iter__(self) -> Iterator:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())


class _LazyOutputs(Sequence):
    """One method's reference outputs (per bundled input), decoded from the full record when used."""

    def __init__(self, full: _FullRecord, method: str):
        self._full, self._method = full, method

    def _get(self) -> list:
        return (self._full.record()._reference_outputs or {}).get(self._method) or []

    def __getitem__(self, index):
        return self._get()[index]

    def __len__(self) -> int:
        return len(self._get())


def _any_name(_name: str) -> bool:
    return True  # upstream entry names are checked by the full reader, which upstream files go to


def read_program_info(source) -> ProgramInfo:
    """The `ProgramInfo` of an ETRecord (a path, bytes or a binary file), as
    `parse_etrecord(source).program_info()` gives it, without importing torch for an etlab ETRecord.

    Raises FormatError (naming the file and the defect) for a malformed archive, manifest, map or op
    table at once; a defect in a recorded program or tensor when that program or tensor is first used.
    """
    entries, where, upstream = read_any_archive(source, _any_name)
    full = _FullRecord(entries, where, upstream)
    if upstream:
        return lazy_program_info(full, *upstream_program_facts(entries, where))
    manifest = etlab_manifest(entries, where)
    programs = manifest.get("programs", [])
    if not isinstance(programs, list):
        raise FormatError(f"{where}: 'programs' must be a list")
    handles, delegates = debug_handle_map(manifest, where) or {}, delegate_map(manifest, where) or {}
    num_outs = num_outs_map(manifest, where) or {}
    edge = program_ids(manifest, "edge_dialect_program", len(programs), where)
    for key in ("exported_program", "graph_map"):
        program_ids(manifest, key, len(programs), where)
    if manifest.get("export_graph_id") is not None and type(manifest["export_graph_id"]) is not int:
        raise FormatError(f"{where}: export_graph_id is not an integer")
    rep = manifest.get("representative_inputs")
    if rep is not None and (not isinstance(rep, dict) or "value" not in rep):
        raise FormatError(f"{where}: representative_inputs is malformed")
    refs = per_method(manifest, "reference_outputs", where) or {}
    ops_json = per_method(manifest, "ops", where) or {}
    ops = {m: ops_from_json(v, f"{where}: ops of {m!r}") for m, v in ops_json.items()}
    names = list(dict.fromkeys([*edge, *handles]))
    if any(m in edge and m not in ops for m in names):  # op tables to be collected from the graphs
        return full.record().program_info()
    main = main_method(names)
    with_inputs = {m for m in names if (rep is not None and m == main) or (
        m in edge and isinstance(programs[edge[m]], dict) and programs[edge[m]].get("example_inputs") is not None)}
    return lazy_program_info(full, names, (handles, delegates, num_outs), ops, with_inputs,
                             {m for m in names if refs.get(m) is not None})


def lazy_program_info(full: _FullRecord, names: list[str], maps: tuple[dict, dict, dict], ops: dict,
                      with_inputs: set[str], with_outputs: set[str]) -> ProgramInfo:
    """The ProgramInfo of methods `names` from their maps (debug handles, delegates, output counts) and
    op tables; the AOT replay (methods `with_inputs`), reference outputs (`with_outputs`) and graphs
    come from the full record, parsed when first used."""
    handles, delegates, num_outs = maps
    methods: dict[str, MethodInfo] = {}
    for m in names:
        aot = (lambda m=m: full.record().intermediate_outputs(m)) if m in with_inputs else None
        outputs = _LazyOutputs(full, m) if m in with_outputs else None
        methods[m] = method_info(handles.get(m), delegates.get(m), num_outs.get(m), ops.get(m, {}), outputs, aot)
    return ProgramInfo(methods=methods, graphs=_LazyGraphs(full))
