"""Inspector benchmark: load + to_dataframe, etlab vs upstream ExecuTorch's Inspector on the same
files in one run, and etlab on a 1e6-event ETDump.

    .venv/bin/python bench/inspector.py [--repeats N] [--upstream-1m] [--etrecord-only]
    .venv/bin/python bench/inspector.py --corpus [NAME ...] [--prepare-only | --no-prepare] [--rounds N]

Upstream-written dumps (zoo models exported and run by upstream 1.5.1 through
../shared/reference/et_ref.py) and the synthetic 1e6-event dump are cached under
~/.cache/etlab/bench. "load + to_dataframe" is `Inspector(etdump_path, debug_buffer_path)` then
`.to_dataframe()`, timed in-process on both sides (upstream's own timing from `et_ref.py
inspect`, imports excluded). Medians. Writes the `## inspector` section of bench/RESULTS.md.

With upstream's .etrecord: the same, plus `etrecord=` the upstream-written `model.etrecord` (read by
etlab's pickle-free reader; upstream's Inspector deserializes its programs); its lines sit between
ETRECORD_BEGIN/END in the section, and `--etrecord-only` re-measures just those.

`--corpus`: the same with upstream's `.etrecord`, over every model of etlab.models.corpus (not the zoo
alone): etlab exports each model and saves the ExportedProgram; upstream (bench/_ref_inspector_corpus.py,
reference python) compiles it with its ETRecord and runs it twice with ETDump and debug buffer (cached per
model under ~/.cache/etlab/bench). Then, per model, both Inspectors are timed warm on upstream's files,
interleaved: upstream's in a reference-python server (`_ref_inspector_corpus.py --serve`), etlab's in this
process, in alternating rounds (CPU and wall medians, load average recorded). Its lines sit between
CORPUS_BEGIN/END.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ET_REF, REPO, RESULTS, median, ref_env, reference_python, run_ref, write_section

from etlab.etdump import read_etdump
from etlab.etrecord import parse_etrecord
from etlab.inspector import Inspector
from etlab.schema import write_atomic

CACHE = Path(os.environ.get("ETLAB_BENCH_CACHE", Path.home() / ".cache" / "etlab" / "bench"))
ZOO = REPO / "etlab" / "models" / "zoo.py"
SYNTH_RUNS, SYNTH_OPS = 1000, 498   # 1000 runs x (2 * 498 ops + 3 delegate events + Method::execute) = 1e6
ETRECORD_CASES = [("mlp", 2, True), ("cnn", 2, True), ("transformer", 2, True)]
ETRECORD_BEGIN, ETRECORD_END = "<!-- etrecord -->", "<!-- /etrecord -->"
CORPUS_BEGIN, CORPUS_END = "<!-- corpus -->", "<!-- /corpus -->"
REF_CORPUS = Path(__file__).resolve().parent / "_ref_inspector_corpus.py"
CORPUS_MARKER = "upstream_inspector.json"
CORPUS_RECIPE = "inspector-corpus-v1: to_edge(generate_etrecord) + 2 runs with ETDump and debug buffer"
UPSTREAM_CASES = [  # (model, iterations, with debug buffer)
    ("mlp", 2, True), ("cnn", 2, True), ("transformer", 2, True),
    ("cnn", 100, False), ("transformer", 100, False),
]


def upstream_dump(ref: str, model: str, iters: int, debug: bool) -> Path:
    """run.etdp (+ run.bin) written by upstream's runtime for a zoo model, cached."""
    key = hashlib.sha256(ZOO.read_bytes() + ET_REF.read_bytes()).hexdigest()[:12]
    d = CACHE / f"upstream-{model}-x{iters}{'-dbg' if debug else ''}-{key}"
    if (d / "run.etdp").is_file():
        return d
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=CACHE))
    try:
        print(f"[bench] exporting and running {model} x{iters} with upstream ...", file=sys.stderr, flush=True)
        run_ref(ref, ET_REF, "export", f"{ZOO}:make_{model}", "--out", tmp)
        extra = ["--debug-buffer", tmp / "run.bin", "--debug-buffer-size", str(16 << 20)] if debug else []
        run_ref(ref, ET_REF, "run", tmp / "model.pte", "--inputs", tmp / "inputs.pt", "--etdump", tmp / "run.etdp",
             "--iters", str(iters), *extra)
        os.replace(tmp, d)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return d


