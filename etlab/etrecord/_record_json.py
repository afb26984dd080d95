"""Which recorded programs an ETRecord file holds, as `JsonProgram`s (`_program_json`), without torch.

`record_graphs(path)` reads a record of either layout and answers what the views ask an
`ETRecord` for (`resolve_sources`): per method its edge program and ATen program, chosen as the
record's attributes choose them (the edge program of the method, or the only one; the ATen program
of the main method), with the maps that mark an upstream pre-lowering edge graph's partitions.
Programs are read on first use, each once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from etlab.errors import FormatError
from etlab.etrecord import _upstream_json as up
from etlab.etrecord._archive import _check_name, etlab_manifest, load_json, read_any_archive
from etlab.etrecord._maps import debug_handle_map, delegate_map, main_method, program_ids
from etlab.etrecord._program_json import JsonProgram, etlab_program, upstream_program

# Names under which a record's graph map would hold a program the views draw (visualizer GRAPH_KEYS).
_VIEW_KEYS = ("exported_program", "aten_dialect_program", "base", "aten", "edge_dialect_exported_program",
              "edge_dialect_program", "edge", "et_dialect_graph_module", "et_dialect_program", "executorch_program",
              "runtime")


@dataclass
class RecordGraphs:
    """The programs of one ETRecord file, read from JSON on demand."""

    where: str
    upstream: bool
    edge_ids: dict  # method -> program id (etlab: index; upstream: entry base name)
    aten_ids: dict
    graph_map_keys: list[str]
    debug_handle_map: dict = field(default_factory=dict)
    delegate_map: dict = field(default_factory=dict)
    _read: dict = field(default_factory=dict)
    _load: object = None

    @property
    def methods(self) -> list[str]:
        """The methods of the record: those with an edge program, then those with only debug maps."""
        return list(dict.fromkeys([*self.edge_ids, *self.debug_handle_map]))

    def graph_map_shadows(self, method: str) -> bool:
        """Whether the graph map names a program the views would take instead of the edge / ATen one."""
        return any(k in (key, f"{key}/{method}") or k.startswith(f"{key}/") for k in self.graph_map_keys
                   for key in _VIEW_KEYS)

    def _program(self, pid) -> JsonProgram:
        if pid not in self._read:
            self._read[pid] = self._load(pid)
        return self._read[pid]

    def edge(self, method: str) -> JsonProgram | None:
        """The edge program `ETRecord.edge_dialect_program` gives for `method` (the only one if one)."""
        names = list(self.edge_ids)
        pid = self.edge_ids[names[0]] if len(names) == 1 else self.edge_ids.get(method)
        return self._program(pid) if pid is not None else None

    def aten(self) -> JsonProgram | None:
        """The ATen program `ETRecord.exported_program` gives (the main method's)."""
        main = main_method(list(self.aten_ids))
        return self._program(self.aten_ids[main]) if main is not None else None


def record_graphs(source) -> RecordGraphs:
    """The programs of an ETRecord (path, bytes or binary file) of either layout; FormatError naming
    the file and the member for anything malformed (each program when it is read)."""
    entries, where, upstream = read_any_archive(source, lambda _name: True)
    if upstream:
        for name in entries:
            _check_name(name, where, up.is_upstream_entry)
        ids = up.upstream_ids(entries, where)
        out = RecordGraphs(where, True, ids["edge"], ids["aten"], list(ids["graph_map"]),
                           up.debug_handle_map(entries, where) or {}, up.delegate_map(entries, where) or {})
        out._load = lambda base: upstream_program(load_json(entries, base, where), f"{where}: program {base!r}")
        return out
    manifest = etlab_manifest(entries, where)
    programs = manifest.get("programs", [])
    if not isinstance(programs, list):
        raise FormatError(f"{where}: 'programs' must be a list")
    n = len(programs)
    out = RecordGraphs(where, False, program_ids(manifest, "edge_dialect_program", n, where),
                       program_ids(manifest, "exported_program", n, where),
                       list(program_ids(manifest, "graph_map", n, where)),
                       debug_handle_map(manifest, where) or {}, delegate_map(manifest, where) or {})
    out._load = lambda index: etlab_program(programs, index, where)
    return out
