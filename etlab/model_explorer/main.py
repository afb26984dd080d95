"""The Model Explorer adapter extension: `model-explorer model.etrecord --extensions=etlab.model_explorer`.

Model Explorer imports `<extension module>.main` and registers the `Adapter` subclasses it defines;
this module is only imported there (it needs the `ai-edge-model-explorer` package, etlab's
`model-explorer` extra). The conversion itself is `etlab.model_explorer.me_graphs`; here its JSON
is handed to Model Explorer's server in its `Graph` class (`adapter_graphs`), and read into its own
graph classes strictly where the tests check it against their schema (`checked_graph_classes`).
"""

from __future__ import annotations

import gc
import sys
import threading
import weakref

from dacite import Config, from_dict
from model_explorer import Adapter, AdapterMetadata, ModelExplorerGraphs, graph_builder

from etlab.model_explorer._cache import ConversionCache, command_line_models
from etlab.model_explorer._export import me_graphs


def checked_graph_classes(response: dict) -> list[graph_builder.Graph]:
    """{"graphs": [...]} JSON -> Model Explorer's Graph dataclasses through dacite, strict: unknown keys
    and wrong types are errors (the tests hold every converted graph to this)."""
    return [from_dict(graph_builder.Graph, g, config=Config(strict=True)) for g in response["graphs"]]


def adapter_graphs(response: dict) -> list[graph_builder.Graph]:
    """The adapter's answer: Model Explorer's `Graph` class around each graph's nodes as etlab's JSON spells them.

    Model Explorer's server does one thing with an adapter's graphs: `dataclasses.asdict` and then JSON
    for the page. asdict copies a plain dict in about half the time of a GraphNode dataclass with its
    KeyValue / IncomingEdge / MetadataItem objects (and building those cost time too), so the nodes stay
    the dicts `me_graphs` made: on a 5,000-node program the server's encoding went 0.77 -> 0.43 s of CPU,
    and the page receives the same JSON (the tests read the encoded answer back into Model Explorer's
    classes, strictly, and compare)."""
    return [graph_builder.Graph(id=g["id"], nodes=g["nodes"], groupNodeAttributes=g.get("groupNodeAttributes"),
                                groupNodeConfigs=[graph_builder.GroupNodeConfig(**c) for c in g["groupNodeConfigs"]]
                                if "groupNodeConfigs" in g else None) for g in response["graphs"]]


RESUME_AFTER_S = 30.0  # far beyond Model Explorer's encoding of the largest answer (~1 s for 5,000 nodes)


def collector_paused_until_freed(convert):
    """`convert()`'s graphs, built and then encoded by Model Explorer's server with the cyclic garbage
    collector paused: it resumes when the graphs are freed (or at once if `convert` raises).

    Model Explorer's server encodes an adapter's answer right after `convert` returns (`dataclasses.asdict`
    of every graph, then JSON) and drops it. The answer and its copy are ~10^5 acyclic containers each,
    and allocating them makes CPython run collections over the whole server heap (torch is imported
    there) again and again: on a 5,000-node record about a third of the encoding's CPU, on top of one
    collection of the answer itself when the adapter resumed the collector on return. Reference counting
    frees all of it as usual; the collector is left alone when it was off already (then the caller owns
    it). A caller holding the answer (a test, a notebook, a cache) keeps it paused until it lets go, or
    for RESUME_AFTER_S at most: a held answer must not turn the process's collector off for good."""
    if not gc.isenabled():
        return convert()
    gc.disable()
    try:
        graphs = convert()
    except BaseException:
        gc.enable()
        raise
    if not graphs:
        gc.enable()
        return graphs
    backstop = threading.Timer(RESUME_AFTER_S, gc.enable)
    backstop.daemon = True
    backstop.start()

    def resume() -> None:
        backstop.cancel()
        gc.enable()

    weakref.finalize(graphs[0], resume)
    return graphs


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
        """Model Explorer's adapter entry: the graphs of a .pte or .etrecord file in Model Explorer's graph
        classes. The JSON is kept per file content (`CONVERSIONS`); the classes around it are new per call."""
        return {"graphs": collector_paused_until_freed(lambda: adapter_graphs(CONVERSIONS.get(model_path)))}


CONVERSIONS = ConversionCache(me_graphs, weigh=lambda response: sum(len(g["nodes"]) for g in response["graphs"]))
"""The adapter's conversions by file content, in this process (`_cache`)."""


def _preload_command_line() -> None:
    """In Model Explorer's own command (`model-explorer FILE --extensions=etlab.model_explorer`, which imports
    this module while its server starts), converts the files it names before the page asks for them."""
    if "model_explorer.cmdline" in sys.modules:
        CONVERSIONS.preload(command_line_models(sys.argv[1:]))


_preload_command_line()
