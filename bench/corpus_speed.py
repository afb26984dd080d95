"""Compile speed on every corpus model, etlab next to upstream ExecuTorch, interleaved in ONE run.

    .venv/bin/python bench/corpus_speed.py [--models lstm bert ...] [--upstream-repeat 1] [--no-write]

Per model: torch.export once (not timed), saved with torch.export.save for upstream's worker
(bench/_ref_corpus_timer.py, a long-lived reference-python process), so both compilers start from the
same ExportedProgram. Timed: to_edge(...).to_executorch() and serialization, torch.export excluded,
both single-threaded. Order per model: one untimed etlab warm-up, then etlab, upstream, etlab, ...
(each upstream sample between etlab samples), so load drift from other processes hits both sides alike.
The ratio is upstream's median / etlab's median. Writes the `## corpus compile speed` section of
bench/RESULTS.md unless --no-write or --models.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from _common import ref_env, reference_python, write_section  # noqa: E402

from etlab.compiler import to_edge  # noqa: E402
from etlab.models.corpus import CORPUS  # noqa: E402

TARGET = 10.0  # the bar: etlab at least 10x faster than upstream on every model


@dataclass
class Timing:
    """One model's compile times (seconds) on both sides, or why a side has none."""

    name: str
    etlab: list[float] = field(default_factory=list)
    upstream: list[float] = field(default_factory=list)
    etlab_cpu: list[float] = field(default_factory=list)
    upstream_cpu: list[float] = field(default_factory=list)
    error: str = ""

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


class UpstreamTimer:
    """The reference-python worker: one request (a directory of .pt2 files) in, one timing out."""

    def __init__(self, ref_python: str):
        self.proc = subprocess.Popen([ref_python, str(HERE / "_ref_corpus_timer.py")], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=ref_env())

    def time(self, directory: Path, methods: list[str]) -> tuple[float, float]:
        self.proc.stdin.write(json.dumps({"dir": str(directory), "methods": methods}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"upstream timer exited (code {self.proc.poll()})")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return float(answer["seconds"]), float(answer["cpu_seconds"])

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def _etlab_once(programs, timing: Timing | None = None) -> None:
    t, cpu = time.perf_counter(), time.process_time()
    bytes(to_edge(programs).to_executorch().buffer)
    if timing is not None:
        timing.etlab.append(time.perf_counter() - t)
        timing.etlab_cpu.append(time.process_time() - cpu)


def time_model(name: str, upstream: UpstreamTimer | None, rounds: int, scratch: Path) -> Timing:
    """Interleaved samples for one model: etlab warm-up, then (etlab, upstream) x rounds, then etlab twice."""
    timing = Timing(name)
    try:
        programs = CORPUS[name].export()
        d = scratch / name
        d.mkdir()
        for method, ep in programs.items():
            torch.export.save(ep, d / f"{method}.pt2")
        _etlab_once(programs)
        for _ in range(rounds):
            _etlab_once(programs, timing)
            if upstream is not None:
                try:
                    wall, cpu = upstream.time(d, list(programs))
                    timing.upstream.append(wall)
                    timing.upstream_cpu.append(cpu)
                except RuntimeError as e:
                    timing.error = f"upstream: {e}"[:160].replace("|", "/")
                    upstream = None
        _etlab_once(programs, timing)
        _etlab_once(programs, timing)
    except Exception as e:
        timing.error = f"{type(e).__name__}: {e}".splitlines()[0][:160].replace("|", "/")
    return timing


def render(timings: list[Timing], rounds: int, load: tuple[float, float]) -> str:
    ratios = [t.ratio for t in timings if t.ratio]
    cpu_ratios = [t.cpu_ratio for t in timings if t.cpu_ratio]
    below = [t.name for t in timings if t.ratio and t.ratio < TARGET]
    lines = [
        "## corpus compile speed", "",
        f"`bench/corpus_speed.py`: to_edge + to_executorch + serialize of the same ExportedProgram (torch.export "
        f"excluded, one thread each side), all {len(timings)} corpus models in ONE run, interleaved per model "
        f"(etlab warm-up, then etlab / upstream alternating: {rounds + 2} etlab samples around {rounds} upstream "
        f"sample(s)); speed-up = upstream median / etlab median of wall time; CPU speed-up = the same on each "
        "process's CPU time. Measured under load (load average "
        f"{load[0]:.1f} at the start, {load[1]:.1f} at the end, {os.cpu_count()} cores shared with other work): "
        "absolute times are inflated, the ratio holds because both sides ran in the same conditions.", "",
        f"**Median speed-up {statistics.median(ratios):.1f}x** (min {min(ratios):.1f}x, max {max(ratios):.1f}x, "
        f"over {len(ratios)} models); below {TARGET:.0f}x: {', '.join(below) or 'none'}. CPU-time speed-up: median "
        f"{statistics.median(cpu_ratios):.1f}x, min {min(cpu_ratios):.1f}x." if ratios and cpu_ratios else
        "**No model measured on both sides.**", "",
        "| model | etlab ms (median) | upstream s (median) | speed-up | CPU speed-up | note |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for t in timings:
        e = f"{statistics.median(t.etlab) * 1e3:.0f}" if t.etlab else "n/a"
        u = f"{statistics.median(t.upstream):.2f}" if t.upstream else "n/a"
        r = f"{t.ratio:.1f}x" if t.ratio else "n/a"
        c = f"{t.cpu_ratio:.1f}x" if t.cpu_ratio else "n/a"
        lines.append(f"| {t.name} | {e} | {u} | {r} | {c} | {t.error} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="*", default=None, help="corpus names (default: all)")
    p.add_argument("--upstream-repeat", type=int, default=1, help="upstream samples per model")
    p.add_argument("--no-upstream", action="store_true", help="etlab only (no ratio)")
    p.add_argument("--no-write", action="store_true")
    a = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    names = a.models or list(CORPUS)
    unknown = [n for n in names if n not in CORPUS]
    if unknown:
        p.error(f"unknown corpus models {unknown}; choose from {sorted(CORPUS)}")
    ref = None if a.no_upstream else reference_python()
    if not a.no_upstream and ref is None:
        print("corpus_speed: the upstream reference python is unavailable (../shared/reference/setup.sh)",
              file=sys.stderr)
        return 2
    upstream = UpstreamTimer(ref) if ref else None
    load_start = os.getloadavg()[0]
    timings = []
    try:
        with tempfile.TemporaryDirectory() as scratch:
            if upstream is not None:  # upstream's one-off imports and first-compile costs, untimed
                (Path(scratch) / "warm").mkdir()
                warm = time_model("dynamic_conv1d", upstream, 1, Path(scratch) / "warm")
                print(f"[speed] upstream warm-up: {warm.upstream}", flush=True)
            for name in names:
                timings.append(time_model(name, upstream, a.upstream_repeat, Path(scratch)))
                t = timings[-1]
                print(f"[speed] {name}: etlab {[round(x * 1e3) for x in t.etlab]} ms, upstream "
                      f"{[round(x, 2) for x in t.upstream]} s, ratio {t.ratio and round(t.ratio, 1)} {t.error}",
                      flush=True)
    finally:
        if upstream is not None:
            upstream.close()
    text = render(timings, a.upstream_repeat, (load_start, os.getloadavg()[0]))
    print(text)
    if not a.no_write and not a.models:
        write_section("corpus compile speed", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
