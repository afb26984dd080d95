"""The coverage table of bench/corpus.py: one model's checks and compile times (ModelResult, kept as a
row by bench/_corpus_rows.py) and the `## corpus` section rendered from them."""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field

TARGET = 10.0  # the bar: etlab's compile at least 10x faster than upstream's on every model


@dataclass
class Check:
    """One column of the coverage table: ok, failed (with why), or not applicable (with why)."""

    ok: bool | None
    detail: str = ""

    @property
    def unmeasured(self) -> bool:
        return self.ok is None and self.detail.startswith("not measured")

    def cell(self) -> str:
        mark = {True: "ok", False: "FAIL", None: "n/a"}[self.ok]
        return f"{mark} {self.detail}".strip()


@dataclass
class ModelResult:
    """Everything measured for one corpus model."""

    name: str
    source: str
    export_s: float | None = None
    etlab_compile_s: float | None = None  # median of etlab's samples after its first compile of the model
    upstream_compile_s: float | None = None  # median of upstream's samples
    checks: dict[str, Check] = field(default_factory=dict)
    etlab_first_s: float | None = None  # etlab's first compile of this model in the process
    samples: dict[str, list[float]] = field(default_factory=dict)  # etlab / upstream (+ _cpu): in time order
    interleaved: bool = True  # both sides' times sampled side by side (rows from before 11-27 23:00 were not)

    @property
    def speedup(self) -> float | None:
        if self.interleaved and self.etlab_compile_s and self.upstream_compile_s:
            return self.upstream_compile_s / self.etlab_compile_s
        return None

    @property
    def first_speedup(self) -> float | None:
        """Upstream's time / etlab's first compile of the model (etlab's caches of op results not yet
        holding this model's ops, as for a user's first compile)."""
        if self.interleaved and self.etlab_first_s and self.upstream_compile_s:
            return self.upstream_compile_s / self.etlab_first_s
        return None

    @property
    def cpu_speedup(self) -> float | None:
        """The same ratio on each process's CPU time (the samples after etlab's first): on a loaded machine
        the steadier one, as wall time also counts the time a process waited for a core."""
        etlab, upstream = self.samples.get("etlab_cpu"), self.samples.get("upstream_cpu")
        if self.interleaved and etlab and upstream:
            return statistics.median(upstream) / statistics.median(etlab)
        return None

    @property
    def green(self) -> bool:
        """Every check passed (a check upstream cannot do, marked n/a with its reason, does not count;
        one not measured does)."""
        return bool(self.checks) and all(c.ok is not False and not c.unmeasured for c in self.checks.values())

    def to_json(self) -> dict:
        return {"source": self.source, "export_s": self.export_s, "etlab_compile_s": self.etlab_compile_s,
                "upstream_compile_s": self.upstream_compile_s, "etlab_first_s": self.etlab_first_s,
                "samples": self.samples, "interleaved": self.interleaved,
                "checks": {k: [c.ok, c.detail] for k, c in self.checks.items()}}

    @classmethod
    def from_json(cls, name: str, data: dict) -> ModelResult:
        return cls(name, data["source"], data.get("export_s"), data.get("etlab_compile_s"),
                   data.get("upstream_compile_s"), {k: Check(ok, detail) for k, (ok, detail) in data["checks"].items()},
                   data.get("etlab_first_s"), data.get("samples") or {}, bool(data.get("interleaved", False)))


COLUMNS = ("export", "etlab compile", "etlab run", "upstream runs etlab pte", "upstream compile",
           "etlab runs upstream pte", "xnnpack pte", "inspector")