def synthetic_1m() -> Path:
    from etlab.etdump._synthetic import synthetic_etdump
    from etlab.schema import serialize_etdump

    path = CACHE / f"synthetic-{SYNTH_RUNS}x{SYNTH_OPS}-v1.etdp"
    if not path.is_file():
        print("[bench] building the 1e6-event ETDump (a few minutes, cached) ...", file=sys.stderr, flush=True)
        write_atomic(path, serialize_etdump(synthetic_etdump(SYNTH_RUNS, SYNTH_OPS, delegate=True)))
        gc.collect()
    return path


def time_ours(etdp: Path, buf: Path | None, repeats: int, etrecord: Path | None = None) -> tuple[float, int]:
    times, rows = [], 0
    for _ in range(repeats):
        t = time.perf_counter()
        df = Inspector(etdump_path=etdp, etrecord=etrecord, debug_buffer_path=buf).to_dataframe()
        times.append(time.perf_counter() - t)
        rows = len(df)
        del df
    return median(times), rows


def time_upstream(ref: str, etdp: Path, buf: Path | None, repeats: int, timeout: float = 900,
                  etrecord: Path | None = None) -> tuple[float, int]:
    times, rows = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeats):
            out = Path(tmp) / "df.json"
            args = [ET_REF, "inspect", etdp, "--json", out] + (["--debug-buffer", buf] if buf else []) + \
                (["--etrecord", etrecord] if etrecord else [])
            run_ref(ref, *args, timeout=timeout)
            got = json.loads(out.read_text())
            times.append(got["seconds"])
            rows = len(got["rows"])
    return median(times), rows


def etrecord_lines(ref: str, repeats: int) -> list[str]:
    """The with-upstream-.etrecord table (its own lines of the section, between the markers)."""
    lines = [ETRECORD_BEGIN, "", "With the upstream-written `.etrecord` (`Inspector(etdump_path, etrecord=..., "
             "debug_buffer_path)` then `.to_dataframe()`: reading the record included):", "",
             "| upstream-written files | rows | etlab (ms) | of which parse_etrecord (ms) | upstream (ms) | speed-up |",
             "|---|---:|---:|---:|---:|---:|"]
    ratios = []
    for model, iters, debug in ETRECORD_CASES:
        d = upstream_dump(ref, model, iters, debug)
        etdp, buf, record = d / "run.etdp", (d / "run.bin" if debug else None), d / "model.etrecord"
        ours, rows = time_ours(etdp, buf, repeats, etrecord=record)
        parse = median([_timed(parse_etrecord, record) for _ in range(repeats)])
        theirs, their_rows = time_upstream(ref, etdp, buf, 3, etrecord=record)
        if rows != their_rows:
            raise RuntimeError(f"{etdp}: etlab shows {rows} rows, upstream {their_rows}")
        ratios.append(theirs / ours)
        lines.append(f"| {model}, {iters} iterations{' + debug buffer' if debug else ''} + .etrecord "
                     f"({record.stat().st_size / 1e3:.0f} kB) | {rows} | {ours * 1e3:.1f} | {parse * 1e3:.1f} "
                     f"| {theirs * 1e3:.1f} "
                     f"| {theirs / ours:.0f}x |")
        print(lines[-1], file=sys.stderr, flush=True)
    lines += ["", f"Speed-up with the .etrecord: median {median(ratios):.0f}x, min {min(ratios):.0f}x "
              f"(target >= 20x; load average {os.getloadavg()[0]:.1f}"
              f"{', measured under load' if os.getloadavg()[0] > 2 else ''}).", "", ETRECORD_END]
    return lines


def _timed(fn, *args) -> float:
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


