"""bench/xnnpack_lowering.py's two runs on the kept `.pte` pairs (bench/_xnnpack_ptes.py): --store-only
lowers both sides of each model (nothing timed) and keeps the pair; --latency-only re-times the stored rows'
latency from their pairs (bench/_xnnpack_latency.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from _common import reference_python
from _xnnpack_latency import retime
from _xnnpack_ptes import default_dir, keep_pair, read_pair
from _xnnpack_rows import STORE, Result, _commit, load_results, merge_into_store, write_store_and_section
from _xnnpack_sides import Upstream, _etlab_compile, _etlab_partitioner, _tolerance_ok, build, load_models

from etlab.models.corpus import max_abs_error


def store_pair(name: str, kind: str, upstream: Upstream, partitioner_cls, scratch: Path, pte_dir: Path,
               commit: str) -> str:
    """--store-only: lowers one model on both sides (one upstream lowering, one etlab lowering, nothing
    timed), checks that upstream's runtime runs both programs, and keeps the pair. Returns what happened."""
    d = scratch / name
    d.mkdir()
    model = build(name, kind)
    torch.export.save(model.ep, d / "model.pt2")
    torch.save(list(model.inputs), d / "inputs.pt")
    first = upstream.ask(cmd="compile", dir=str(d), write=True)
    if not first["partitions"]:
        return "upstream's XnnpackPartitioner delegates nothing: no pair"
    _, buf = _etlab_compile(model, partitioner_cls)
    (d / "etlab.pte").write_bytes(buf)
    errors = {}
    for side in ("etlab", "upstream"):
        upstream.ask(cmd="outputs", pte=str(d / f"{side}.pte"), inputs=str(d / "inputs.pt"), out=str(d / "out.pt"))
        got = torch.load(d / "out.pt", weights_only=True)
        errors[side] = max_abs_error(got, model.eager)
        if side == "etlab" and not _tolerance_ok(got, model):
            return f"etlab's program outside the tolerance on upstream's runtime ({errors[side]:.2g}): no pair"
    kept = keep_pair(pte_dir, name, d, commit, "store-only")
    return (f"kept in {kept.folder} (upstream lowering {first['seconds']:.1f} s; max err etlab "
            f"{errors['etlab']:.2g} / upstream {errors['upstream']:.2g})")


def lacking_pairs(rows: list[Result], pte_dir: Path) -> list[Result]:
    """The rows lowered by both sides whose model has no kept pair (not verified: a manifest and its files),
    smallest first (by the row's upstream compile time)."""
    out = []
    for r in rows:
        if r.etlab_partitions and r.upstream_partitions:
            try:
                read_pair(pte_dir, r.name, verify=False)
            except ValueError:
                out.append(r)
    return sorted(out, key=lambda r: statistics.median(r.upstream_s) if r.upstream_s else float("inf"))



def pairs_main(a) -> int:
    """--latency-only and --store-only: the kept .pte pairs' two runs."""
    pte_dir = a.pte_dir or default_dir()
    rows = load_results([STORE])[0] if STORE.is_file() else []
    if a.models:
        unknown = sorted(set(a.models) - {r.name for r in rows}) if a.latency_only else []
        if unknown:
            raise SystemExit(f"xnnpack_lowering: --latency-only: no stored row for {unknown}")
        load_models(a.models)  # names a model that is neither in the zoo nor in the corpus
    chosen = [r for r in rows if r.etlab_partitions and r.upstream_partitions and (not a.models or r.name in a.models)]
    labels = ["1", "default"] if a.threads == "both" else [a.threads]
    if a.latency_only and a.dry_run:
        retime(chosen, pte_dir, labels, a.budget_min * 60, None, None, max_rounds=a.latency_rounds, dry_run=True)
        return 0
    ref = reference_python()
    if ref is None:
        print("xnnpack_lowering: the upstream reference python is unavailable (../shared/reference/setup.sh)",
              file=sys.stderr)
        return 2
    upstream = Upstream(ref)
    try:
        if a.latency_only:

            def save(row: Result) -> None:
                if a.json is not None:
                    with open(a.json, "a") as f:
                        f.write(json.dumps(dataclasses.asdict(row)) + "\n")
                if not a.no_write:
                    merge_into_store([row])

            done = retime(chosen, pte_dir, labels, a.budget_min * 60, upstream.ask, save,
                          max_rounds=a.latency_rounds)
            print(f"[latency] {len(done)} of {len(chosen)} rows re-timed", flush=True)
            if not a.no_write:
                print(write_store_and_section([]))
            return 0
        partitioner_cls, why = _etlab_partitioner()
        if partitioner_cls is None:
            raise SystemExit(f"xnnpack_lowering: --store-only: {why}")
        names = a.models or [r.name for r in lacking_pairs(rows, pte_dir)]
        print(f"[store] {len(names)} models to lower on both sides and keep in {pte_dir}: {', '.join(names)}",
              flush=True)
        commit = _commit()
        with tempfile.TemporaryDirectory() as scratch:
            for i, (name, kind) in enumerate(load_models(names), 1):
                t = time.perf_counter()
                try:
                    what = store_pair(name, kind, upstream, partitioner_cls, Path(scratch), pte_dir, commit)
                except Exception as e:  # one model's failure is named; the run goes on
                    what = f"FAILED ({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})"
                print(f"[store {i}/{len(names)}] {name}: {what}; {time.perf_counter() - t:.0f} s, "
                      f"load {os.getloadavg()[0]:.1f}", flush=True)
        return 0
    finally:
        upstream.close()
