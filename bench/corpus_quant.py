"""The quantization report on corpus models from the libraries (issue 28): it never ranks a bit-exact op.

    .venv/bin/python bench/corpus_quant.py [--models tv_swin_t ...] [--no-runtime] [--no-write]

Per model: the float graph quantized with etlab's XNNPACK quantizer (int8, per-channel weights) on the
entry's example inputs, then `quantization_report` with torch's run of the converted graph
(runtime=False) and with etlab's runtime's values (runtime=True). Checked on every report:

- no ranked layer has an infinite SQNR (local, or total where the local re-run is not possible): an op
  whose output quantization did not change is bit-exact and has nothing to rank;
- no layer kept in float (the shifted-window mask's new_zeros / slice / masked_fill in Swin) is ranked;
- both runs rank the same worst layers (the top 3 by local SQNR).

Writes the `## corpus quantization report` section of bench/RESULTS.md unless --no-write or --models.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from _common import write_section  # noqa: E402

from etlab.compiler import EtlabQuantizer  # noqa: E402
from etlab.devtools import quantization_report  # noqa: E402
from etlab.devtools._quant_debug import float_graph_of  # noqa: E402
from etlab.devtools._quant_debug_fix import quantize_pt2e  # noqa: E402
from etlab.models.corpus import CORPUS  # noqa: E402

# Swin-style models build their shifted-window mask in float with in-place slice writes (what issue 28
# saw ranked), plus a conv net and a plain ViT for contrast.
MODELS = ("tv_swin_t", "tv_swin_v2_t", "timm_swin_tiny_patch4_window7_224", "swin", "tv_mobilenet_v2",
          "timm_vit_tiny_patch16_224")
TOP = 3


@dataclass
class Outcome:
    """One model's reports (runtime False / True) and what was wrong with them."""

    name: str
    layers: int = 0
    ranked: int = 0
    exact_unranked: int = 0  # quantized layers whose output is bit-exact: not ranked
    float_layers: int = 0
    worst: dict[bool, list[str]] = field(default_factory=dict)
    seconds: dict[bool, float] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    error: str = ""


def _effective_sqnr(row) -> float:
    local = row["local_sqnr"]
    return row["sqnr"] if isinstance(local, float) and math.isnan(local) else local


def check_report(outcome: Outcome, report, runtime: bool) -> None:
    layers = report.layers
    ranked = layers[layers["ranked"].astype(bool)]
    where = "runtime" if runtime else "torch"
    inf_ranked = [r["layer"] for _, r in ranked.iterrows() if _effective_sqnr(r) == math.inf]
    if inf_ranked:
        outcome.problems.append(f"{where}: bit-exact layers ranked: {', '.join(inf_ranked[:5])}")
    float_ranked = list(ranked[~ranked["quantized"].astype(bool)]["layer"])
    if float_ranked:
        outcome.problems.append(f"{where}: float layers ranked: {', '.join(float_ranked[:5])}")
    worst = report.worst(TOP)
    if worst["local_sqnr"].isin([math.inf, -math.inf]).any() and not runtime:
        outcome.problems.append(f"{where}: an infinite SQNR among the worst layers")
    outcome.worst[runtime] = list(worst["layer"])
    if not runtime:
        quantized = layers["quantized"].astype(bool)
        exact = layers.apply(lambda r: _effective_sqnr(r) == math.inf, axis=1)
        outcome.layers, outcome.ranked = len(layers), len(ranked)
        outcome.exact_unranked = int((quantized & exact & ~layers["ranked"].astype(bool)).sum())
        outcome.float_layers = int((~quantized).sum())


def measure(name: str, runtime: bool) -> Outcome:
    outcome = Outcome(name)
    try:
        module, methods = CORPUS[name].build()
        inputs = tuple(methods["forward"])
        with torch.no_grad():
            float_gm = float_graph_of(module, inputs)
            quantized = quantize_pt2e(float_gm, EtlabQuantizer(), [inputs])
            for rt in ((False, True) if runtime else (False,)):
                t = time.perf_counter()
                report = quantization_report(module, quantized, inputs, runtime=rt)
                outcome.seconds[rt] = time.perf_counter() - t
                check_report(outcome, report, rt)
        if runtime and outcome.worst.get(False) != outcome.worst.get(True):
            outcome.problems.append(f"worst {TOP} differ: torch {outcome.worst.get(False)}, runtime "
                                    f"{outcome.worst.get(True)}")
    except Exception as e:
        outcome.error = f"{type(e).__name__}: {e}".splitlines()[0][:200].replace("|", "/")
    return outcome


def render(outcomes: list[Outcome], runtime: bool) -> str:
    ok = [o for o in outcomes if not o.problems and not o.error]
    lines = [
        "## corpus quantization report", "",
        "`bench/corpus_quant.py`: `quantization_report` on corpus models (int8 XNNPACK quantizer, per-channel "
        "weights, the entry's example input), with torch's run of the converted graph"
        + (" and with etlab's runtime's values (runtime=True)" if runtime else "") + ". Checked: no ranked layer "
        "is bit-exact (infinite SQNR), no layer kept in float is ranked"
        + (f", both runs name the same worst {TOP}" if runtime else "") + f". Load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the end.", "",
        f"**{len(ok)}/{len(outcomes)} models pass every check.**", "",
        "| model | layers | ranked | bit-exact, not ranked | float, not ranked | worst (torch) | same worst at "
        "runtime | report s (torch / runtime) | problems |",
        "|---|---:|---:|---:|---:|---|---|---|---|",
    ]
    for o in outcomes:
        if o.error:
            lines.append(f"| {o.name} | | | | | | | | FAIL {o.error} |")
            continue
        same = "n/a" if True not in o.worst else ("yes" if o.worst[True] == o.worst[False] else "NO")
        secs = " / ".join(f"{o.seconds[k]:.1f}" for k in (False, True) if k in o.seconds)
        lines.append(f"| {o.name} | {o.layers} | {o.ranked} | {o.exact_unranked} | {o.float_layers} | "
                     f"{', '.join(o.worst.get(False, []))} | {same} | {secs} | {'; '.join(o.problems) or 'none'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="*", default=None, help=f"corpus names (default: {' '.join(MODELS)})")
    p.add_argument("--no-runtime", action="store_true", help="torch's run only (no etlab runtime report)")
    p.add_argument("--no-write", action="store_true")
    a = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    names = a.models or list(MODELS)
    unknown = [n for n in names if n not in CORPUS]
    if unknown:
        p.error(f"unknown corpus models {unknown}; choose from {sorted(CORPUS)}")
    outcomes = []
    for name in names:
        outcomes.append(measure(name, not a.no_runtime))
        o = outcomes[-1]
        print(f"[quant] {name}: ranked {o.ranked}/{o.layers}, worst {o.worst}, problems {o.problems} {o.error}",
              flush=True)
    text = render(outcomes, not a.no_runtime)
    print(text)
    if not a.no_write and not a.models:
        write_section("corpus quantization report", text)
    return 0 if all(not o.problems and not o.error for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
