"""Compile speed on every corpus model, etlab next to upstream ExecuTorch, interleaved in ONE run.

    .venv/bin/python bench/corpus_speed.py [--models lstm bert ...] [--upstream-repeat 1] [--refresh]
                                           [--no-write] [--render-only] [--store PATH]

Per model: torch.export once (not timed), saved with torch.export.save for upstream's worker
(bench/_ref_corpus_timer.py, a long-lived reference-python process), so both compilers start from the
same ExportedProgram. Timed: to_edge(...).to_executorch() and serialization, torch.export excluded,
both single-threaded. Order per model: one untimed etlab warm-up, then etlab, upstream, etlab, ...
(each upstream sample between etlab samples), so load drift from other processes hits both sides alike.
The ratio is upstream's median / etlab's median.

ETRecord save, on the models of --etrecord-models (a spread of the largest records by default, `all` for
every model): after the compile samples, each side compiles once more with generate_etrecord=True
(untimed) and times `get_etrecord().save(path)` alone, etlab then upstream then etlab, into the same
scratch directory.

Rows are kept across runs (bench/_speed_rows.py): each model's row is merged into bench/corpus_speed.jsonl
as soon as it is measured, with the commit, UTC time and load it was measured at, and the
`## corpus compile speed` section of bench/RESULTS.md is rendered from the whole store (hand-written notes
between its markers kept). Without --models a run measures the models that have no row first, then those
whose row is stale (etlab's code, the entry's source or upstream changed since), oldest first, and skips
current rows unless --refresh. --no-write leaves the store and RESULTS.md alone; --render-only re-renders
the section from the store. A run from an exported tree (`git archive HEAD`) sets ETLAB_BENCH_COMMIT.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import _speed_rows as store  # noqa: E402
import torch  # noqa: E402
from _common import RESULTS, reference_python, write_section  # noqa: E402
from _corpus_rows import Row, is_current, make_row, source_key  # noqa: E402
from _corpus_upstream import UpstreamCompiler, upstream_version  # noqa: E402

from etlab.compiler import to_edge  # noqa: E402
from etlab.models.corpus import CORPUS  # noqa: E402

SECTION = "corpus compile speed"
TARGET = 10.0  # the bar: etlab at least 10x faster than upstream on every model
# ETRecord save timed on these by default: the biggest records of each family (weights and graph size
# dominate a save), so the extra upstream compile each needs stays a few minutes in all.
ETRECORD_MODELS = ("lstm_bidir_2layer", "bert", "llama_kv", "mobilevit", "tv_resnet50", "tv_efficientnet_v2_s",
                   "tv_densenet121", "tv_swin_t", "tv_fcn_resnet50", "timm_vit_tiny_patch16_224",
                   "timm_coatnet_nano_rw_224", "ta_conv_tasnet")


@dataclass
class Timing:
    """One model's compile times (seconds) on both sides, or why a side has none."""

    name: str
    etlab: list[float] = field(default_factory=list)
    upstream: list[float] = field(default_factory=list)
    etlab_cpu: list[float] = field(default_factory=list)
    upstream_cpu: list[float] = field(default_factory=list)
    error: str = ""
    # ETRecord save: (wall s, CPU s, file bytes) per sample
    etrecord: list[tuple[float, float, int]] = field(default_factory=list)
    upstream_etrecord: list[tuple[float, float, int]] = field(default_factory=list)
    etrecord_error: str = ""

    @property
    def ratio(self) -> float | None:
        if self.etlab and self.upstream:
            return statistics.median(self.upstream) / statistics.median(self.etlab)
        return None

    @property
    def cpu_ratio(self) -> float | None:
        """The same ratio on each process's CPU time: what load from other processes cannot skew."""
        if self.etlab_cpu and self.upstream_cpu:
            return statistics.median(self.upstream_cpu) / statistics.median(self.etlab_cpu)
        return None

    def to_result(self, rounds: int, load: tuple[float, float]) -> dict:
        """The samples as a stored row's `result` (bench/_speed_rows.py)."""
        out = {"etlab_s": self.etlab, "upstream_s": self.upstream, "etlab_cpu": self.etlab_cpu,
               "upstream_cpu": self.upstream_cpu, "error": self.error, "rounds": rounds,
               "load": [round(x, 1) for x in load]}
        if self.etrecord or self.etrecord_error:
            out.update(etrecord=self.etrecord, upstream_etrecord=self.upstream_etrecord,
                       etrecord_error=self.etrecord_error)
        return out

    @classmethod
    def from_row(cls, row: Row) -> Timing:
        r = row.result
        return cls(row.name, list(r.get("etlab_s", [])), list(r.get("upstream_s", [])), list(r.get("etlab_cpu", [])),
                   list(r.get("upstream_cpu", [])), r.get("error", ""),
                   [tuple(x) for x in r.get("etrecord", [])], [tuple(x) for x in r.get("upstream_etrecord", [])],
                   r.get("etrecord_error", ""))

    def save_ratio(self, which: int) -> float | None:
        """Upstream's median ETRecord save time / etlab's (which: 0 wall, 1 CPU)."""
        if self.etrecord and self.upstream_etrecord:
            return (statistics.median(s[which] for s in self.upstream_etrecord)
                    / statistics.median(s[which] for s in self.etrecord))
        return None


