"""Corpus coverage: every model of etlab.models.corpus compiled, run and inspected by etlab, side by
side with upstream ExecuTorch.

    .venv/bin/python bench/corpus.py [--models lstm bert ...] [--repeat 3] [--parallel 2] [--no-write]

Per model: torch.export (timed); etlab `to_edge(...).to_executorch()` next to upstream's on the same
ExportedProgram (torch.export.save'd), timed interleaved in the foreground: etlab's first compile of
the model, then etlab, upstream, etlab, etlab (upstream's sample from a long-lived, warmed-up worker,
bench/_ref_corpus_timer.py, which also writes the upstream .pte the other columns use); the speed-up
is upstream's sample / the median of etlab's samples after the first, and the first compile's ratio
is shown too. Then etlab's runtime on etlab's .pte vs eager (max abs error, within the entry's
tolerance); upstream's runtime on etlab's .pte; etlab's runtime on upstream's .pte; upstream's
XNNPACK-lowered .pte (a background job, bench/_ref_corpus.py) loaded and inspected by etlab (run where
etlab has the backend); the Inspector on an ETDump with intermediate outputs (the debug buffer sized
from the plan, as a user gets it), its numeric gap and the HTML report.

Upstream artifacts are cached by content (bench/_corpus_upstream.py), so a second run only redoes
what changed, except upstream's timed compile, redone with each measured row so that its speed-up
is side by side. Each model's row is kept (bench/_corpus_rows.py) with the commit and date it was
measured at: a run measures the models that have no row first, then those whose row is stale
(etlab, the entry or upstream changed since), oldest first, and skips current ones; the table
is every corpus model's latest row. A run that is stopped (SIGTERM, Ctrl-C) keeps the rows it
finished. Writes the `## corpus` section of bench/RESULTS.md unless --no-write; --render-only
writes it from the kept rows without measuring.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import _corpus_rows as rows  # noqa: E402
import _corpus_upstream as up  # noqa: E402
import torch  # noqa: E402
from _common import reference_python, write_section  # noqa: E402
from _corpus_table import COLUMNS, Check, ModelResult, render  # noqa: E402, F401

from etlab.compiler import ExecutorchBackendConfig, MemoryPlanningPass, to_edge  # noqa: E402
from etlab.models.corpus import CORPUS, SHARED_STATE, CorpusEntry, max_abs_error, within_tolerance  # noqa: E402
from etlab.runtime import DebugLevel, Runtime  # noqa: E402
from etlab.schema import load_pte  # noqa: E402

NOTES = HERE / "corpus_notes.md"  # hand-written findings shown above the table (kept by --render-only)
UPSTREAM_OPERATORS: set[str] | None = None  # kernels of upstream's runtime, set by measure()
# Fast subset for `make test` (tests/corpus): one of each family the corpus covers, small compiles.
FAST = ("lstm", "mobilenet_v3", "upsample_modes", "sdpa_attention", "cond", "dynamic_conv1d",
        "recommendation_tower", "gpt2")


def _short(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    return (text[0] if text else type(e).__name__)[:160].replace("|", "/")


def _outputs_check(got: list[torch.Tensor], want: list[torch.Tensor], entry: CorpusEntry) -> Check:
    err = max_abs_error(got, want)
    ok = len(got) == len(want) and all(within_tolerance(g, w, entry.atol, entry.rtol) for g, w in zip(got, want))
    return Check(ok, f"max err {err:.1e}" if math.isfinite(err) else "outputs differ in count or shape")


def _config(entry: CorpusEntry) -> ExecutorchBackendConfig | None:
    """Entries tagged SHARED_STATE compile with their methods sharing mutable buffers (both compilers)."""
    if SHARED_STATE not in entry.tags:
        return None
    return ExecutorchBackendConfig(memory_planning_pass=MemoryPlanningPass(share_mutable_buffers=True))


def _run_all(pte: bytes | Path, methods: dict[str, tuple]) -> dict[str, list[torch.Tensor]]:
    program = Runtime.get().load_program(pte)
    return {m: list(program.load_method(m).execute(list(ins))) for m, ins in methods.items()}


def _compare_methods(outs: dict[str, list], eager: dict[str, list], entry: CorpusEntry) -> Check:
    checks = [_outputs_check(outs[m], eager[m], entry) for m in eager]
    worst = max((max_abs_error(outs[m], eager[m]) for m in eager), default=0.0)
    return Check(all(c.ok for c in checks), f"max err {worst:.1e}")


@dataclass
class _Work:
    """A model between the etlab phase and the upstream phase."""

    entry: CorpusEntry
    result: ModelResult
    methods: dict[str, tuple] | None = None
    eager: dict[str, list] | None = None
    programs: dict | None = None
    pte: bytes | None = None
    portable_dir: Path | None = None  # upstream's portable compile (_corpus_upstream, kind "portable")
    xnnpack_dir: Path | None = None
    run_dir: Path | None = None
    programs_dir: Path | None = None  # the torch.export.save'd programs upstream's compiles read
    entry_key: str = ""  # _corpus_upstream.program_key: the entry as exported, with its inputs


def etlab_phase(entry: CorpusEntry, repeat: int, jobs: list[up.PendingJob] | None,
                compiler: up.UpstreamCompiler | None = None, interleave: bool = False,
                scratch: Path | None = None) -> _Work:
    """Export, compile and run with etlab; upstream's portable compile through `compiler`, timed between
    etlab's samples when `interleave` (else only made when not cached); queues upstream's background
    jobs (XNNPACK lowering, a run of etlab's .pte) into `jobs`."""
    work = _Work(entry, ModelResult(entry.name, entry.source, interleaved=interleave))
    checks = work.result.checks
    try:
        built = entry.build()
        work.methods, work.eager = built[1], entry.eager(built)
        t = time.perf_counter()
        work.programs = entry.export(built)
        work.result.export_s = time.perf_counter() - t
        checks["export"] = Check(True, f"{work.result.export_s:.1f}s")
        work.entry_key = up.program_key(entry.name, work.programs, work.methods, SHARED_STATE in entry.tags)
    except Exception as e:
        checks["export"] = Check(False, _short(e))
        return work
    try:
        work.pte = _etlab_sample(work)
        work.result.etlab_first_s = work.result.samples.pop("etlab")[0]
        work.result.samples.pop("etlab_cpu")
    except Exception as e:
        checks["etlab compile"] = Check(False, _short(e))
        return work
    try:
        checks["etlab run"] = _compare_methods(_run_all(work.pte, work.methods), work.eager, entry)
    except Exception as e:
        checks["etlab run"] = Check(False, _short(e))
    share = SHARED_STATE in entry.tags
    work.portable_dir = up.cached("portable", up.artifact_key("portable", work.programs, share))
    work.xnnpack_dir = up.cached("xnnpack", up.artifact_key("xnnpack", work.programs, share))
    portable = None
    if compiler is not None and (interleave or work.portable_dir is None):
        portable = up.new_job("portable", up.artifact_key("portable", work.programs, share))
    if portable is not None or (work.xnnpack_dir is None and jobs is not None):
        work.programs_dir = Path(tempfile.mkdtemp(prefix=f"{entry.name}-", dir=scratch))
        for m, ep in work.programs.items():
            torch.export.save(ep, work.programs_dir / f"{m}.pt2")
    for i in range(max(repeat, 1)):
        _etlab_sample(work)
        if i == 0 and portable is not None:
            _upstream_sample(work, compiler, portable, timed=interleave)
    warm = work.result.samples.get("etlab", [])
    work.result.etlab_compile_s = statistics.median(warm) if warm else work.result.etlab_first_s
    first = f" (first {work.result.etlab_first_s * 1e3:.0f} ms)" if warm else ""
    checks["etlab compile"] = Check(True, f"{work.result.etlab_compile_s * 1e3:.0f} ms{first}")
    up_times = work.result.samples.get("upstream")
    work.result.upstream_compile_s = statistics.median(up_times) if up_times else None
    _queue_upstream(work, jobs)
    return work


def _etlab_sample(work: _Work) -> bytes:
    """One etlab compile of the model (to_edge + to_executorch + serialize), its wall and CPU time
    appended to the samples."""
    t, cpu = time.perf_counter(), time.process_time()
    pte = bytes(to_edge(work.programs).to_executorch(_config(work.entry)).buffer)
    work.result.samples.setdefault("etlab", []).append(time.perf_counter() - t)
    work.result.samples.setdefault("etlab_cpu", []).append(time.process_time() - cpu)
    return pte


def _upstream_sample(work: _Work, compiler: up.UpstreamCompiler, job: up.PendingJob, timed: bool) -> None:
    """Upstream's compile of the model by the worker, its .pte published to the portable cache; its
    time is a sample when `timed`. A worker stopped by its bounds (memory, timeout) is named n/a."""
    try:
        answer = compiler.compile(work.programs_dir, list(work.programs), job.tmp / "upstream.pte",
                                  SHARED_STATE in work.entry.tags)
    except up.WorkerDied as e:  # its memory bound or timeout stopped it: upstream cannot do it here
        shutil.rmtree(job.tmp, ignore_errors=True)
        work.result.checks["upstream compile"] = Check(None, f"bounded out here: {e}")
        return
    work.portable_dir = up.publish_portable(job, answer)
    if timed and "error" not in answer:
        work.result.samples.setdefault("upstream", []).append(float(answer["seconds"]))
        work.result.samples.setdefault("upstream_cpu", []).append(float(answer["cpu_seconds"]))


def _save_inputs(d: Path, methods: dict[str, tuple]) -> dict[str, Path]:
    paths = {}
    for m, ins in methods.items():
        paths[m] = d / f"{m}.inputs.pt"
        torch.save(list(ins), paths[m])
    return paths


def _queue_upstream(work: _Work, jobs: list[up.PendingJob] | None) -> None:
    """Queues upstream's background jobs whose results are not cached (when `jobs` is a list: None
    means report only what is cached): the XNNPACK lowering and the run of etlab's .pte."""
    methods = list(work.methods)
    if work.xnnpack_dir is None and jobs is not None:
        job = up.new_job("xnnpack", up.artifact_key("xnnpack", work.programs, SHARED_STATE in work.entry.tags))
        job.spec = {"dir": str(job.tmp), "programs_dir": str(work.programs_dir), "methods": methods,
                    "share_mutable_buffers": SHARED_STATE in work.entry.tags}
        jobs.append(job)
        work.xnnpack_dir = job.final
    with tempfile.TemporaryDirectory() as scratch:
        inputs = _save_inputs(Path(scratch), work.methods)
        rkey = up.run_key(work.pte, inputs)
    work.run_dir = up.cached("run", rkey)
    if work.run_dir is None and jobs is not None:
        job = up.new_job("run", rkey)
        _save_inputs(job.tmp, work.methods)
        (job.tmp / "etlab.pte").write_bytes(work.pte)
        job.spec = {"pte": str(job.tmp / "etlab.pte"), "inputs_dir": str(job.tmp), "methods": methods,
                    "out": str(job.tmp)}  # the job runs before the rename into place
        jobs.append(job)
        work.run_dir = job.final


def _load_outputs(prefix: Path, methods) -> dict[str, list[torch.Tensor]]:
    return {m: torch.load(f"{prefix}.{m}.out.pt", weights_only=True) for m in methods}


def _read_json(path: Path) -> dict | None:
    import json

    return json.loads(path.read_text()) if path.is_file() else None


def upstream_phase(work: _Work) -> None:
    """Reads upstream's results for one model and runs etlab on upstream's programs."""
    checks, entry = work.result.checks, work.entry
    if work.methods is None or work.pte is None:
        return
    status = _read_json(work.run_dir / "status.json") if work.run_dir else None
    if work.run_dir is None:
        checks["upstream runs etlab pte"] = Check(None, "not measured (no cached upstream run)")
    elif status is None:
        checks["upstream runs etlab pte"] = Check(False, "no upstream result (see the job's ref.log)")
    elif status.get("ok"):
        got = _load_outputs(work.run_dir / "upstream", work.methods)
        checks["upstream runs etlab pte"] = _compare_methods(got, work.eager, entry)
    elif status.get("bounded"):
        checks["upstream runs etlab pte"] = Check(None, status.get("error", "bounded out")[:200])
    else:
        checks["upstream runs etlab pte"] = _upstream_run_failure(work, up.named_error(status.get("error", "?")))
    if "upstream compile" in checks:  # the worker was bounded out: no .pte
        checks["etlab runs upstream pte"] = Check(None, "upstream wrote no .pte (bounded out)")
    elif work.portable_dir is None:
        for col in ("upstream compile", "etlab runs upstream pte"):
            checks[col] = Check(None, "not measured (no cached upstream compile)")
    else:
        comp = (_read_json(work.portable_dir / "upstream.json") or {}).get("compile", {})
        if not comp.get("ok"):
            # Upstream itself cannot compile it: named, not counted against etlab.
            checks["upstream compile"] = Check(None, f"upstream fails: {up.named_error(comp.get('error', '?'))[:200]}")
            checks["etlab runs upstream pte"] = Check(None, "upstream wrote no .pte")
        else:
            timed = work.result.upstream_compile_s
            checks["upstream compile"] = Check(True, f"{timed:.1f}s" if timed else
                                               f"{comp['seconds']:.1f}s when cached, not timed in this run")
            try:
                outs = _run_all(work.portable_dir / "upstream.pte", work.methods)
                checks["etlab runs upstream pte"] = _compare_methods(outs, work.eager, entry)
            except Exception as e:
                checks["etlab runs upstream pte"] = Check(False, _short(e))
    if work.xnnpack_dir is None:
        checks["xnnpack pte"] = Check(None, "not measured (no cached upstream XNNPACK lowering)")
        return
    res = _read_json(work.xnnpack_dir / "upstream.json")
    checks["xnnpack pte"] = (Check(False, "no upstream result (see the job's ref.log)") if res is None
                             else _xnnpack_check(work, res))


def _kernel_names(pte: bytes | Path) -> set[str]:
    plans = load_pte(pte).program.execution_plan
    return {f"{op.name}.{op.overload}" if op.overload else op.name for p in plans for op in (p.operators or [])}


def _upstream_run_failure(work: _Work, error: str) -> Check:
    """Why upstream's runtime failed on etlab's .pte. Kernels its portable library lacks are named, and
    the failure is n/a when upstream's own .pte needs the same missing kernels (upstream cannot run
    the model either)."""
    if UPSTREAM_OPERATORS is None:
        return Check(False, error[:160])
    missing = sorted(_kernel_names(work.pte) - UPSTREAM_OPERATORS)
    if not missing:
        return Check(False, error[:160])
    own = work.portable_dir / "upstream.pte" if work.portable_dir else None
    own_missing = sorted(_kernel_names(own) - UPSTREAM_OPERATORS) if own and own.is_file() else []
    if own_missing and set(own_missing) >= set(missing):
        return Check(None, f"upstream's runtime has no {', '.join(missing)} kernel (its own .pte needs it too)")
    if own is None or not own.is_file():
        return Check(None, f"upstream's runtime has no {', '.join(missing)} kernel (and upstream cannot compile "
                           "this model)")
    return Check(False, f"upstream's runtime has no {', '.join(missing)} kernel")


def _xnnpack_check(work: _Work, res: dict) -> Check:
    """etlab reads upstream's XNNPACK program (delegates, backend ids, remaining kernels) and runs it if
    a backend named like the delegate is registered; the status says which of these held."""
    xnn = res.get("xnnpack", {})
    if not xnn.get("ok"):
        return Check(None, f"upstream cannot lower: {up.named_error(xnn.get('error', '?'))[:200]}")
    path = work.xnnpack_dir / "xnnpack.pte"
    try:
        pte = load_pte(path)
        plans = pte.program.execution_plan
        delegates = sum(len(p.delegates or []) for p in plans)
        ops = sorted({op.name for p in plans for op in (p.operators or [])})
        backends = sorted({d.id for p in plans for d in (p.delegates or [])})
    except Exception as e:
        return Check(False, f"etlab cannot read it: {_short(e)}")
    detail = f"read: {delegates} {'/'.join(backends) or 'no'} delegates, {len(ops)} kernels"
    try:
        outs = _run_all(path, work.methods)
        check = _compare_methods(outs, work.eager, work.entry)
        return Check(check.ok, f"{detail}; ran, {check.detail}")
    except Exception as e:
        reason = str(e)
        if delegates and any(f"backend {b!r}" in reason for b in backends):
            return Check(True, f"{detail}; not run: etlab has no {'/'.join(backends)} runtime backend")
        return Check(False, f"{detail}; run failed: {_short(e)}")


def inspector_check(work: _Work, outdir: Path) -> None:
    """ETRecord + ETDump with intermediate outputs -> Inspector table, numeric gap and HTML report."""
    from etlab.inspector import Inspector
    from etlab.visualizer import show

    checks = work.result.checks
    if work.pte is None:
        return
    method = next(iter(work.methods))
    try:
        et = to_edge(work.programs, generate_etrecord=True).to_executorch(_config(work.entry))
        pte, rec = outdir / f"{work.entry.name}.pte", outdir / f"{work.entry.name}.etrecord"
        et.write_to_file(str(pte))
        record = et.get_etrecord()
        if method == "forward":
            record.update_representative_inputs(list(work.methods[method]))
        record.save(str(rec))
        # As a user asks for intermediate outputs (README): no debug_buffer_size, the runtime sizes it.
        program = Runtime.get().load_program(pte, enable_etdump=True,
                                             etdump_debug_level=DebugLevel.INTERMEDIATE_OUTPUTS)
        program.load_method(method).execute(list(work.methods[method]))
        etdp, dbg = outdir / f"{work.entry.name}.etdp", outdir / f"{work.entry.name}.bin"
        dropped = program.etdump_dropped_events
        program.write_etdump_result_to_file(str(etdp), str(dbg))
        inspector = Inspector(etdump_path=etdp, etrecord=rec, debug_buffer_path=dbg)
        rows = len(inspector.to_dataframe())
        gap = inspector.calculate_numeric_gap("MSE")
        dash = show(inspector, et, method=method)
        html = Path(dash.save_html(outdir / f"{work.entry.name}.html"))
        worst = float(gap["gap"].map(lambda g: max(g) if isinstance(g, (list, tuple)) else g).max()) \
            if len(gap) and "gap" in gap else float("nan")
        missing = f", no {'/'.join(dash.missing)} view" if getattr(dash, "missing", None) else ""
        ok = rows > 0 and html.stat().st_size > 0 and not dropped
        checks["inspector"] = Check(ok, f"{rows} rows, gap {len(gap)} ops (max MSE {worst:.1e}), html "
                                        f"{html.stat().st_size // 1024} KiB{missing}, debug buffer "
                                        f"{dbg.stat().st_size // 1024 if dbg.is_file() else 0} KiB"
                                        + (f", {dropped} events/values DROPPED" if dropped else ""))
    except Exception as e:
        checks["inspector"] = Check(False, _short(e))


def measure(names: list[str], *, repeat: int = 3, parallel: int = 1, ref_python: str | None = None,
            outdir: Path | None = None, log=print, chunk: int = 6,
            results: list[ModelResult] | None = None, on_result=None, interleave: bool = False) -> list[ModelResult]:
    """Runs the whole harness on `names`. Without a reference python only cached upstream results are
    reported; the rest are n/a, "not measured".

    With `interleave` (the CLI's default) upstream's compile of each model is timed between etlab's
    samples, always (a cached .pte is not reused for the time), and the row gets a side-by-side
    speed-up; without it (tests) upstream's .pte is only made when not cached, and no speed-up.
    Pipelined by chunks of `chunk` models: upstream's background jobs for one chunk (XNNPACK lowering,
    runs of etlab's .pte, in the reference python's processes) run while etlab's phase and the timed
    compiles do the next chunk and the Inspector the previous one, and each model's result is appended
    to `results` as soon as it is complete, so an interrupted run keeps the models it finished;
    `on_result(work)` is called on each (bench/corpus.py keeps it as a row)."""
    global UPSTREAM_OPERATORS
    UPSTREAM_OPERATORS = up.upstream_operators(ref_python)
    results = [] if results is None else results
    upstream: threading.Thread | None = None
    previous: list[_Work] = []
    compiler = up.UpstreamCompiler(ref_python) if ref_python else None
    _warm_up()

    def start_jobs(jobs: list[up.PendingJob] | None) -> threading.Thread | None:
        if not (ref_python and jobs):
            return None
        log(f"[corpus] upstream: {len(jobs)} uncached background jobs "
            f"({sum(j.kind == 'xnnpack' for j in jobs)} XNNPACK lowerings)")
        thread = threading.Thread(target=up.run_jobs, args=(ref_python, jobs),
                                  kwargs={"parallel": parallel, "log": log}, daemon=True)
        thread.start()
        return thread

    with tempfile.TemporaryDirectory() as scratch:
        out = outdir or Path(scratch)
        try:
            for start in range(0, len(names), max(chunk, 1)):
                jobs: list[up.PendingJob] | None = [] if ref_python else None
                works = []
                for name in names[start:start + max(chunk, 1)]:
                    t = time.perf_counter()
                    works.append(etlab_phase(CORPUS[name], repeat, jobs, compiler, interleave, Path(scratch)))
                    speed = works[-1].result.speedup
                    log(f"[corpus] etlab {name}: {time.perf_counter() - t:.1f}s"
                        + (f", speed-up {speed:.1f}x" if speed else ""))
                if upstream is not None:
                    upstream.join()
                upstream = start_jobs(jobs)
                _finish(previous, out, results, log, on_result)
                previous = works
            if upstream is not None:
                upstream.join()
            _finish(previous, out, results, log, on_result)
        finally:
            if compiler is not None:
                compiler.close()
    return results


def _warm_up() -> None:
    """One untimed etlab compile of a tiny model, as upstream's worker does (UpstreamCompiler): lazy imports
    and first-call set-up stay out of the first model's first-compile time on both sides."""
    ep = torch.export.export(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()), (torch.randn(2, 4),))
    bytes(to_edge(ep).to_executorch().buffer)


