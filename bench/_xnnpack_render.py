"""The `## xnnpack lowering` section of bench/RESULTS.md, rendered from bench/xnnpack_lowering.py's row store:
how it is measured, the summary over every row (against the issue's bars), the models not measured yet, the
hand-written notes (kept between their markers), one table row per model. Pure functions of the rows."""

from __future__ import annotations

import os
import re
import statistics
from pathlib import Path
from typing import TYPE_CHECKING

from _common import RESULTS

from etlab.models.corpus import CORPUS

if TYPE_CHECKING:
    from _xnnpack_rows import Result

SECTION = "xnnpack lowering"
NOTES_BEGIN = "<!-- notes: hand-written, kept by bench/xnnpack_lowering.py -->"
NOTES_END = "<!-- end of notes -->"
COMPILE_TARGET = 10.0  # the issue's bars: compile >= 10x faster than upstream on every model,
LATENCY_MEDIAN_TARGET = 1.05  # latency etlab/upstream median <= 1.05 over the models,
LATENCY_MAX_TARGET = 1.2  # and no model above 1.2
ZOO_MODELS = ["mlp", "cnn", "mobilenet_v2", "transformer", "dynamic_batch"]


def fewer_ops(r: Result) -> str:
    """The op types upstream delegates more often than etlab on this row ('' when none or not recorded):
    what a "fewer delegated nodes" row is made of."""
    if not r.etlab_ops or not r.upstream_ops:
        return ""
    less = {k: n - r.etlab_ops.get(k, 0) for k, n in r.upstream_ops.items() if n > r.etlab_ops.get(k, 0)}
    return ("upstream delegates more: " + ", ".join(f"{k} +{n}" for k, n in sorted(less.items()))) if less else ""


def kept_notes(results_md: Path = RESULTS) -> str:
    """The hand-written notes of the section as they are now (between the markers), or ''."""
    text = results_md.read_text() if results_md.is_file() else ""
    m = re.search(rf"^## {re.escape(SECTION)}\n.*?(?=^## |\Z)", text, re.S | re.M)
    sec = m.group(0) if m else ""
    if NOTES_BEGIN in sec and NOTES_END in sec:
        return sec[sec.index(NOTES_BEGIN) + len(NOTES_BEGIN):sec.index(NOTES_END)].strip("\n")
    return ""


def _fmt(x, spec: str, none: str = "n/a") -> str:
    return format(x, spec) if x is not None else none


