"""Float and int8 static (EtlabQuantizer, PT2E) builds of a zoo model, compiled by etlab, run with
intermediate outputs: the inputs of the float-vs-quantized comparison tests."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from etlab.compiler import EtlabQuantizer
from etlab.inspector import Inspector
from etlab.models import ZOO
from tests.compiler._quant import quantize
from tests.test_end_to_end import compile_run_inspect

RUNS = 3
# per model: the op of the converted graph whose output quantization grid the planted defect
# coarsens, and the comparison row it is (the second relu; the ReLU6 of stage 2's depthwise conv)
PLANTED = {"mlp": ("relu_1", "root/relu#1"), "cnn": ("hardtanh_3", "features.2.conv.1.2/hardtanh#0")}


def plant_coarse_output(gm, node_name: str, factor: float) -> None:
    """Multiplies the scale of the quantize/dequantize pair on the output of node `node_name` by
    `factor`: its activations quantized on a grid `factor` times coarser."""
    q = torch.ops.quantized_decomposed.quantize_per_tensor.default
    dq = torch.ops.quantized_decomposed.dequantize_per_tensor.default
    node = next(n for n in gm.graph.nodes if n.name == node_name)
    quant = next(u for u in node.users if u.target is q)
    for n in (quant, *[u for u in quant.users if u.target is dq]):
        n.args = (n.args[0], float(n.args[1]) * factor, *n.args[2:])
    gm.recompile()


@dataclass
class Pair:
    """The two builds' Inspectors; each build's folder (model.pte, model.etrecord, run.etdp, run.bin)."""

    float: Inspector
    int8: Inspector
    root: Path

    def folder(self, side: str) -> Path:
        return self.root / side


def build_pair(name: str, root: Path, *, plant: float | None = None, quantizer=None) -> Pair:
    """Float and int8 builds of zoo model `name` under `root` (EtlabQuantizer() unless `quantizer`);
    `plant`: coarsen PLANTED[name]'s output grid."""
    model, inputs = ZOO[name]()
    gm = quantize(model, inputs, quantizer or EtlabQuantizer())
    if plant is not None:
        plant_coarse_output(gm, PLANTED[name][0], plant)
    out = {}
    for side, m in (("float", model), ("int8", gm)):
        (root / side).mkdir(parents=True, exist_ok=True)
        out[side] = compile_run_inspect(root / side, m, inputs, RUNS)
    return Pair(out["float"], out["int8"], root)


@functools.cache
def planted_pair(name: str, factor: float = 16.0) -> Pair:
    """`build_pair(name, plant=factor)` once per process (the inspector and visualizer tests share it),
    in a temporary folder removed at exit."""
    root = Path(tempfile.mkdtemp(prefix=f"etlab-compare-{name}-"))
    atexit.register(shutil.rmtree, root, True)
    return build_pair(name, root, plant=factor)
