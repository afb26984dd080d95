"""parse_etrecord: reads and checks an ETRecord file; graphs are rebuilt later, on first use.

Everything but the graphs is read and checked here (so a corrupt file fails at once, with a
FormatError naming the file and the defect); the programs' JSON is checked for anything unsafe
too, but turned back into ExportedPrograms only when asked for: the Inspector's maps and op
tables need no graph.
"""

from __future__ import annotations

from etlab.errors import FormatError
from etlab.etrecord import _upstream
from etlab.etrecord._archive import TENSOR_BLOB, _check_name, etlab_manifest, read_any_archive
from etlab.etrecord._etrecord import ETRecord, _Programs
from etlab.etrecord._graphs import ProgramReader
from etlab.etrecord._info import mark_partitions
from etlab.etrecord._maps import debug_handle_map, delegate_map, num_outs_map, ops_from_json, per_method, program_ids
from etlab.etrecord._upstream_json import upstream_ids
from etlab.etrecord._values import TensorTable, decode_value


def parse_etrecord(etrecord_path) -> ETRecord:
    """Reads an ETRecord (a path, bytes or a binary file): etlab's own (`ETRecord.save`) or
    upstream ExecuTorch's (`executorch.devtools.etrecord`), told apart by their entries.

    Raises FormatError (naming the file and the defect) for anything that is not a well-formed
    ETRecord of either layout; never unpickles and never evaluates code from the file (upstream's
    torch.save members are read by etlab's own restricted reader, see `_torch_pickle`).

    >>> parse_etrecord(b"not an etrecord")
    Traceback (most recent call last):
    etlab.errors.FormatError: <ETRecord bytes>: not an ETRecord: not a zip file
    """
    entries, where, upstream = read_any_archive(etrecord_path, _upstream.is_upstream_entry)
    return record_from_entries(entries, where, upstream)


def record_from_entries(entries: dict[str, bytes], where: str, upstream: bool) -> ETRecord:
    """The ETRecord of an archive's entries (`read_any_archive`), of either layout. Upstream entry
    names are checked here too (a reader that took the archive without checking them: `_quick`)."""
    if upstream:
        for name in entries:
            _check_name(name, where, _upstream.is_upstream_entry)
        return _parse_upstream(entries, where)
    return _parse_etlab(entries, where)


def _parse_etlab(entries: dict[str, bytes], where: str) -> ETRecord:
    manifest = etlab_manifest(entries, where)
    tensors = TensorTable(manifest.get("tensors", []), bytearray(entries.get(TENSOR_BLOB, b"")), where)
    reader = ProgramReader(manifest.get("programs", []), tensors, where)

    record = ETRecord(_debug_handle_map=debug_handle_map(manifest, where),
                      _delegate_map=delegate_map(manifest, where),
                      _instruction_id_to_num_outs_map=num_outs_map(manifest, where))
    n = len(reader.docs)
    record._edge = _Programs(loader=reader, ids=program_ids(manifest, "edge_dialect_program", n, where))
    record._aten = _Programs(loader=reader, ids=program_ids(manifest, "exported_program", n, where))
    record._graph_map = _Programs(loader=reader, ids=program_ids(manifest, "graph_map", n, where))
    graph_id = manifest.get("export_graph_id")
    if graph_id is not None and type(graph_id) is not int:
        raise FormatError(f"{where}: export_graph_id is not an integer")
    record.export_graph_id = graph_id
    rep = manifest.get("representative_inputs")
    if rep is not None:
        if not isinstance(rep, dict) or "value" not in rep:
            raise FormatError(f"{where}: representative_inputs is malformed")
        record._representative_inputs = decode_value(rep["value"], tensors, "representative inputs")
    refs = per_method(manifest, "reference_outputs", where)
    if refs is not None:
        record._reference_outputs = {m: decode_value(v, tensors, f"reference outputs of {m!r}")
                                     for m, v in refs.items()}
    ops = per_method(manifest, "ops", where) or {}
    record._ops = {m: ops_from_json(v, f"{where}: ops of {m!r}") for m, v in ops.items()}
    return record


def _parse_upstream(entries: dict[str, bytes], where: str) -> ETRecord:
    """An upstream ETRecord's entries (names already checked) as an ETRecord; see `_upstream`.

    Read now: the maps, representative inputs, reference outputs and the edge programs' op tables;
    each program's tensors and graph when it is first used (each checked before it is used)."""
    ids = upstream_ids(entries, where)
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
