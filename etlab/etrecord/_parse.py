"""parse_etrecord: reads and checks an ETRecord file; graphs are rebuilt later, on first use.

Everything but the graphs is read and checked here (so a corrupt file fails at once, with a
FormatError naming the file and the defect); the programs' JSON is checked for anything unsafe
too, but turned back into ExportedPrograms only when asked for: the Inspector's maps and op
tables need no graph.
"""

from __future__ import annotations

from etlab.errors import FormatError
from etlab.etrecord import _upstream
from etlab.etrecord._archive import MANIFEST, TENSOR_BLOB, load_json, read_any_archive
from etlab.etrecord._etrecord import FORMAT, VERSION, ETRecord, _Programs
from etlab.etrecord._graphs import ProgramReader
from etlab.etrecord._info import mark_partitions, ops_from_json
from etlab.etrecord._values import TensorTable, decode_value


def _pairs(data, where: str, what: str) -> list:
    if not isinstance(data, list) or not all(isinstance(p, list) for p in data):
        raise FormatError(f"{where}: {what} must be a list of entries")
    return data


def _int_key(value, where: str, what: str) -> int:
    if type(value) is not int or value < 0:
        raise FormatError(f"{where}: {what}: instruction id {value!r} is not a non-negative integer")
    return value


def _handles(value, where: str, what: str) -> list[int]:
    if not isinstance(value, list) or not all(type(h) is int for h in value):
        raise FormatError(f"{where}: {what}: debug handles must be a list of integers, got {str(value)[:60]}")
    return value


def _methods(manifest: dict, key: str, where: str) -> dict | None:
    value = manifest.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise FormatError(f"{where}: {key!r} must be an object keyed by method")
    return value


def _debug_handle_map(manifest, where):
    maps = _methods(manifest, "debug_handle_map", where)
    if maps is None:
        return None
    out = {}
    for method, entries in maps.items():
        what = f"debug_handle_map[{method!r}]"
        out[method] = {}
        for pair in _pairs(entries, where, what):
            if len(pair) != 2:
                raise FormatError(f"{where}: {what} has a malformed entry")
            out[method][_int_key(pair[0], where, what)] = list(_handles(pair[1], where, what))
    return out


def _delegate_map(manifest, where):
    maps = _methods(manifest, "delegate_map", where)
    if maps is None:
        return None
    out = {}
    for method, entries in maps.items():
        what = f"delegate_map[{method!r}]"
        out[method] = {}
        for entry in _pairs(entries, where, what):
            if len(entry) != 3 or not isinstance(entry[1], str):
                raise FormatError(f"{where}: {what} has a malformed entry")
            dmap = {}
            for pair in _pairs(entry[2], where, what):
                if len(pair) != 2 or not isinstance(pair[0], (int, str)) or isinstance(pair[0], bool):
                    raise FormatError(f"{where}: {what} has a malformed delegate debug identifier")
                dmap[pair[0]] = tuple(_handles(pair[1], where, what))
            out[method][_int_key(entry[0], where, what)] = {"name": entry[1], "delegate_map": dmap}
    return out


def _num_outs(manifest, where):
    maps = _methods(manifest, "instruction_id_to_num_outs_map", where)
    if maps is None:
        return None
    out = {}
    for method, entries in maps.items():
        what = f"instruction_id_to_num_outs_map[{method!r}]"
        out[method] = {}
        for pair in _pairs(entries, where, what):
            if len(pair) != 2 or type(pair[1]) is not int:
                raise FormatError(f"{where}: {what} has a malformed entry")
            out[method][_int_key(pair[0], where, what)] = pair[1]
    return out


def _program_ids(manifest, key: str, reader: ProgramReader, where: str) -> dict[str, int]:
    ids = manifest.get(key) or {}
    if not isinstance(ids, dict):
        raise FormatError(f"{where}: {key!r} must map names to program numbers")
    return {str(name): reader.check_id(index, f"{key}[{name!r}]") for name, index in ids.items()}