def _answer(answer: dict) -> dict:
    """An answer of upstream's worker (_corpus_upstream.UpstreamCompiler); its "error" raised (a worker that
    died or outlived its bounds raises WorkerDied, a RuntimeError, itself)."""
    if "error" in answer:
        raise RuntimeError(answer["error"])
    return answer


def upstream_compile_time(upstream: UpstreamCompiler, directory: Path, methods: list[str]) -> tuple[float, float]:
    """Upstream's compile of the model in `directory`: (wall s, CPU s)."""
    answer = _answer(upstream.compile(directory, methods))
    return float(answer["seconds"]), float(answer["cpu_seconds"])


def upstream_save_time(upstream: UpstreamCompiler, directory: Path, methods: list[str],
                       path: Path) -> tuple[float, float, int]:
    """Upstream's ETRecord save of the model in `directory` to `path`: (wall s, CPU s, bytes)."""
    answer = _answer(upstream.save_etrecord(directory, methods, path))
    return float(answer["seconds"]), float(answer["cpu_seconds"]), int(answer["bytes"])


def _etlab_once(programs, timing: Timing | None = None) -> None:
    t, cpu = time.perf_counter(), time.process_time()
    bytes(to_edge(programs).to_executorch().buffer)
    if timing is not None:
        timing.etlab.append(time.perf_counter() - t)
        timing.etlab_cpu.append(time.process_time() - cpu)


def _etlab_save(programs, path: Path) -> tuple[float, float, int]:
    record = to_edge(programs, generate_etrecord=True).to_executorch().get_etrecord()
    t, cpu = time.perf_counter(), time.process_time()
    record.save(path)
    sample = (time.perf_counter() - t, time.process_time() - cpu, path.stat().st_size)
    path.unlink()
    return sample


def time_etrecord_save(timing: Timing, programs, upstream: UpstreamCompiler | None, d: Path) -> None:
    """ETRecord save on both sides, interleaved: etlab, upstream, etlab (files removed after each)."""
    try:
        timing.etrecord.append(_etlab_save(programs, d / "etlab.etrecord"))
        if upstream is not None:
            up_path = d / "upstream.etrecord"
            try:
                timing.upstream_etrecord.append(upstream_save_time(upstream, d, list(programs), up_path))
            except RuntimeError as e:
                timing.etrecord_error = f"upstream: {e}"[:160].replace("|", "/")
            up_path.unlink(missing_ok=True)
        timing.etrecord.append(_etlab_save(programs, d / "etlab.etrecord"))
    except Exception as e:
        timing.etrecord_error = f"{type(e).__name__}: {e}".splitlines()[0][:160].replace("|", "/")


