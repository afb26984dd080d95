"""Runtime benchmarks, side by side in one run; writes the `## runtime` section of bench/RESULTS.md.

- per-instruction overhead: a 500-add chain (upstream-exported), etlab vs upstream vs eager adds;
- latency of the CNN, MobileNetV2 and the transformer: torch eager, etlab, etlab with ETDump
  tracing on, upstream portable kernels and upstream XNNPACK (the same upstream export for
  etlab and upstream portable);
- tracing overhead: etlab with ETDump on (timings, no logged values) vs off.

Medians of alternating rounds (etlab and eager in-process; upstream via et_ref.py run). torch
runs single-threaded by default (--threads), as upstream's portable kernels do; XNNPACK uses
upstream's default threadpool.

    .venv/bin/python bench/runtime.py [--models cnn transformer] [--rounds 30] [--no-upstream]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ET_REF, REPO, interleaved, reference_python, run_ref, write_section

from etlab.models import ZOO
from etlab.runtime import Runtime

ZOO_PY = REPO / "etlab" / "models" / "zoo.py"
REF_EXPORT = REPO / "tests" / "interop" / "ref_export_runtime.py"
MODELS = ["cnn", "mobilenet_v2", "transformer"]
CHAIN = 500
TARGET_US_PER_INSTR = 5.0
TARGET_TRACE_OVERHEAD = 0.05


def export_upstream(ref: str, out: Path, models: list[str], xnnpack: bool) -> dict[str, Path]:
    dirs = {}
    run_ref(ref, REF_EXPORT, "add-chain", CHAIN, "--out", out / "add_chain")
    dirs["add_chain"] = out / "add_chain"
    for m in models:
        for kind, extra in (("portable", []), ("xnnpack", ["--xnnpack"]))[: 2 if xnnpack else 1]:
            d = out / kind / m
            run_ref(ref, ET_REF, "export", f"{ZOO_PY}:make_{m}", "--out", d, *extra)
            dirs[f"{kind}:{m}"] = d
    return dirs


def upstream_ms(ref: str, d: Path, iters: int) -> float:
    out = run_ref(ref, ET_REF, "run", d / "model.pte", "--inputs", d / "inputs.pt", "--iters", iters)
    return json.loads(out.strip().splitlines()[-1])["median_ms"]


def etlab_programs_without_upstream(out: Path, models: list[str]) -> dict[str, Path]:
    """Programs from etlab's own compiler, for runs without the reference environment."""
    from etlab.compiler import to_edge

    dirs = {}
    for m in models:
        model, inputs = ZOO[m]()
        d = out / "portable" / m
        d.mkdir(parents=True)
        with torch.no_grad():
            (d / "model.pte").write_bytes(to_edge(torch.export.export(model, tuple(inputs))).to_executorch().buffer)
        torch.save(list(inputs), d / "inputs.pt")
        dirs[f"portable:{m}"] = d
    return dirs


def time_chain(d: Path, rounds: int) -> dict[str, float]:
    rt = Runtime.get()
    inputs = torch.load(d / "inputs.pt", weights_only=True)
    plain = rt.load_program(d / "model.pte").load_method("forward")
    traced = rt.load_program(d / "model.pte", enable_etdump=True, etdump_max_events=1 << 30).load_method("forward")
    w = torch.randn(4, 4)

    def eager():
        x = inputs[0]
        for _ in range(CHAIN):
            x = x + w
        return x

    with torch.no_grad():
        return interleaved({"etlab": lambda: plain.execute(inputs), "traced": lambda: traced.execute(inputs),
                            "eager": eager}, rounds=rounds, per_round=3)


def time_model(name: str, d: Path, rounds: int) -> dict[str, float]:
    rt = Runtime.get()
    model, _ = ZOO[name]()
    inputs = torch.load(d / "inputs.pt", weights_only=True)
    plain = rt.load_program(d / "model.pte").load_method("forward")
    traced = rt.load_program(d / "model.pte", enable_etdump=True, etdump_max_events=1 << 30).load_method("forward")
    torch.testing.assert_close(plain.execute(inputs)[0], model(*inputs), rtol=1e-4, atol=1e-4)

    def eager():
        with torch.no_grad():
            return model(*inputs)

    per_round = 1 if name == "mobilenet_v2" else 5
    return interleaved({"eager": eager, "etlab": lambda: plain.execute(inputs),
                        "traced": lambda: traced.execute(inputs)}, rounds=rounds, per_round=per_round)