def corpus_dir(name: str) -> tuple[Path, dict | None]:
    """Where upstream's files for corpus model `name` are cached, and the finished job's result (or None).
    The key hashes what shapes the model (bench/_corpus_upstream.compile_key) and CORPUS_RECIPE (bump it
    when bench/_ref_inspector_corpus.py makes its files differently)."""
    import _corpus_upstream as up

    from etlab.models.corpus import CORPUS

    entry = CORPUS[name]
    key = hashlib.sha256((up.compile_key(name, Path(sys.modules[entry.factory.__module__].__file__))
                          ).encode() + CORPUS_RECIPE.encode()).hexdigest()[:16]
    d = CACHE / f"corpus-{name}-{key}"
    marker = d / CORPUS_MARKER
    return d, (json.loads(marker.read_text()) if marker.is_file() else None)


def _export_error(name: str) -> Path:
    """Where the last failure of etlab's side to build or export corpus model `name` is noted."""
    CACHE.mkdir(parents=True, exist_ok=True)
    return CACHE / f"corpus-{name}.export-error"


def prepare_corpus(ref: str, names: list[str]) -> None:
    """Exports the models whose upstream files are missing and has the reference python make them."""
    import torch

    from etlab.models.corpus import CORPUS, SHARED_STATE

    jobs = []
    for name in names:
        d, done = corpus_dir(name)
        if done is not None:
            continue
        entry = CORPUS[name]
        print(f"[bench] exporting {name} for upstream ...", file=sys.stderr, flush=True)
        try:
            built = entry.build()
            programs = entry.export(built)
        except Exception as e:  # a model etlab's side cannot export is reported in the table
            print(f"[bench] {name}: export failed: {e}", file=sys.stderr, flush=True)
            _export_error(name).write_text(f"{type(e).__name__}: {e}".splitlines()[0][:300])
            continue
        _export_error(name).unlink(missing_ok=True)
        d.mkdir(parents=True, exist_ok=True)
        for m, ep in programs.items():
            torch.export.save(ep, d / f"{m}.pt2")
            torch.save(list(built[1][m]), d / f"{m}.inputs.pt")
        methods = list(programs)
        jobs.append({"dir": str(d), "methods": methods, "run": "forward" if "forward" in methods else methods[0],
                     "share_mutable_buffers": SHARED_STATE in entry.tags})
    if not jobs:
        return
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "jobs.json"
        spec.write_text(json.dumps(jobs))
        print(f"[bench] upstream compiles, runs and inspects {len(jobs)} corpus models ...", file=sys.stderr,
              flush=True)
        subprocess.run([ref, str(REF_CORPUS), str(spec)], env=ref_env(), check=False, timeout=4 * 3600)


def _time_ours(etdp: Path, buf: Path, record: Path, repeats: int) -> tuple[list[float], list[float], int]:
    """etlab's Inspector on one model's files, `repeats` timed loads: (wall seconds, CPU seconds, rows)."""
    wall, cpu, rows = [], [], 0
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        rows = len(Inspector(etdump_path=etdp, etrecord=record, debug_buffer_path=buf).to_dataframe())
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return wall, cpu, rows


