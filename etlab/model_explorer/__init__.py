"""etlab's programs and runs in Google's Model Explorer (`pip install 'etlab[model-explorer]'`).

Model Explorer draws large graphs with nested layers and colours nodes from "node data" overlays.
This package gives it what etlab knows, for etlab's files and upstream's alike:

- `me_graphs(path_or_inspector)`: Model Explorer's graph JSON of a `.pte` (instruction graphs) or a
  `.etrecord` / Inspector (ATen and Edge programs: module layers, delegated partitions as layers named
  by backend, tensor shapes on edges, the source line and the delegation explainer's reason per node);
- `export(inspector, out_dir)`: those graphs plus overlays of the run (latency p50/p90, share of the
  run, numeric gap, output bytes) as node-data files keyed to the same node ids;
  `etlab export-me RUN.etdp --etrecord R -o DIR` from the shell;
- the adapter extension (`main.py`): `model-explorer model.etrecord --extensions=etlab.model_explorer`
  opens the files directly; a `.etrecord` is drawn from its programs' torch.export JSON
  (`etlab.etrecord.record_graphs`), without rebuilding them with torch, into the same graphs; the
  files the command names are converted while its server starts, and conversions are kept by file
  content, so later opens of an unchanged file skip them (`_cache`; `ETLAB_ME_CACHE=0` turns it off);
- `show(inspector)`: Model Explorer in a notebook cell, with the latency overlay.
"""

from etlab.model_explorer._cli import export_me_main
from etlab.model_explorer._export import export, load_graphs, me_graphs, open_command
from etlab.model_explorer._graphs import graph_id, to_me_graph
from etlab.model_explorer._node_data import OVERLAY_KEYS, OVERLAYS, node_data
from etlab.model_explorer._show import show

__all__ = ["OVERLAYS", "OVERLAY_KEYS", "export", "export_me_main", "graph_id", "load_graphs", "me_graphs", "node_data",
           "open_command", "show", "to_me_graph"]


def _register() -> None:
    """`Inspector.show(engine="model-explorer")` and `Inspector.to_model_explorer(dir)` come here
    (etlab.facts.display's engine registry: the Inspector, a lower layer, never imports this one)."""
    from etlab.facts import display

    display.register("etlab.inspector.Inspector", show=show, export=export, engine="model-explorer")


_register()