def time_model(name: str, upstream: UpstreamCompiler | None, rounds: int, scratch: Path,
               etrecord: bool = False, compile_samples: bool = True) -> Timing:
    """Interleaved samples for one model: etlab warm-up, then (etlab, upstream) x rounds, then etlab twice;
    with `etrecord`, then the ETRecord save samples (alone without `compile_samples`)."""
    timing = Timing(name)
    try:
        programs = CORPUS[name].export()
        d = scratch / name
        d.mkdir()
        for method, ep in programs.items():
            torch.export.save(ep, d / f"{method}.pt2")
        if not compile_samples:
            if etrecord:
                time_etrecord_save(timing, programs, upstream, d)
            return timing
        _etlab_once(programs)
        for _ in range(rounds):
            _etlab_once(programs, timing)
            if upstream is not None:
                try:
                    wall, cpu = upstream_compile_time(upstream, d, list(programs))
                    timing.upstream.append(wall)
                    timing.upstream_cpu.append(cpu)
                except RuntimeError as e:
                    timing.error = f"upstream: {e}"[:160].replace("|", "/")
                    upstream = None
        _etlab_once(programs, timing)
        _etlab_once(programs, timing)
        if etrecord:
            time_etrecord_save(timing, programs, upstream, d)
    except Exception as e:
        timing.error = f"{type(e).__name__}: {e}".splitlines()[0][:160].replace("|", "/")
    return timing