def render(chain: dict, chain_up: float | None, models: dict, upstream: dict, threads: int) -> str:
    us = chain["etlab"] / CHAIN * 1e6
    lines = [
        "## runtime", "",
        f"Medians of alternating rounds; torch threads = {threads}; upstream = ExecuTorch 1.5.1 pybindings "
        "(`et_ref.py run`, per `execute` call), XNNPACK with its default threadpool. The same upstream-exported "
        "`.pte` runs on etlab and on upstream portable.", "",
        f"**Per-instruction overhead** ({CHAIN}-add chain, (4, 4) float): etlab {us:.2f} us/instruction "
        f"(target <= {TARGET_US_PER_INSTR:.0f}: {'met' if us <= TARGET_US_PER_INSTR else 'MISSED'}); "
        f"eager `x + w` {chain['eager'] / CHAIN * 1e6:.2f} us/op; "
        + (f"upstream portable {chain_up * 1e3 / CHAIN:.2f} us/instruction; " if chain_up else "")
        + f"with ETDump tracing {chain['traced'] / CHAIN * 1e6:.2f} us/instruction.", "",
        "| model | eager ms | etlab ms | etlab / eager | etlab traced ms | tracing overhead | upstream portable ms "
        "| upstream XNNPACK ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in models.items():
        overhead = r["traced"] / r["etlab"] - 1
        port, xnn = upstream.get(f"portable:{name}"), upstream.get(f"xnnpack:{name}")
        lines.append(
            f"| {name} | {r['eager'] * 1e3:.3f} | {r['etlab'] * 1e3:.3f} | {r['etlab'] / r['eager']:.2f} | "
            f"{r['traced'] * 1e3:.3f} | {overhead * 100:+.1f}% | {f'{port:.3f}' if port else 'n/a'} | "
            f"{f'{xnn:.3f}' if xnn else 'n/a'} |")
    lines.append("")
    verdicts = []
    if "cnn" in models:
        r = models["cnn"]
        verdicts.append(f"CNN no slower than eager: {'met' if r['etlab'] <= r['eager'] else 'MISSED'} "
                        f"({r['etlab'] / r['eager']:.2f}x eager)")
    worst = max((r["traced"] / r["etlab"] - 1 for r in models.values()), default=0.0)
    verdicts.append(f"tracing overhead <= {TARGET_TRACE_OVERHEAD:.0%}: "
                    f"{'met' if worst <= TARGET_TRACE_OVERHEAD else 'MISSED'} (worst {worst * 100:+.1f}%)")
    lines += ["Targets: " + "; ".join(verdicts) + ".", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--upstream-iters", type=int, default=50)
    ap.add_argument("--no-upstream", action="store_true")
    ap.add_argument("--no-xnnpack", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    ref = None if a.no_upstream else reference_python()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        upstream: dict[str, float] = {}
        chain_up = None
        if ref:
            dirs = export_upstream(ref, out, a.models, xnnpack=not a.no_xnnpack)
        else:
            print("no reference python: etlab-compiled programs, no upstream columns", flush=True)
            dirs = etlab_programs_without_upstream(out, a.models)
        chain = None
        if "add_chain" in dirs:
            chain = time_chain(dirs["add_chain"], a.rounds)
            print(f"add chain: {chain['etlab'] / CHAIN * 1e6:.2f} us/instruction", flush=True)
        models = {}
        for m in a.models:
            models[m] = time_model(m, dirs[f"portable:{m}"], a.rounds)
            print(f"{m}: " + ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in models[m].items()), flush=True)
        if ref:
            chain_up = upstream_ms(ref, dirs["add_chain"], a.upstream_iters)
            for key, d in dirs.items():
                if ":" in key:
                    upstream[key] = upstream_ms(ref, d, a.upstream_iters if "mobilenet" not in key else 10)
                    print(f"upstream {key}: {upstream[key]:.3f} ms", flush=True)
    if chain is None:
        chain = {"etlab": float("nan"), "traced": float("nan"), "eager": float("nan")}
    body = render(chain, chain_up, models, upstream, a.threads)
    write_section("runtime", body)
    print(body)


if __name__ == "__main__":
    main()