def _finish(works: list[_Work], out: Path, results: list[ModelResult], log, on_result=None) -> None:
    """Upstream's results and the Inspector check for models whose upstream jobs have finished."""
    for work in works:
        t = time.perf_counter()
        try:
            upstream_phase(work)
        except Exception as e:
            work.result.checks["upstream compile"] = Check(False, _short(e))
            log(traceback.format_exc())
        inspector_check(work, out)
        if work.programs_dir is not None:
            shutil.rmtree(work.programs_dir, ignore_errors=True)
        results.append(work.result)
        if on_result is not None:
            on_result(work)
        failed = [k for k, c in work.result.checks.items() if c.ok is False]
        log(f"[corpus] {len(results)} done: {work.entry.name} {'green' if work.result.green else 'NOT green'}"
            f"{' (failed: ' + ', '.join(failed) + ')' if failed else ''} [{time.perf_counter() - t:.1f}s]")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="*", default=None, help="corpus names (default: all)")
    p.add_argument("--fast", action="store_true", help="only the fast subset make test runs")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--parallel", type=int, default=2, help="reference-python processes for upstream jobs")
    p.add_argument("--chunk", type=int, default=6, help="models per pipelined step (upstream jobs of one "
                   "chunk run while etlab does the next)")
    p.add_argument("--cached-only", action="store_true", help="report cached upstream results, start no jobs "
                   "(keeps no rows)")
    p.add_argument("--no-interleave", action="store_true", help="reuse upstream's cached .pte instead of timing "
                   "its compile next to etlab's (no speed-up in the rows)")
    p.add_argument("--refresh", action="store_true", help="re-measure models whose kept row is current too")
    p.add_argument("--render-only", action="store_true", help="measure nothing: the table of the kept rows")
    p.add_argument("--no-rows", action="store_true", help="neither read nor keep rows: measure every model "
                   "named and table this run only")
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--write-partial", action="store_true",
                   help="write the section even for --models (a run over part of the corpus, marked partial)")
    p.add_argument("--out", type=Path, default=None, help="keep .pte/.etrecord/.etdp/.html per model here")
    p.add_argument("--ref-memory-gb", type=float, default=None, help="address space of each upstream process "
                   "(default 8, ETLAB_CORPUS_REF_MEMORY_GB): past it the check is n/a, bounded out")
    p.add_argument("--job-timeout", type=float, default=None, help="seconds per upstream background job "
                   f"(default {up.JOB_TIMEOUT_S}, ETLAB_CORPUS_JOB_TIMEOUT_S): past it the check is n/a, bounded out")
    a = p.parse_args(argv)
    if a.ref_memory_gb is not None:
        os.environ["ETLAB_CORPUS_REF_MEMORY_GB"] = str(a.ref_memory_gb)
    if a.job_timeout is not None:
        os.environ["ETLAB_CORPUS_JOB_TIMEOUT_S"] = str(a.job_timeout)
    warnings.filterwarnings("ignore")
    names = list(FAST) if a.fast else (a.models or list(CORPUS))
    unknown = [n for n in names if n not in CORPUS]
    if unknown:
        p.error(f"unknown corpus models {unknown}; choose from {sorted(CORPUS)}")
    keep_rows = not (a.no_rows or a.fast or a.cached_only)
    ctx = rows.RunContext.now(up.upstream_version()) if keep_rows or a.render_only else None
    todo = [] if a.render_only else rows.run_order(names, CORPUS, ctx, a.refresh) if keep_rows else names
    if keep_rows:
        print(f"corpus: {len(todo)} of {len(names)} models to measure ({len(names) - len(todo)} kept rows are "
              f"current): {' '.join(todo)}", file=sys.stderr, flush=True)
    ref = None if a.cached_only or not todo else reference_python()
    if todo and not a.cached_only and ref is None:
        print("corpus: the upstream reference python is unavailable (../shared/reference/setup.sh)", file=sys.stderr)
        return 2
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
    results: list[ModelResult] = []
    on_result = (lambda work: _keep_row(work, ctx)) if keep_rows else None
    signal.signal(signal.SIGTERM, _interrupt)  # `timeout` stops a run: keep the models it finished
    try:
        if todo:
            measure(todo, repeat=a.repeat, parallel=a.parallel, ref_python=ref, outdir=a.out, chunk=a.chunk,
                    results=results, on_result=on_result, interleave=not a.no_interleave)
    except KeyboardInterrupt:
        up.stop_jobs()
        print(f"corpus: interrupted after {len(results)} of {len(todo)} models", file=sys.stderr)
    if keep_rows or a.render_only:
        kept = {n: rows.load(n) for n in names}
        results = [ModelResult.from_json(n, r.result) for n, r in kept.items() if r is not None]
        missing = [n for n, r in kept.items() if r is None]
        text = render(results, a.repeat, total=len(names), missing=missing,
                      provenance={n: r.provenance for n, r in kept.items() if r is not None},
                      note=NOTES.read_text() if NOTES.is_file() else "")
    else:
        missing = names[len(results):]
        text = render(results, a.repeat, total=len(names))
    print(text)
    if not a.no_write and not a.fast and (not a.models or a.write_partial) and results:
        write_section("corpus", text)
    return 0 if not missing and all(r.green for r in results) else 1


def _keep_row(work: _Work, ctx: rows.RunContext) -> None:
    """Keeps a finished model's result as its row, unless a check says it was not really measured
    (an upstream job that left no result: the next run tries again)."""
    checks = work.result.checks.values()
    if any(c.unmeasured or c.detail.startswith("no upstream result") for c in checks):
        return
    rows.save(rows.make_row(work.entry.name, work.entry_key, rows.source_key(work.entry), ctx,
                            work.result.to_json()))


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


if __name__ == "__main__":
    sys.exit(main())