class _UpstreamTimer:
    """bench/_ref_inspector_corpus.py --serve under the reference python: upstream's Inspector timed on
    request, warm in its own process, so that the two tools' loads alternate."""

    reply = "@@inspector-timing "  # what starts the server's replies (libraries may print to stdout too)

    def __init__(self, ref: str):
        self.proc = subprocess.Popen([ref, str(REF_CORPUS), "--serve", self.reply], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=ref_env())

    def time(self, d: Path, repeats: int, warm: bool = False) -> dict:
        self.proc.stdin.write(json.dumps({"dir": str(d), "repeats": repeats, "warm": warm}) + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith(self.reply):
                return json.loads(line[len(self.reply):])
        raise RuntimeError(f"the upstream timer ended (exit {self.proc.wait()})")

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def _interleaved(timer: _UpstreamTimer, d: Path, rounds: int, ours_per_round: int, theirs_per_round: int) -> dict:
    """Both Inspectors on model directory `d`, warm (one untimed load each), then `rounds` rounds, each
    timing upstream's and etlab's loads back to back (which goes first alternates): medians over all
    timed loads, and the load average over the model's measurement."""
    load0 = os.getloadavg()[0]
    first = timer.time(d, 0, warm=True)
    if not first.get("ok"):
        return {"ok": False, "error": first.get("error")}
    files = (d / "run.etdp", d / "run.bin", d / "model.etrecord")
    _time_ours(*files, 1)
    ours_wall, ours_cpu, theirs_wall, theirs_cpu, rows, their_rows = [], [], [], [], 0, 0
    for r in range(rounds):
        for side in ("theirs", "ours") if r % 2 == 0 else ("ours", "theirs"):
            if side == "ours":
                w, c, rows = _time_ours(*files, ours_per_round)
                ours_wall += w
                ours_cpu += c
            else:
                got = timer.time(d, theirs_per_round)
                if not got.get("ok"):
                    return {"ok": False, "error": got.get("error")}
                theirs_wall += got["seconds"]
                theirs_cpu += got["cpu_seconds"]
                their_rows = got["rows"]
    if rows != their_rows:
        raise RuntimeError(f"{d}: etlab shows {rows} rows, upstream {their_rows}")
    return {"ok": True, "rows": rows, "ours_cpu": median(ours_cpu), "ours_wall": median(ours_wall),
            "theirs_cpu": median(theirs_cpu), "theirs_wall": median(theirs_wall), "n_ours": len(ours_cpu),
            "n_theirs": len(theirs_cpu), "load": (load0 + os.getloadavg()[0]) / 2}


def _made_earlier(name: str, d: Path, done: dict | None) -> tuple[Path, dict | None]:
    """The newest finished upstream files of corpus model `name` under any cache key (made from earlier
    sources of the model; the key hashes its whole source files, docstrings included)."""
    made = sorted((m.stat().st_mtime, m.parent) for m in CACHE.glob(f"corpus-{name}-*/{CORPUS_MARKER}"))
    if not made:
        return d, done
    newest = made[-1][1]
    return newest, json.loads((newest / CORPUS_MARKER).read_text())


def corpus_lines(ref: str, names: list[str], rounds: int = 3, ours_per_round: int = 5, theirs_per_round: int = 1,
                 prepare: bool = True, reuse_made: bool = False) -> list[str]:
    """Per corpus model: etlab's Inspector vs upstream's on upstream's files with upstream's .etrecord, both
    timed in this sitting, interleaved (`_interleaved`). `prepare=False` measures the models whose files
    are made and lists the others as not measured; `reuse_made` takes a model's newest files made under an
    earlier cache key when its current key has none (said in the lines)."""
    if prepare:
        prepare_corpus(ref, names)
    lines = [CORPUS_BEGIN, "", f"Every model of the corpus (etlab.models.corpus, {len(names)} models) that upstream "
             "compiles and runs: upstream-written `.pte`, `.etrecord`, 2-iteration `.etdp` and debug buffer; "
             "`Inspector(etdump_path, etrecord=..., debug_buffer_path)` then `.to_dataframe()`, warm (one untimed "
             "load each), in process on both sides (upstream's in the reference python, "
             "bench/_ref_inspector_corpus.py --serve), interleaved per model: "
             f"{rounds} rounds of {theirs_per_round} upstream load(s) and {ours_per_round} etlab loads back to back, "
             "which goes first alternating; medians over all timed loads. The speed-up is of process CPU time: on "
             f"this shared machine ({os.cpu_count()} cores, other jobs running; load average per model in the "
             "table) wall times are mostly waiting; they are given too.", "",
             "| model | rows | etlab CPU (ms) | upstream CPU (ms) | speed-up (CPU) | etlab wall (ms) "
             "| upstream wall (ms) | load |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    ratios, skipped, loads, reused = {}, [], [], []
    timer = _UpstreamTimer(ref)
    try:
        for name in names:
            d, done = corpus_dir(name)  # looked at when reached: files still being made may be ready by then
            if done is None and reuse_made:
                d, done = _made_earlier(name, d, done)
                if done is not None:
                    reused.append(name)
            if done is None or not done.get("ok"):
                if done is not None:
                    why = "upstream: " + (done.get("error") or "failed")
                elif _export_error(name).is_file():
                    why = "not exported here: " + _export_error(name).read_text()
                else:
                    why = "upstream's files not made in this sitting"
                skipped.append(f"{name} ({why.splitlines()[0][:120] if why.strip() else why})")
                continue
            got = _interleaved(timer, d, rounds, ours_per_round, theirs_per_round)
            if not got["ok"]:
                skipped.append(f"{name} (upstream's Inspector: {str(got['error'])[:120]})")
                continue
            ratios[name] = got["theirs_cpu"] / got["ours_cpu"]
            loads.append(got["load"])
            lines.append(f"| {name} | {got['rows']} | {got['ours_cpu'] * 1e3:.1f} | {got['theirs_cpu'] * 1e3:.0f} "
                         f"| {ratios[name]:.0f}x | {got['ours_wall'] * 1e3:.1f} | {got['theirs_wall'] * 1e3:.0f} "
                         f"| {got['load']:.1f} |")
            print(lines[-1], file=sys.stderr, flush=True)
    finally:
        timer.close()
    below = [f"{n} ({r:.1f}x)" for n, r in ratios.items() if r < 20]
    if ratios:
        lines += ["", f"Speed-up (CPU time) over {len(ratios)} corpus models, {time.strftime('%Y-%m-%d')}: median "
                  f"{median(ratios.values()):.0f}x, min {min(ratios.values()):.1f}x ({min(ratios, key=ratios.get)}); "
                  f"below the 20x target: {', '.join(below) or 'none'}. Load average {min(loads):.1f}-"
                  f"{max(loads):.1f} while measuring."]
    if reused:
        lines += ["", f"Upstream's files of {len(reused)} models were made under an earlier cache key of the model "
                  "(its source files changed since; `--reuse-made`): " + ", ".join(reused) + "."]
    if skipped:
        lines += ["", f"Not measured ({len(skipped)}): {'; '.join(skipped)}."]
    return [*lines, "", CORPUS_END]


def _kept_corpus_block() -> list[str]:
    """The corpus lines of the current section (measured by `--corpus`, kept by a full run)."""
    text = RESULTS.read_text() if RESULTS.is_file() else ""
    if CORPUS_BEGIN not in text:
        return []
    return [*(CORPUS_BEGIN + text.split(CORPUS_BEGIN, 1)[1].split(CORPUS_END, 1)[0] + CORPUS_END).splitlines(), ""]


def replace_etrecord_lines(lines: list[str], begin: str = ETRECORD_BEGIN, end: str = ETRECORD_END) -> None:
    """Puts `lines` in place of the marked block (`begin`..`end`) of the inspector section (or at its end)."""
    text = RESULTS.read_text()
    start = text.index("## inspector")
    nxt = text.find("\n## ", start + 1)
    section = text[start:] if nxt < 0 else text[start:nxt + 1]
    block = "\n".join(lines)
    if begin in section:
        head, rest = section.split(begin, 1)
        section = head + block + rest.split(end, 1)[1]
    else:
        section = section.rstrip("\n") + "\n\n" + block + "\n"
    write_section("inspector", section)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15, help="timed repetitions per case for etlab (upstream: 3)")
    ap.add_argument("--upstream-1m", action="store_true", help="also time upstream on the 1e6-event dump (slow)")
    ap.add_argument("--etrecord-only", action="store_true", help="only the with-.etrecord lines")
    ap.add_argument("--corpus", nargs="*", metavar="NAME", default=None,
                    help="only the corpus lines (upstream's files and .etrecord), for NAMEs or every corpus model")
    ap.add_argument("--prepare-only", action="store_true", help="with --corpus: only make upstream's files")
    ap.add_argument("--no-prepare", action="store_true",
                    help="with --corpus: measure only the models whose upstream files are made (no export, no "
                    "upstream compile); the others are listed as not measured")
    ap.add_argument("--rounds", type=int, default=3, help="with --corpus: interleaved rounds per model")
    ap.add_argument("--reuse-made", action="store_true",
                    help="with --corpus: a model without files under its current cache key is measured on its newest "
                    "files made under an earlier key (listed in the results)")
    a = ap.parse_args(argv)
    ref = reference_python()
    if ref is None:
        sys.exit("bench/inspector.py: the upstream reference python (../shared/reference/setup.sh) is unavailable")
    if a.etrecord_only:
        replace_etrecord_lines(etrecord_lines(ref, a.repeats))
        return 0
    if a.corpus is not None:
        from etlab.models.corpus import CORPUS

        names = a.corpus or list(CORPUS)
        if a.prepare_only:
            prepare_corpus(ref, names)
            return 0
        replace_etrecord_lines(corpus_lines(ref, names, a.rounds, prepare=not a.no_prepare,
                                            reuse_made=a.reuse_made), CORPUS_BEGIN, CORPUS_END)
        return 0
    lines = ["| upstream-written file | events | rows | etlab (ms) | upstream (ms) | speed-up |",
             "|---|---:|---:|---:|---:|---:|"]
    ratios = []
    for model, iters, debug in UPSTREAM_CASES:
        d = upstream_dump(ref, model, iters, debug)
        etdp, buf = d / "run.etdp", (d / "run.bin" if debug else None)
        n_events = len(read_etdump(etdp))
        ours, rows = time_ours(etdp, buf, a.repeats)
        theirs, their_rows = time_upstream(ref, etdp, buf, 3)
        if rows != their_rows:
            raise RuntimeError(f"{etdp}: etlab shows {rows} rows, upstream {their_rows}")
        ratios.append(theirs / ours)
        label = f"{model}, {iters} iterations{' + debug buffer' if debug else ''}"
        lines.append(f"| {label} | {n_events} | {rows} | {ours * 1e3:.2f} | {theirs * 1e3:.1f} "
                     f"| {theirs / ours:.0f}x |")
        print(lines[-1], file=sys.stderr, flush=True)

    big = synthetic_1m()
    n_big = len(read_etdump(big))
    gc.collect()
    big_times = []
    for _ in range(3):
        t = time.perf_counter()
        ins = Inspector(etdump_path=big)
        df = ins.to_dataframe()
        big_times.append(time.perf_counter() - t)
        t = time.perf_counter()
        _ = ins.event_blocks
        blocks_s = time.perf_counter() - t
        big_rows = len(df)
        del ins, df, _
    big_s = median(big_times)
    upstream_big = "not run (use --upstream-1m)"
    if a.upstream_1m:
        try:
            s, _rows = time_upstream(ref, big, None, 1, timeout=1800)
            upstream_big = f"{s:.1f} s ({s / big_s:.0f}x slower)"
        except subprocess.TimeoutExpired:
            upstream_big = "did not finish within 30 min"
    load = os.getloadavg()[0]
    text = "\n".join([
        "## inspector",
        "",
        f"`bench/inspector.py`, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, load average {load:.1f} "
        "when it ran (other jobs share the machine: absolute times are noisy, ratios less so). "
        "Load + to_dataframe: `Inspector(etdump_path, debug_buffer_path)` then `.to_dataframe()`, in-process "
        f"on both sides; medians of {a.repeats} (etlab) and 3 (upstream 1.5.1, timed by `et_ref.py inspect`).",
        "",
        *lines,
        "",
        f"Speed-up over upstream: median {median(ratios):.0f}x, min {min(ratios):.0f}x (target >= 20x).",
        "",
        f"Synthetic dump, {n_big:,} events ({SYNTH_RUNS} runs, {big.stat().st_size / 1e6:.0f} MB, "
        f"{big_rows} rows): load + to_dataframe **{big_s:.2f} s** (median of 3; target < 5 s); "
        f"building the Event objects (`event_blocks`) afterwards {blocks_s:.2f} s. Upstream: {upstream_big}.",
        "",
        *etrecord_lines(ref, a.repeats),
        "",
        *_kept_corpus_block(),
    ])
    write_section("inspector", text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
