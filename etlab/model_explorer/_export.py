"""Which graphs a file or an Inspector gives Model Explorer, and writing them with their overlays.

- a `.pte`: each method's instruction graph (values as edges with their planned shapes, delegate calls
  as nodes in the backend's colour), read from the verified file alone;
- a `.etrecord` (etlab's or upstream's): the ATen and Edge programs of each method, module nesting as
  layers, every delegated partition a layer named by its backend, and for each node left out of a
  partition the delegation explainer's reason; drawn from the record's JSON (`_record_graphs`), the
  same graphs the views draw from the rebuilt programs, in a fraction of the time;
- an Inspector (a run with its record): the same graphs, with the run's latency and numeric gap.
"""

from __future__ import annotations

import gc
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from etlab.devtools import get_delegation_info
from etlab.errors import FormatError
from etlab.model_explorer._delegate_layers import expand_xnnpack_calls
from etlab.model_explorer._graphs import to_me_graph
from etlab.model_explorer._node_data import OVERLAYS, node_data, quant_node_data
from etlab.model_explorer._record_graphs import (
    aten_handles_of,
    build_json_graph_model,
    explainer_rows,
    partition_marks,
)
from etlab.schema import write_atomic
from etlab.visualizer import GraphModel, build_graph_model, graph_models, resolve_sources

KINDS = ("edge", "aten", "runtime")  # the lowered graph first: what Model Explorer opens on


def _is_inspector(obj) -> bool:
    return hasattr(obj, "event_blocks") and hasattr(obj, "to_dataframe")


def _record_methods(record) -> list[str]:
    methods = list(getattr(record, "methods", None) or ())
    return methods or ["forward"]


def _methods_of(obj) -> list[str]:
    """The methods of an ETRecord, or of an Inspector's program (its record's), "forward" when unknown."""
    if _is_inspector(obj):
        return _record_methods(obj.program_info) if obj.program_info is not None else ["forward"]
    return _record_methods(obj)


def _explainer_rows(edge_program) -> dict[str, dict[str, str]]:
    """Node name -> attribute rows for a node left out of delegation (category, reason, hint)."""
    try:
        table = get_delegation_info(edge_program).get_node_delegation_dataframe(delegated=False)
    except (TypeError, ValueError, AttributeError):  # a graph the explainer cannot read: no rows, not a failure
        return {}
    out = {}
    for row in table.itertuples():
        if row.category:
            out[str(row.node)] = {"delegation": f"left out ({row.category}): {row.reason}",
                                  **({"what to do": row.hint} if row.hint else {})}
    return out


def _extras(model: GraphModel, sources) -> dict[int, dict[str, str]]:
    if model.kind != "edge" or sources.edge is None:
        return {}
    return _extras_of(model, _explainer_rows(sources.edge))


def _extras_of(model: GraphModel, rows: dict[str, dict[str, str]]) -> dict[int, dict[str, str]]:
    """Node id -> the explainer's rows, for the op nodes outside the graph's partitions."""
    if not rows:
        return {}
    partitioned = {g.id for g in model.groups if g.kind == "delegate"}
    out = {}
    for n in model.nodes:
        if n.name in rows and n.kind == "op" and n.group not in partitioned and n.id not in out:
            out[n.id] = rows[n.name]
    return out


def recorded_graphs(obj, kinds=None, method: str | None = None) -> list[tuple[GraphModel, dict]]:
    """(GraphModel, extra attribute rows per node id) for an Inspector or an ETRecord, per method and
    kind (every kind it records unless `kinds` is given)."""
    out = []
    for m in [method] if method else _methods_of(obj):
        sources = resolve_sources(obj, m)
        wanted = [k for k in (kinds or KINDS) if k in sources.available()]
        if kinds and len(wanted) < len(kinds):
            missing = sorted(set(kinds) - set(wanted))
            raise ValueError(f"no {', '.join(missing)} graph of method {m!r}; available: {sources.available()}")
        for model in graph_models(sources, wanted):
            out.append((model, _extras(model, sources)))
    return out


def record_file_graphs(path, kinds=None, method: str | None = None) -> list[tuple[GraphModel, dict]]:
    """`recorded_graphs(parse_etrecord(path), kinds, method)`, drawn from the record's JSON without
    rebuilding its programs (`_record_graphs`); a record that reader does not mirror (a graph map
    naming the views' programs, a node without a result) or whose explainer rows need etlab's XNNPACK
    rules (upstream's XNNPACK records: nodes left out without a recorded reason; the rules read torch.fx
    nodes) is rebuilt and drawn by the views' builder."""
    from etlab.etrecord import UnsupportedGraph, record_graphs

    graphs = record_graphs(path)
    try:
        return _json_graphs(graphs, kinds, method)
    except UnsupportedGraph:
        from etlab.etrecord import parse_etrecord

        return recorded_graphs(parse_etrecord(path), kinds, method)