def render(results: list[Result], notes: str = "") -> str:
    """The section: how it is measured, the summary over every row, the models not measured yet, the
    hand-written notes, then one row per model (each naming the etlab commit it measured)."""
    lowered = [r for r in results if r.upstream_partitions]
    both = [r for r in lowered if r.etlab_partitions]
    nothing = [r.name for r in lowered if r.etlab_partitions == 0]
    failed = [r.name for r in lowered if r.etlab_partitions is None]
    speedups = [r.speedup for r in both if r.speedup]
    lat = {k: [r.latency_ratio(k) for r in both if r.latency_ratio(k)] for k in ("1", "default")}
    fewer = [r.name for r in both if r.etlab_nodes < r.upstream_nodes]
    slow_latency = {k: [r.name for r in both if (r.latency_ratio(k) or 0) > LATENCY_MAX_TARGET] for k in lat}
    slow_compile = [r.name for r in both if r.speedup and r.speedup < COMPILE_TARGET]
    off_tol = [r.name for r in both if r.within_tol is False]
    threads = next((r.threads_default for r in both if r.threads_default), None)
    measured = {r.name for r in results}
    missing = [n for n in default_models() if n not in measured]
    loads = [x for r in results for x in r.load]
    lines = [
        f"## {SECTION}", "",
        "`bench/xnnpack_lowering.py`: etlab's `XnnpackPartitioner` and upstream ExecuTorch 1.5.1's on the same "
        "ExportedProgram, in ONE run, interleaved per model (upstream in a long-lived reference-python worker, "
        "`bench/_ref_xnnpack.py`). Compile = `to_edge_transform_and_lower` + `to_executorch` + serialized buffer "
        "(one thread each side; upstream once, then etlab warm-up, then `rounds` + 1 etlab samples alternating with "
        "`rounds` more upstream samples; speed-up = upstream median / etlab median). Latency = both `.pte` files on "
        "upstream's runtime in one process, alternating rounds (`latency rounds` rounds of 5 `execute` calls each, "
        f"one untimed call before each batch), with 1 thread and with the threadpool's default ({threads or '?'} "
        "threads); ratio = etlab's program / upstream's. Max error = max |output - eager| (upstream's runtime on "
        "each side's `.pte`; etlab's runtime on etlab's). Node counts are each side's own edge graph (both keep the "
        "ops their partitioner's `ops_to_not_decompose` names whole: linear, max_pool2d, upsample_bilinear2d, "
        "hardswish). Each row is the newest measurement of its model (bench/xnnpack_lowering.jsonl; a run over a "
        "few models replaces their rows and keeps the others); its note names the etlab commit and the rounds. "
        f"Measured under load ({min(loads, default=float('nan')):.1f}-{max(loads, default=float('nan')):.1f} "
        f"over the rows, {os.cpu_count()} cores shared with other work; per model the load when it started -> "
        "ended). Spread: compile = (max - min) / median of each side's samples, the larger side; latency = the "
        "wider interquartile range of the two sides' rounds / its median (1 thread).", "",
    ]
    if both and speedups:
        lines += [
            f"**{len(both)} models lowered by both** (of {len(results)} tried; {len(lowered)} lowered by upstream; "
            f"etlab delegates nothing: {', '.join(nothing) or 'none'}; etlab's lowering fails: "
            f"{', '.join(failed) or 'none'}). "
            f"Compile speed-up: median {statistics.median(speedups):.1f}x, min {min(speedups):.1f}x "
            f"(below {COMPILE_TARGET:.0f}x: {', '.join(slow_compile) or 'none'}). "
            + " ".join(f"Latency etlab/upstream, {k} thread{'s' if k != '1' else ''}: median "
                       f"{statistics.median(v):.3f}, max {max(v):.3f} (above {LATENCY_MAX_TARGET}: "
                       f"{', '.join(slow_latency[k]) or 'none'})." for k, v in lat.items() if v and k == "1")
            + (f" Latency at default threads: {_default_threads_verdict(lat['default'], slow_latency['default'], both)}"
               if lat["default"] else "")
            + _retimed_summary(both)
            + f" Fewer delegated nodes than upstream: {', '.join(fewer) or 'none'}. "
            f"Outside the tolerance on upstream's runtime: {', '.join(off_tol) or 'none'}.", "",
        ]
    else:
        lines += ["**No model measured on both sides.**", ""]
    lines += [f"Not measured yet ({len(missing)} of {len(default_models())} models): {', '.join(missing) or 'none'}.",
              "", NOTES_BEGIN, *([notes] if notes else []), NOTES_END, ""]
    lines += [
        "| model | nodes etlab / upstream | partitions etlab / upstream | compile etlab ms | compile upstream s "
        "| speed-up (CPU) | latency ms 1T etlab / upstream (ratio) | latency ms default (ratio) "
        "| max err etlab pte (upstream rt / etlab rt) | max err upstream pte | load | spread compile / latency "
        "| note |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        def lat_cell(k: str, r=r) -> str:
            t = r.latency.get(k)
            return f"{t['etlab']:.3g} / {t['upstream']:.3g} ({r.latency_ratio(k):.3f})" if t else "n/a"

        lines.append(
            f"| {r.name} | {_fmt(r.etlab_nodes, 'd')} / {_fmt(r.upstream_nodes, 'd')} "
            f"| {_fmt(r.etlab_partitions, 'd')} / {_fmt(r.upstream_partitions, 'd')} "
            f"| {_fmt(statistics.median(r.etlab_s) * 1e3 if r.etlab_s else None, '.0f')} "
            f"| {_fmt(statistics.median(r.upstream_s) if r.upstream_s else None, '.2f')} "
            f"| {_fmt(r.speedup, '.1f')}{'x' if r.speedup else ''} ({_fmt(r.cpu_speedup, '.1f')}"
            f"{'x' if r.cpu_speedup else ''}) | {lat_cell('1')} | {lat_cell('default')} "
            f"| {_fmt(r.err_etlab_on_upstream, '.2g')} / {_fmt(r.err_etlab_on_etlab, '.2g')} "
            f"| {_fmt(r.err_upstream, '.2g')} | {_load_cell(r)} | {_spread_cell(r)} | {_note_cell(r)} |")
    return "\n".join(lines) + "\n"


def _retimed_summary(rows: list[Result]) -> str:
    """How many rows' latency was re-timed from kept pairs (--latency-only), per threads label, and at what load."""
    out = []
    for label in ("1", "default"):
        loads = [x for r in rows if label in r.latency_retimed for x in latency_load(r, label)]
        if loads:
            n = sum(label in r.latency_retimed for r in rows)
            out.append(f"{'1 thread' if label == '1' else 'default threads'} of {n} of {len(rows)} rows "
                       f"(load {min(loads):.1f}-{max(loads):.1f})")
    return (" Latency re-timed from the kept .pte pairs (--latency-only): " + ", ".join(out) + ".") if out else ""


def _default_threads_verdict(ratios: list[float], above: list[str], rows: list[Result]) -> str:
    """The default-threads summary, or why it is not one: with the load above the core count a second
    thread is rarely free, and both sides' rounds swing by several times, so the ratio is noise."""
    cores = os.cpu_count() or 1
    loaded = [r.name for r in rows if latency_load(r, "default") and max(latency_load(r, "default")) > cores]
    text = (f"median {statistics.median(ratios):.3f}, max {max(ratios):.3f} (above {LATENCY_MAX_TARGET}: "
            f"{', '.join(above) or 'none'}).")
    if len(loaded) * 2 > len(rows):
        return (f"NOT a measurement: {len(loaded)} of {len(rows)} rows were measured with the load above the "
                f"{cores} cores, where a second thread is rarely free (as read: {text[:-1]}; the table's column "
                "is kept for the record, read the 1-thread column).")
    return text


def _note_cell(r: Result) -> str:
    run = f"etlab at {r.commit or '?'}" + (f", rounds {r.rounds} / {r.latency_rounds}" if r.rounds is not None else "")
    return "; ".join(x for x in (r.remark, fewer_ops(r), r.error, run, _retimed_note(r)) if x)


def _retimed_note(r: Result) -> str:
    """What --latency-only changed in this row: only the latency columns, from which kept pair, when."""
    parts = []
    for label, m in sorted(r.latency_retimed.items()):
        load = m.get("load") or [float("nan")] * 2
        parts.append(f"latency {'1T' if label == '1' else 'default (' + str(m.get('threads', '?')) + ' threads)'} "
                     f"re-timed alone {str(m.get('date', '?'))[:16]}Z at load {load[0]:.1f} -> {load[-1]:.1f}, "
                     f"{m.get('rounds')} rounds of {m.get('per_round')}, from the kept .pte pair lowered at "
                     f"{m.get('pte_commit', '?')} ({m.get('pte_source', '?')})")
    return "; ".join(parts) + ("; only the latency columns changed" if parts else "")


def latency_load(r: Result, label: str) -> list[float]:
    """The load the row's latency of this threads label was measured at (its re-timing's, else the row's)."""
    return (r.latency_retimed.get(label) or {}).get("load") or r.load


def _load_cell(r: Result) -> str:
    return f"{r.load[0]:.1f} -> {r.load[1]:.1f}" if r.load else "n/a"


def _spread_cell(r: Result) -> str:
    compiles = [x for x in (r.compile_spread("etlab"), r.compile_spread("upstream")) if x is not None]
    return f"{_fmt(max(compiles) if compiles else None, '.0%')} / {_fmt(r.latency_spread('1'), '.0%')}"


def default_models() -> list[str]:
    """The zoo set and every corpus model; the rows of those the bench cannot lower (several methods)
    say why instead of leaving them out."""
    return ZOO_MODELS + list(CORPUS)
