"""The Model Explorer adapter extension: `model-explorer model.etrecord --extensions=etlab.model_explorer`.

Model Explorer imports `<extension module>.main` and registers the `Adapter` subclasses it defines;
this module is only imported there (it needs the `ai-edge-model-explorer` package, etlab's
`model-explorer` extra). The conversion itself is `etlab.model_explorer.me_graphs`; here its JSON
becomes Model Explorer's own graph classes, which also checks it against their schema.
"""

from __future__ import annotations

from dacite import Config, from_dict
from model_explorer import Adapter, AdapterMetadata, ModelExplorerGraphs, graph_builder

from etlab.model_explorer._export import me_graphs


def checked_graph_classes(response: dict) -> list[graph_builder.Graph]:
    """{"graphs": [...]} JSON -> Model Explorer's Graph dataclasses through dacite, strict: unknown keys
    and wrong types are errors (the tests hold every converted graph to this)."""
    return [from_dict(graph_builder.Graph, g, config=Config(strict=True)) for g in response["graphs"]]


def _node(n: dict) -> graph_builder.GraphNode:
    kv = graph_builder.KeyValue
    return graph_builder.GraphNode(
        id=n["id"], label=n["label"], namespace=n["namespace"],
        attrs=[kv(key=a["key"], value=a["value"]) for a in n["attrs"]],
        incomingEdges=[graph_builder.IncomingEdge(**e) for e in n["incomingEdges"]],
        outputsMetadata=[graph_builder.MetadataItem(id=m["id"], attrs=[kv(key=a["key"], value=a["value"])
                                                                      for a in m["attrs"]])
                         for m in n["outputsMetadata"]],
        style=graph_builder.GraphNodeStyle(**n["style"]) if "style" in n else None)


def to_graph_classes(response: dict) -> list[graph_builder.Graph]:
    """The same classes as `checked_graph_classes`, built directly from the keys etlab writes (dacite's
    generic walk took longer than the conversion itself on a 5,000-node graph)."""
    return [graph_builder.Graph(
        id=g["id"], nodes=[_node(n) for n in g["nodes"]], groupNodeAttributes=g.get("groupNodeAttributes"),
        groupNodeConfigs=[graph_builder.GroupNodeConfig(**c) for c in g["groupNodeConfigs"]]
        if "groupNodeConfigs" in g else None) for g in response["graphs"]]


class EtlabAdapter(Adapter):
    """Opens ExecuTorch `.pte` programs (instruction graphs) and `.etrecord` files (ATen and Edge
    programs, module layers, delegated partitions and the reason each other node was left out)."""

    metadata = AdapterMetadata(
        id="etlab_executorch",
        name="ExecuTorch (etlab)",
        description="ExecuTorch .pte programs and .etrecord files, read by etlab",
        source_repo="https://github.com/etlab/etlab",
        fileExts=["pte", "etrecord"],
    )

    def __init__(self):
        super().__init__()

    def convert(self, model_path: str, settings: dict) -> ModelExplorerGraphs:
        """Model Explorer's adapter entry: the graphs of a .pte or .etrecord file in Model Explorer's graph classes."""
        return {"graphs": to_graph_classes(me_graphs(model_path))}