def _json_graphs(graphs, kinds, method: str | None) -> list[tuple[GraphModel, dict]]:
    from etlab.etrecord import UnsupportedGraph

    out = []
    for m in [method] if method else (graphs.methods or ["forward"]):
        if graphs.graph_map_shadows(m):
            raise UnsupportedGraph(f"{graphs.where}: the graph map holds a program the views would draw")
        edge, aten = graphs.edge(m), graphs.aten()
        available = [k for k, p in (("aten", aten), ("edge", edge)) if p is not None]
        if not available:
            raise ValueError(f"no graphs of method {m!r} in {graphs.where}")
        wanted = [k for k in (kinds or KINDS) if k in available]
        if kinds and len(wanted) < len(kinds):
            missing = sorted(set(kinds) - set(wanted))
            raise ValueError(f"no {', '.join(missing)} graph of method {m!r}; available: {available}")
        marks = partition_marks(edge, graphs.debug_handle_map.get(m), graphs.delegate_map.get(m)) \
            if graphs.upstream and edge is not None else {}
        for kind in wanted:
            if kind == "edge":
                rows = explainer_rows(edge, marks)
                if rows is None:  # etlab's XNNPACK rules judge the nodes left out: they read the rebuilt graph
                    raise UnsupportedGraph(f"{graphs.where}: nodes left out of XNNPACK without a recorded reason")
                model = build_json_graph_model(edge, "edge", method=m, partitions=marks)
                out.append((model, _extras_of(model, rows)))
            else:
                handles_of = aten_handles_of(edge) if edge is not None and edge is not aten else None
                out.append((build_json_graph_model(aten, "aten", method=m, handles_of=handles_of), {}))
    return out


def pte_graphs(pte, method: str | None = None) -> list[GraphModel]:
    """Each method's instruction graph of a parsed .pte (`etlab.schema.program.PteFile`), XNNPACK calls
    as layers of the nodes their payload runs (`_delegate_layers`)."""
    from etlab.jupyter import instruction_graph

    plans = list(pte.program.execution_plan or ())
    if method is not None:
        plans = [p for p in plans if p.name == method]
        if not plans:
            names = [str(p.name) for p in pte.program.execution_plan or ()]
            raise ValueError(f"no method {method!r} in the program; methods are {names}")
    return [expand_xnnpack_calls(instruction_graph(p), pte, p) for p in plans]


def load_graphs(source, *, kinds=None, method: str | None = None) -> list[tuple[GraphModel, dict]]:
    """The graphs of a `.pte` or `.etrecord` path, an ETRecord, or an Inspector (see module doc).
    Raises FormatError naming the file for anything that is not one of them."""
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        suffix = path.suffix.lower()
        if suffix == ".pte":
            from etlab.schema import load_pte

            return [(m, {}) for m in pte_graphs(load_pte(path), method)]
        if suffix == ".etrecord":
            return record_file_graphs(path, kinds, method)
        raise FormatError(f"{path}: Model Explorer's etlab adapter opens .pte and .etrecord files, "
                          f"not {suffix or 'a file without a suffix'}")
    return recorded_graphs(source, kinds, method)


@contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic garbage collector paused for the block (left alone when the caller disabled it).

    Converting a large graph creates ~10^5 container objects (the decoded JSON, the graph model, Model
    Explorer's dataclasses) and none of them forms a cycle, yet their allocation makes CPython run its
    collections again and again over all of them: on a 5,000-node program that was over half of the
    adapter's CPU time (2.2 s -> 0.6 s). Reference counting still frees everything as usual."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def me_graphs(source, *, kinds=None, method: str | None = None) -> dict:
    """Model Explorer's adapter response as plain JSON: {"graphs": [graph, ...]}."""
    with paused_gc():
        return {"graphs": [to_me_graph(m, extra) for m, extra in load_graphs(source, kinds=kinds, method=method)]}


def _write_json(path: Path, data) -> None:
    write_atomic(path, json.dumps(data, allow_nan=False).encode())


def quant_graph(report) -> GraphModel:
    """The float graph of a QuantReport, the graph its SQNR overlays are keyed to ("quantization (ATen)")."""
    if report.float_graph is None:
        raise ValueError("this quantization report has no float graph to draw")
    return build_graph_model(report.float_graph, "aten", title="float model (quantization error)",
                             method="quantization")


def export(source, out_dir, *, kinds=None, method: str | None = None, quant_report=None) -> dict[str, Path]:
    """Writes `graphs.json` (Model Explorer's graph JSON) and one node-data file per overlay that has
    values (`latency_p50.json`, `latency_p90.json`, `run_share.json`, `numeric_gap.json`,
    `output_bytes.json`) into `out_dir`, which must exist. Returns {name: path}. With `quant_report`
    (`etlab.devtools.quantization_report(...)`), also its float graph and SQNR overlays
    (`quant_local_sqnr.json`, `quant_sqnr.json`, `quant_input_sqnr.json`).

    Open them with `model-explorer OUT/graphs.json --node_data_paths=OUT/latency_p50.json`, or the
    record itself with `--extensions=etlab.model_explorer` (see `open_command`)."""
    out = Path(out_dir)
    if not out.is_dir():
        raise FileNotFoundError(f"output folder {out} does not exist (create it first)")
    with paused_gc():
        models = load_graphs(source, kinds=kinds, method=method)
        quant = quant_graph(quant_report) if quant_report is not None else None
        if quant is not None:
            models.append((quant, {}))
        graphs = {"graphs": [to_me_graph(m, extra) for m, extra in models]}
    written = {"graphs": out / "graphs.json"}
    _write_json(written["graphs"], graphs)
    for overlay in OVERLAYS:
        data = node_data([m for m, _ in models], overlay)
        if data:
            written[overlay.key] = out / f"{overlay.key}.json"
            _write_json(written[overlay.key], data)
    for key, data in (quant_node_data(quant, quant_report) if quant is not None else {}).items():
        written[key] = out / f"{key}.json"
        _write_json(written[key], data)
    return written


def open_command(written: dict[str, Path], overlay: str = "latency_p50") -> list[str]:
    """The command line that opens what `export` wrote in Model Explorer, with one overlay if written."""
    cmd = ["model-explorer", str(written["graphs"])]
    if overlay in written:
        cmd.append(f"--node_data_paths={written[overlay]}")
    return cmd