def render_etrecord(timings: list[Timing]) -> list[str]:
    """The ETRecord save table: only models whose save was timed."""
    saved = [t for t in timings if t.etrecord or t.etrecord_error]
    if not saved:
        return []
    ratios = [t.save_ratio(0) for t in saved if t.save_ratio(0)]
    cpu = [t.save_ratio(1) for t in saved if t.save_ratio(1)]
    slower = [t.name for t in saved if t.save_ratio(0) and t.save_ratio(0) < 1]
    lines = [
        "", "### ETRecord save", "",
        f"`get_etrecord().save(path)` alone (the compile with generate_etrecord=True untimed), interleaved per model: "
        f"etlab, upstream, etlab; {len(saved)} models (the largest records of each family). etlab writes its own "
        "format atomically (fsync'd), upstream its zip of torch.save members. Ratio = upstream median / etlab median.",
        "",
        (f"**ETRecord save: median {statistics.median(ratios):.1f}x faster than upstream** (min {min(ratios):.2f}x, "
         f"over {len(ratios)} models; slower than upstream: {', '.join(slower) or 'none'}). CPU time: median "
         f"{statistics.median(cpu):.1f}x, min {min(cpu):.2f}x." if ratios and cpu else
         "**No ETRecord save measured on both sides.**"), "",
        "| model | etlab save s (median) | upstream save s | speed-up | CPU speed-up | etlab MB | upstream MB | note |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for t in saved:
        def med(samples, i):
            return statistics.median(s[i] for s in samples) if samples else None
        e, u = med(t.etrecord, 0), med(t.upstream_etrecord, 0)
        eb, ub = med(t.etrecord, 2), med(t.upstream_etrecord, 2)
        r, c = t.save_ratio(0), t.save_ratio(1)
        lines.append(f"| {t.name} | {'n/a' if e is None else f'{e:.2f}'} | {'n/a' if u is None else f'{u:.2f}'} | "
                     f"{'n/a' if r is None else f'{r:.2f}x'} | {'n/a' if c is None else f'{c:.2f}x'} | "
                     f"{'n/a' if eb is None else f'{eb / 1e6:.1f}'} | {'n/a' if ub is None else f'{ub / 1e6:.1f}'} | "
                     f"{t.etrecord_error} |")
    return lines


def render(timings: list[Timing], rounds: int, load: tuple[float, float], total: int | None = None) -> str:
    """The section; `total` > len(timings) marks a run stopped before its last model (PARTIAL)."""
    ratios = [t.ratio for t in timings if t.ratio]
    cpu_ratios = [t.cpu_ratio for t in timings if t.cpu_ratio]
    below = [t.name for t in timings if t.ratio and t.ratio < TARGET]
    lines = [
        "## corpus compile speed", "",
        f"`bench/corpus_speed.py`: to_edge + to_executorch + serialize of the same ExportedProgram (torch.export "
        f"excluded, one thread each side), {'all ' if not total or total <= len(timings) else ''}{len(timings)}"
        f"{f' of {total}' if total and total > len(timings) else ''} corpus models in ONE run, interleaved per model "
        f"(etlab warm-up, then etlab / upstream alternating: {rounds + 2} etlab samples around {rounds} upstream "
        f"sample(s)); speed-up = upstream median / etlab median of wall time; CPU speed-up = the same on each "
        "process's CPU time. Measured under load (load average "
        f"{load[0]:.1f} at the start, {load[1]:.1f} at the end, {os.cpu_count()} cores shared with other work): "
        "absolute times are inflated, the ratio holds because both sides ran in the same conditions.", "",
        (f"**Median speed-up {statistics.median(ratios):.1f}x** (min {min(ratios):.1f}x, max {max(ratios):.1f}x, "
         f"over {len(ratios)} models); below {TARGET:.0f}x: {', '.join(below) or 'none'}." if ratios else
         "**No model measured on both sides.**")
        + (f" CPU-time speed-up: median {statistics.median(cpu_ratios):.1f}x, min {min(cpu_ratios):.1f}x."
           if cpu_ratios else ""), "",
        *([f"**PARTIAL: the run was stopped after {len(timings)} of {total} models**; the others are not in this "
           "table.", ""] if total and total > len(timings) else []),
        "| model | etlab ms (median) | upstream s (median) | speed-up | CPU speed-up | note |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for t in timings:
        e = f"{statistics.median(t.etlab) * 1e3:.0f}" if t.etlab else "n/a"
        u = f"{statistics.median(t.upstream):.2f}" if t.upstream else "n/a"
        r = f"{t.ratio:.1f}x" if t.ratio else "n/a"
        c = f"{t.cpu_ratio:.1f}x" if t.cpu_ratio else "n/a"
        lines.append(f"| {t.name} | {e} | {u} | {r} | {c} | {t.error} |")
    lines += render_etrecord(timings)
    return "\n".join(lines) + "\n"


def _load_text(row: Row) -> str:
    load = row.result.get("load")
    return "-".join(f"{x:.1f}" for x in load) if isinstance(load, list) and load else f"{row.load:.1f}"


def _samples_text(row: Row, t: Timing) -> str:
    """Samples per side; a row kept as medians only (`samples` given) says how many each median was of."""
    e, u = row.result.get("samples") or (len(t.etlab), len(t.upstream))
    return f"{e} / {u}" + (" (medians)" if row.result.get("samples") else "")


def render_store(rows: dict[str, Row], names: list[str], notes: str = "") -> str:
    """The section from every kept row (in corpus order `names`), each with the commit, UTC time and load
    it was measured at; the corpus models without a row are named (PARTIAL)."""
    kept = [rows[n] for n in names if n in rows]
    timings = {r.name: Timing.from_row(r) for r in kept}
    ratios = [t.ratio for t in timings.values() if t.ratio]
    cpu_ratios = [t.cpu_ratio for t in timings.values() if t.cpu_ratio]
    below = [t.name for t in timings.values() if t.ratio and t.ratio < TARGET]
    one_side = [t.name for t in timings.values() if not t.ratio]
    missing = [n for n in names if n not in rows]
    commits = sorted({r.commit for r in kept})
    dates = sorted(r.measured_at for r in kept)
    lines = [
        "## corpus compile speed", "",
        "`bench/corpus_speed.py`: to_edge + to_executorch + serialize of the same ExportedProgram (torch.export "
        "excluded, one thread each side), interleaved per model in one process (an untimed etlab warm-up, then etlab "
        "and upstream alternating, every upstream sample between two etlab samples); speed-up = upstream median / "
        "etlab median of wall time, CPU speed-up = the same on each process's CPU time. Rows are kept across runs "
        "(bench/corpus_speed.jsonl, bench/_speed_rows.py): each row is one model's samples from one run, with the "
        "etlab commit (`+edits`: uncommitted changes in etlab/), the UTC time and the load average (at the model's "
        f"start-end, {os.cpu_count()} cores shared with other work) it was measured at. Under load absolute times "
        "are inflated; a row's ratio holds because both sides ran in the same minutes.", "",
        (f"**Median speed-up {statistics.median(ratios):.1f}x** (min {min(ratios):.1f}x, max {max(ratios):.1f}x, "
         f"over {len(ratios)} of {len(names)} corpus models measured on both sides); below {TARGET:.0f}x: "
         f"{', '.join(below) or 'none'}." if ratios else "**No model measured on both sides.**")
        + (f" CPU-time speed-up: median {statistics.median(cpu_ratios):.1f}x, min {min(cpu_ratios):.1f}x "
           f"(over the {len(cpu_ratios)} rows with CPU times)." if cpu_ratios else ""), "",
        f"{len(kept)} rows, measured at {', '.join(commits)} "
        + " to ".join(sorted({d[:16].replace('T', ' ') for d in (dates[0], dates[-1])})) + " UTC"
        + (f"; no ratio (one side failed): {', '.join(one_side)}" if one_side else "") + "." if kept
        else "No rows kept.", "",
        *([f"**PARTIAL: {len(missing)} of {len(names)} corpus models have no row**: {', '.join(missing)}.", ""]
          if missing else []),
        "| model | etlab ms (median) | upstream s (median) | speed-up | CPU speed-up | samples etlab / upstream | "
        "measured (commit, UTC) | load | note |",
        "|---|---:|---:|---:|---:|---:|---|---:|---|",
    ]
    for r in kept:
        t = timings[r.name]
        e = f"{statistics.median(t.etlab) * 1e3:.0f}" if t.etlab else "n/a"
        u = f"{statistics.median(t.upstream):.2f}" if t.upstream else "n/a"
        lines.append(f"| {t.name} | {e} | {u} | {f'{t.ratio:.1f}x' if t.ratio else 'n/a'} | "
                     f"{f'{t.cpu_ratio:.1f}x' if t.cpu_ratio else 'n/a'} | {_samples_text(r, t)} | "
                     f"{r.provenance} | {_load_text(r)} | {t.error or r.result.get('remark', '')} |")
    lines += render_etrecord(list(timings.values()))
    if notes:
        lines += ["", store.NOTES_BEGIN, notes, store.NOTES_END]
    return "\n".join(lines) + "\n"


def run_order(names: list[str], rows: dict[str, Row], ctx, refresh: bool) -> list[str]:
    """Models with no row first (corpus order), then those whose row is stale, oldest first; current rows
    are skipped unless `refresh` (as bench/corpus.py orders its kept rows)."""
    missing = [n for n in names if n not in rows]
    stale = sorted((n for n in names if n in rows and (refresh or not is_current(rows[n], CORPUS[n], ctx))),
                   key=lambda n: rows[n].measured_at)
    return missing + stale


def write_store_section(path: Path, results: Path | None = None) -> None:
    """Renders the section of `results` (bench/RESULTS.md) from the store at `path`, keeping its notes."""
    results = results or RESULTS
    text = results.read_text() if results.is_file() else ""
    write_section(SECTION, render_store(store.load_store(path), list(CORPUS), store.kept_notes(text, SECTION)),
                  results)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="*", default=None, help="corpus names (default: all)")
    p.add_argument("--upstream-repeat", type=int, default=1, help="upstream samples per model")
    p.add_argument("--no-upstream", action="store_true", help="etlab only (no ratio)")
    p.add_argument("--etrecord-models", nargs="*", default=list(ETRECORD_MODELS),
                   help="models whose ETRecord save is timed too ('all' for every model, none given for none)")
    p.add_argument("--etrecord-only", action="store_true",
                   help="only the ETRecord save samples of --etrecord-models (no compile samples, no write)")
    p.add_argument("--no-write", action="store_true", help="neither the store nor RESULTS.md")
    p.add_argument("--refresh", action="store_true", help="without --models: re-measure current rows too")
    p.add_argument("--render-only", action="store_true", help="only re-render the section from the store")
    p.add_argument("--store", type=Path, default=store.STORE, help="the kept rows (default: %(default)s)")
    a = p.parse_args(argv)
    if a.render_only:
        write_store_section(a.store)
        return 0
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    names = a.models or (list(a.etrecord_models) if a.etrecord_only else list(CORPUS))
    unknown = [n for n in names if n not in CORPUS]
    if unknown:
        p.error(f"unknown corpus models {unknown}; choose from {sorted(CORPUS)}")
    keep = not (a.no_write or a.etrecord_only)
    ctx = store.run_context(upstream_version()) if keep else None
    if keep and not a.models:
        names = run_order(names, store.load_store(a.store), ctx, a.refresh)
        print(f"[speed] {len(names)} models to measure: {' '.join(names)}", flush=True)
    save_models = set(names) if a.etrecord_models == ["all"] else set(a.etrecord_models)
    unknown = sorted(save_models - set(CORPUS))
    if unknown:
        p.error(f"--etrecord-models: unknown corpus models {unknown}")
    ref = None if a.no_upstream else reference_python()
    if not a.no_upstream and ref is None:
        print("corpus_speed: the upstream reference python is unavailable (../shared/reference/setup.sh)",
              file=sys.stderr)
        return 2
    upstream = UpstreamCompiler(ref) if ref else None
    load_start = os.getloadavg()[0]
    timings = []
    signal.signal(signal.SIGTERM, _interrupt)  # `timeout` stops a run: keep the models it timed
    try:
        with tempfile.TemporaryDirectory() as scratch:
            if upstream is not None:  # upstream's one-off imports and first-compile costs, untimed
                (Path(scratch) / "warm").mkdir()
                warm = time_model("dynamic_conv1d", upstream, 1, Path(scratch) / "warm")
                print(f"[speed] upstream warm-up: {warm.upstream}", flush=True)
            for name in names:
                model_load = os.getloadavg()[0]
                timings.append(time_model(name, upstream, a.upstream_repeat, Path(scratch), name in save_models,
                                          compile_samples=not a.etrecord_only))
                t = timings[-1]
                if keep:
                    result = t.to_result(a.upstream_repeat, (model_load, os.getloadavg()[0]))
                    store.merge([make_row(name, "", source_key(CORPUS[name]), ctx, result)], a.store)
                print(f"[speed] {name}: etlab {[round(x * 1e3) for x in t.etlab]} ms, upstream "
                      f"{[round(x, 2) for x in t.upstream]} s, ratio {t.ratio and round(t.ratio, 1)}, CPU ratio "
                      f"{t.cpu_ratio and round(t.cpu_ratio, 1)} {t.error}", flush=True)
                if t.etrecord or t.etrecord_error:
                    print(f"[speed] {name} etrecord save: etlab {[round(x[0], 2) for x in t.etrecord]} s, upstream "
                          f"{[round(x[0], 2) for x in t.upstream_etrecord]} s, ratio "
                          f"{t.save_ratio(0) and round(t.save_ratio(0), 2)}, CPU s etlab "
                          f"{[round(x[1], 2) for x in t.etrecord]} upstream "
                          f"{[round(x[1], 2) for x in t.upstream_etrecord]} {t.etrecord_error}", flush=True)
    except KeyboardInterrupt:
        print(f"corpus_speed: interrupted after {len(timings)} of {len(names)} models", file=sys.stderr)
    finally:
        if upstream is not None:  # stopped mid-request: nothing to wait for
            upstream.close(kill=len(timings) < len(names))
    if a.etrecord_only:
        print("\n".join(render_etrecord(timings)))
        return 0
    print(render(timings, a.upstream_repeat, (load_start, os.getloadavg()[0]), total=len(names)))
    if keep:
        write_store_section(a.store)
    return 0


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


if __name__ == "__main__":
    sys.exit(main())