def render(results: list[ModelResult], repeat: int, total: int | None = None,
           provenance: dict[str, str] | None = None, missing: list[str] | None = None, note: str = "") -> str:
    """The `## corpus` section; `total` > len(results) marks an interrupted run's partial table.
    With `provenance` ({model: 'commit date'}, rows kept across runs) each row says when it was
    measured and `missing` names the models that have no row yet."""
    green = sum(r.green for r in results)
    unmeasured = [r.name for r in results if any(c.unmeasured for c in r.checks.values())]
    ratios = {r.name: r.speedup for r in results if r.speedup}
    firsts = {r.name: r.first_speedup for r in results if r.first_speedup}
    cpus = {r.name: r.cpu_speedup for r in results if r.cpu_speedup}
    old = [r.name for r in results if not r.interleaved and r.checks.get("upstream compile", Check(None)).ok]
    below = [f"{n} {v:.1f}x" for n, v in ratios.items() if v < TARGET]
    below_first = [f"{n} {v:.1f}x" for n, v in firsts.items() if v < TARGET]
    below_cpu = [f"{n} {v:.1f}x" for n, v in cpus.items() if v < TARGET]
    lines = [
        "## corpus", "",
        f"`make corpus` (bench/corpus.py): {len(results)} architectures from etlab.models.corpus. Errors are max "
        "|program - eager| over all outputs. n/a = a check upstream itself cannot do (named), not counted against "
        "green. Compile = to_edge + to_executorch + serialize from the same ExportedProgram, one thread each side, "
        "timed side by side per model in the foreground: etlab's first compile of the model, then etlab, upstream, "
        f"etlab, etlab ({max(repeat, 1)} etlab samples; upstream's from a long-lived reference-python worker warmed "
        "up on a tiny model; upstream's .pte used by the other columns is the one it timed). Speed-up = upstream's "
        "time / etlab's median; `CPU` = the same on each process's CPU time; `first` = wall time against etlab's "
        "first compile of the model (etlab keeps op "
        "results across compiles in a process; a user's first compile does not have them). Upstream's XNNPACK "
        "lowering and its runs of etlab's .pte are background jobs cached by content (bench/_corpus_upstream.py); "
        "the Inspector's ETDump has intermediate outputs with the debug buffer sized from the plan (no "
        "debug_buffer_size, as a user asks). "
        + ("Rows are kept across runs (bench/_corpus_rows.py); column `measured`: etlab's commit, +edits when "
           "etlab/ had uncommitted changes then, and the UTC date." if provenance else
           f"Load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the end."), "",
        f"**Fully green: {green}/{len(results)}**; compile speed-up vs upstream, side by side: median "
        f"{_median(ratios.values()):.1f}x, min {min(ratios.values(), default=float('nan')):.1f}x over {len(ratios)} "
        f"models (CPU time: median {_median(cpus.values()):.1f}x, min {min(cpus.values(), default=float('nan')):.1f}x; "
        f"first compile: median {_median(firsts.values()):.1f}x, min "
        f"{min(firsts.values(), default=float('nan')):.1f}x); below {TARGET:.0f}x: {', '.join(below) or 'none'}"
        f" (CPU time: {', '.join(below_cpu) or 'none'}; first compile: {', '.join(below_first) or 'none'})."
        + (f" Upstream not measured for {len(unmeasured)}: {', '.join(unmeasured)}." if unmeasured else "")
        + (f" Speed-up not side by side (rows from before the interleaved timing, shown as `-`): {', '.join(old)}."
           if old else ""), "",
        *([f"**PARTIAL: {len(results)} of {total} models tabled**; not measured yet: {', '.join(missing)}.", ""]
          if missing else
          [f"**PARTIAL: the run was stopped after {len(results)} of {total} models**; the others are not in "
           "this table (not measured in this run).", ""] if total and total > len(results) else []),
        *([note.strip(), ""] if note.strip() else []),
        "| model | source | speed-up | " + " | ".join(COLUMNS) + " |" + (" measured |" if provenance else ""),
        "|---|---|---:|" + "---|" * len(COLUMNS) + ("---|" if provenance else ""),
    ]
    for r in results:
        extra = [f"{label} {v:.1f}x" for label, v in (("CPU", r.cpu_speedup), ("first", r.first_speedup)) if v]
        speed = (f"{r.speedup:.1f}x" + (f" ({', '.join(extra)})" if extra else "")
                 if r.speedup else "-" if r.name in old else "n/a")
        cells = [r.checks.get(c, Check(None, "not reached")).cell() for c in COLUMNS]
        if provenance:
            cells.append(provenance.get(r.name, "?"))
        lines.append(f"| {r.name} | {r.source} | {speed} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _median(values) -> float:
    values = list(values)
    return statistics.median(values) if values else float("nan")