def parse_etrecord(etrecord_path) -> ETRecord:
    """Reads an ETRecord (a path, bytes or a binary file): etlab's own (`ETRecord.save`) or
    upstream ExecuTorch's (`executorch.devtools.etrecord`), told apart by their entries.

    Raises FormatError (naming the file and the defect) for anything that is not a well-formed
    ETRecord of either layout; never unpickles and never evaluates code from the file (upstream's
    torch.save members are read by etlab's own restricted reader, see `_torch_pickle`).
    """
    entries, where, upstream = read_any_archive(etrecord_path, _upstream.is_upstream_entry)
    if upstream:
        return _parse_upstream(entries, where)
    manifest = load_json(entries, MANIFEST, where)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise FormatError(f"{where}: not an etlab ETRecord ({MANIFEST} does not say format {FORMAT!r})")
    if manifest.get("version") != VERSION:
        raise FormatError(f"{where}: ETRecord version {manifest.get('version')!r} is not supported "
                          f"(this etlab reads version {VERSION})")
    tensors = TensorTable(manifest.get("tensors", []), bytearray(entries.get(TENSOR_BLOB, b"")), where)
    reader = ProgramReader(manifest.get("programs", []), tensors, where)

    record = ETRecord(_debug_handle_map=_debug_handle_map(manifest, where),
                      _delegate_map=_delegate_map(manifest, where),
                      _instruction_id_to_num_outs_map=_num_outs(manifest, where))
    record._edge = _Programs(loader=reader, ids=_program_ids(manifest, "edge_dialect_program", reader, where))
    record._aten = _Programs(loader=reader, ids=_program_ids(manifest, "exported_program", reader, where))
    record._graph_map = _Programs(loader=reader, ids=_program_ids(manifest, "graph_map", reader, where))
    graph_id = manifest.get("export_graph_id")
    if graph_id is not None and type(graph_id) is not int:
        raise FormatError(f"{where}: export_graph_id is not an integer")
    record.export_graph_id = graph_id
    rep = manifest.get("representative_inputs")
    if rep is not None:
        if not isinstance(rep, dict) or "value" not in rep:
            raise FormatError(f"{where}: representative_inputs is malformed")
        record._representative_inputs = decode_value(rep["value"], tensors, "representative inputs")
    refs = _methods(manifest, "reference_outputs", where)
    if refs is not None:
        record._reference_outputs = {m: decode_value(v, tensors, f"reference outputs of {m!r}")
                                     for m, v in refs.items()}
    ops = _methods(manifest, "ops", where) or {}
    record._ops = {m: ops_from_json(v, f"{where}: ops of {m!r}") for m, v in ops.items()}
    return record


def _split_program(base: str) -> tuple[str, str]:
    """An upstream program entry's base name -> (which programs it belongs to, key there)."""
    if base == _upstream.ATEN:
        return "aten", "forward"
    if base == _upstream.EDGE:
        return "edge", "forward"
    if base.startswith(_upstream.EDGE + "/"):
        return "edge", base[len(_upstream.EDGE) + 1:]
    return "graph_map", base if "/" in base else f"{base}/forward"


def _parse_upstream(entries: dict[str, bytes], where: str) -> ETRecord:
    """An upstream ETRecord's entries (names already checked) as an ETRecord; see `_upstream`.

    Read now: the maps, representative inputs, reference outputs and the edge programs' op tables;
    each program's tensors and graph when it is first used (each checked before it is used)."""
    ids: dict[str, dict[str, str]] = {"aten": {}, "edge": {}, "graph_map": {}}
    bases = sorted(_upstream.program_bases(entries))
    for name in entries:
        if name.endswith(_upstream.PARTS) and not any(name == base + part for base in bases
                                                      for part in _upstream.PARTS):
            raise FormatError(f"{where}: entry {name!r} belongs to no program in the file")
    for base in bases:
        missing = [base + p for p in _upstream.PARTS if base + p not in entries]
        if missing:
            raise FormatError(f"{where}: program {base!r} lacks {missing}")
        kind, key = _split_program(base)
        if key in ids[kind]:
            raise FormatError(f"{where}: program {base!r} is recorded twice")
        ids[kind][key] = base
    if not ids["edge"]:
        raise FormatError(f"{where}: an upstream ExecuTorch ETRecord without an edge dialect program")
    loader = _upstream.UpstreamLoader(entries, where)
    record = ETRecord(_debug_handle_map=_upstream.debug_handle_map(entries, where),
                      _delegate_map=_upstream.delegate_map(entries, where),
                      _instruction_id_to_num_outs_map=_upstream.num_outs_map(entries, where))
    record._edge = _Programs(loader=loader, ids=ids["edge"], on_load=lambda method, ep: mark_partitions(
        ep, (record._debug_handle_map or {}).get(method), (record._delegate_map or {}).get(method)))
    record._aten = _Programs(loader=loader, ids=ids["aten"])
    record._graph_map = _Programs(loader=loader, ids=ids["graph_map"])
    record.export_graph_id = _upstream.export_graph_id(entries, where)
    reps = _upstream.torch_value(entries, "representative_inputs", where)
    if reps is not None and not isinstance(reps, (list, tuple)):
        raise FormatError(f"{where}: representative_inputs is a {type(reps).__name__}, not a list of inputs")
    record._representative_inputs = reps
    refs = _upstream.torch_value(entries, "reference_outputs", where)
    if refs is not None and not (isinstance(refs, dict) and all(isinstance(m, str) for m in refs)):
        raise FormatError(f"{where}: reference_outputs is not a dict keyed by method name")
    record._reference_outputs = refs
    record._ops = {m: _upstream.program_ops(entries, base, where) for m, base in ids["edge"].items()}
    return record
