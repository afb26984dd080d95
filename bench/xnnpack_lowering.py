"""etlab's XNNPACK lowering next to upstream's, side by side in ONE interleaved run (issue #23's proof).

    .venv/bin/python bench/xnnpack_lowering.py [--models mlp cnn bert ...] [--rounds 3] [--latency-rounds 15]
                                               [--no-write]

Per model (the zoo's single-method models, then the corpus' single-method models): torch.export once
(not timed), saved with torch.export.save for upstream's worker (bench/_ref_xnnpack.py, a long-lived
reference-python process), so both compilers lower the same ExportedProgram.

- Delegated nodes and partitions: get_delegation_info of each side's lowered edge graph.
- Compile time: `to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])`, `to_executorch()`
  and the serialized buffer, one thread each side; order per model: one untimed etlab warm-up, then
  etlab / upstream alternating (--rounds upstream samples between --rounds + 1 etlab samples).
  Speed-up = upstream median / etlab median (wall; CPU time too).
- Latency: both `.pte` files loaded by upstream's runtime in the same worker and timed in alternating
  rounds (each batch after one untimed call), with 1 thread and with the threadpool's default size;
  ratio = etlab's program / upstream's program (median).
- Accuracy: max |output - eager| of each `.pte` run by upstream's runtime, and of etlab's `.pte` run by
  etlab's own runtime, against the corpus tolerance (atol + rtol·|eager|).

Models upstream's XnnpackPartitioner does not lower (no partition) are listed and left out of the
ratios.

Every measured row is merged into bench/xnnpack_lowering.jsonl (one JSON line per model, the newest
measurement of a model replacing its older one, with the etlab commit it measured), and the
`## xnnpack lowering` section of bench/RESULTS.md is rendered from that whole store: a run over a few
models (--models) adds or replaces their rows and keeps every other model's. The hand-written notes
between the section's NOTES_BEGIN / NOTES_END markers are kept as they are. --no-write leaves both
files alone; --from-json merges lines saved by --json (an earlier run, another checkout) the same way.

The pieces: bench/_xnnpack_sides.py (the models, etlab's lowering, upstream's worker), _xnnpack_rows.py (the
rows and their store), _xnnpack_pairs.py (--store-only / --latency-only on the kept .pte pairs),
_xnnpack_render.py (the section), _xnnpack_ptes.py (the pair store), _xnnpack_latency.py (re-timing).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from _common import reference_python, write_section  # noqa: E402
from _xnnpack_pairs import lacking_pairs, pairs_main, store_pair  # noqa: E402, F401
from _xnnpack_ptes import default_dir, keep_pair  # noqa: E402
from _xnnpack_render import (  # noqa: E402, F401  (the names tests and other scripts read from the bench)
    NOTES_BEGIN,
    NOTES_END,
    SECTION,
    ZOO_MODELS,
    _fmt,
    _note_cell,
    default_models,
    fewer_ops,
    kept_notes,
    render,
)
from _xnnpack_rows import (  # noqa: E402, F401
    STORE,
    Result,
    _commit,
    _remarks,
    _result,
    load_results,
    merge_into_store,
    write_store_and_section,
)
from _xnnpack_sides import (  # noqa: E402, F401
    ZOO_TOLERANCE,
    Model,
    Upstream,
    _etlab_compile,
    _etlab_partitioner,
    _etlab_runtime_outputs,
    _tolerance_ok,
    build,
    delegated_ops,
    load_models,
)

from etlab.devtools import get_delegation_info  # noqa: E402
from etlab.models.corpus import max_abs_error  # noqa: E402


def bench_model(name: str, kind: str, upstream: Upstream, partitioner_cls, why_no_etlab: str, scratch: Path,
                rounds: int, latency_rounds: int) -> Result:
    res = Result(name)
    d = scratch / name
    d.mkdir()
    try:
        model = build(name, kind)
    except Exception as e:
        res.note(f"export: {type(e).__name__}: {e}")
        return res
    torch.export.save(model.ep, d / "model.pt2")
    torch.save(list(model.inputs), d / "inputs.pt")
    try:
        first = upstream.ask(cmd="compile", dir=str(d), write=True)
    except RuntimeError as e:
        res.note(f"upstream lowering: {e}")
        return res
    res.upstream_nodes, res.upstream_partitions = first["delegated_nodes"], first["partitions"]
    res.upstream_ops = first.get("delegated_ops", {})
    res.upstream_s.append(first["seconds"])  # the first lowering is a sample too (its counts are taken after it)
    res.upstream_cpu.append(first["cpu_seconds"])
    if not res.upstream_partitions:
        res.note("upstream's XnnpackPartitioner delegates nothing")
        return res
    up_out = d / "upstream.out.pt"
    try:
        upstream.ask(cmd="outputs", pte=str(d / "upstream.pte"), inputs=str(d / "inputs.pt"), out=str(up_out))
        res.err_upstream = max_abs_error(torch.load(up_out, weights_only=True), model.eager)
    except RuntimeError as e:
        res.note(f"upstream run: {e}")
    if partitioner_cls is None:
        res.note(why_no_etlab)
        return res
    try:
        edge, buf = _etlab_compile(model, partitioner_cls)  # warm-up, untimed
    except Exception as e:
        res.note(f"etlab lowering: {type(e).__name__}: {e}")
        return res
    info = get_delegation_info(edge.exported_program())
    res.etlab_nodes, res.etlab_partitions = info.num_delegated_nodes, info.num_delegated_subgraphs
    res.etlab_ops = delegated_ops(info)
    (d / "etlab.pte").write_bytes(buf)
    for _ in range(rounds):
        _etlab_compile(model, partitioner_cls, res)
        try:
            t = upstream.ask(cmd="compile", dir=str(d), write=False)
            res.upstream_s.append(t["seconds"])
            res.upstream_cpu.append(t["cpu_seconds"])
        except RuntimeError as e:
            res.note(f"upstream lowering: {e}")
            break
    _etlab_compile(model, partitioner_cls, res)
    et_out = d / "etlab.out.pt"
    try:
        upstream.ask(cmd="outputs", pte=str(d / "etlab.pte"), inputs=str(d / "inputs.pt"), out=str(et_out))
        got = torch.load(et_out, weights_only=True)
        res.err_etlab_on_upstream = max_abs_error(got, model.eager)
        res.within_tol = _tolerance_ok(got, model)
    except RuntimeError as e:
        res.note(f"upstream runs etlab's pte: {e}")
    try:
        res.err_etlab_on_etlab = max_abs_error(_etlab_runtime_outputs(d / "etlab.pte", model.inputs), model.eager)
    except Exception as e:
        res.note(f"etlab runtime: {type(e).__name__}: {e}")
    if res.err_etlab_on_upstream is None or res.err_upstream is None:
        return res
    for label, threads in (("1", 1), ("default", 0)):
        try:
            t = upstream.ask(cmd="latency", ptes={"etlab": str(d / "etlab.pte"), "upstream": str(d / "upstream.pte")},
                             inputs=str(d / "inputs.pt"), threads=threads, rounds=latency_rounds, per_round=5)
            res.latency[label] = t["median_ms"]
            res.latency_iqr[label] = t.get("iqr_ms", {})
            if threads == 0:
                res.threads_default = t["threads"]
        except RuntimeError as e:
            res.note(f"latency ({label} thread): {e}")
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="*", default=None, help="zoo or corpus names (default: zoo set + corpus)")
    p.add_argument("--rounds", type=int, default=2, help="upstream compile samples per model after the first")
    p.add_argument("--latency-rounds", type=int, default=None,
                   help="latency rounds per model (default 15; with --latency-only the most a model gets, default 30)")
    p.add_argument("--no-write", action="store_true", help="leave the store and RESULTS.md alone")
    p.add_argument("--pte-dir", type=Path, default=None,
                   help=f"where each measured model's .pte pair is kept (default {default_dir()})")
    p.add_argument("--no-keep-pte", action="store_true", help="do not keep the measured .pte pairs")
    p.add_argument("--latency-only", action="store_true",
                   help="re-time only the latency of the stored rows from their kept .pte pairs (nothing lowered; "
                        "updates only the rows' latency fields); with --models: only those")
    p.add_argument("--threads", choices=("1", "default", "both"), default="both", help="with --latency-only")
    p.add_argument("--budget-min", type=float, default=8.0,
                   help="with --latency-only: the time the rounds are chosen to fit (estimated, printed)")
    p.add_argument("--dry-run", action="store_true",
                   help="with --latency-only: print the kept pairs, the rounds per model and the time estimate; "
                        "time nothing")
    p.add_argument("--store-only", action="store_true",
                   help="lower both sides of each model (nothing timed) and keep the .pte pair; default models: "
                        "the stored rows without a kept pair, smallest first; the row store is left alone")
    p.add_argument("--json", type=Path, default=None, help="also append each model's result as a JSON line here")
    p.add_argument("--from-json", type=Path, nargs="*", default=None,
                   help="merge lines saved by --json into the store and render the section (no measuring)")
    p.add_argument("--commit", default="", help="with --from-json: the etlab commit of lines that do not name one")
    p.add_argument("--remark", action="append", default=[], metavar="MODEL=TEXT",
                   help="a hand-written note on a stored row (kept when the model is re-measured); alone: "
                        "set it and re-render the section")
    a = p.parse_args(argv)
    remarks = _remarks(a.remark)
    if remarks and a.from_json is None and a.models is None:
        rows = load_results([STORE])[0] if STORE.is_file() else []
        unknown = sorted(set(remarks) - {r.name for r in rows})
        if unknown:
            raise SystemExit(f"xnnpack_lowering: --remark: no stored row for {unknown}")
        for r in rows:
            r.remark = remarks.get(r.name, r.remark)
        print(write_store_and_section(rows))
        return 0
    if a.from_json is not None:
        for path in a.from_json:
            if not path.is_file():
                raise SystemExit(f"xnnpack_lowering: --from-json {path}: no such file")
        new = load_results(a.from_json, a.commit)[0]
        text = render(merge_into_store(new) if not a.no_write else new, kept_notes())
        print(text)
        if not a.no_write:
            write_section(SECTION, text)
        return 0
    if a.latency_rounds is None:
        a.latency_rounds = 30 if a.latency_only else 15
    if a.latency_only and a.store_only:
        raise SystemExit("xnnpack_lowering: --latency-only and --store-only are two runs")
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    if a.latency_only or a.store_only:
        return pairs_main(a)
    names = a.models or default_models()
    models = load_models(names)
    ref = reference_python()
    if ref is None:
        print("xnnpack_lowering: the upstream reference python is unavailable (../shared/reference/setup.sh)",
              file=sys.stderr)
        return 2
    partitioner_cls, why = _etlab_partitioner()
    if partitioner_cls is None:
        print(f"xnnpack_lowering: {why}; measuring upstream's side only", file=sys.stderr)
    upstream = Upstream(ref)
    commit = _commit()
    results = []
    try:
        with tempfile.TemporaryDirectory() as scratch:
            for name, kind in models:
                before = os.getloadavg()[0]
                r = bench_model(name, kind, upstream, partitioner_cls, why, Path(scratch), a.rounds, a.latency_rounds)
                r.load = [before, os.getloadavg()[0]]
                r.commit, r.rounds, r.latency_rounds = commit, a.rounds, a.latency_rounds
                r.date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                results.append(r)
                if not a.no_keep_pte and r.etlab_partitions and r.upstream_partitions:
                    try:
                        kept = keep_pair(a.pte_dir or default_dir(), name, Path(scratch) / name, commit, "bench")
                        print(f"[xnnpack] {name}: .pte pair kept in {kept.folder}", flush=True)
                    except OSError as e:
                        print(f"[xnnpack] {name}: .pte pair NOT kept ({e})", flush=True)
                if a.json is not None:
                    with open(a.json, "a") as f:
                        f.write(json.dumps(dataclasses.asdict(r)) + "\n")
                if not a.no_write:
                    merge_into_store([r])  # each row as soon as it is measured: a stopped run keeps what it did
                print(f"[xnnpack] {name}: nodes {r.etlab_nodes}/{r.upstream_nodes} partitions "
                      f"{r.etlab_partitions}/{r.upstream_partitions} speed-up {_fmt(r.speedup, '.1f')} latency "
                      f"1T {_fmt(r.latency_ratio('1'), '.3f')} default {_fmt(r.latency_ratio('default'), '.3f')} "
                      f"err {r.err_etlab_on_upstream}/{r.err_upstream} {r.error}", flush=True)
    finally:
        upstream.close()
    text = write_store_and_section(results) if not a.no_write else render(results, kept_notes())
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
