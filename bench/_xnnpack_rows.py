"""The rows of bench/xnnpack_lowering.py: one model's numbers on both sides (`Result`), and the row store
bench/xnnpack_lowering.jsonl they are merged into (one JSON line per model, the newest measurement of a
model replacing its older one) and the `## xnnpack lowering` section rendered from it."""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from _common import write_section
from _xnnpack_render import SECTION, kept_notes, render

from etlab.schema import write_atomic

HERE = Path(__file__).resolve().parent
STORE = HERE / "xnnpack_lowering.jsonl"  # every measured model's newest row (see xnnpack_lowering's docstring)


@dataclass
class Result:
    """One model's numbers on both sides (None / empty: not measured; `error` says why)."""

    name: str
    etlab_nodes: int | None = None
    etlab_partitions: int | None = None
    upstream_nodes: int | None = None
    upstream_partitions: int | None = None
    etlab_s: list[float] = field(default_factory=list)
    upstream_s: list[float] = field(default_factory=list)
    etlab_cpu: list[float] = field(default_factory=list)
    upstream_cpu: list[float] = field(default_factory=list)
    latency: dict[str, dict[str, float]] = field(default_factory=dict)  # threads label -> {etlab, upstream} ms
    latency_iqr: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # label -> side -> [q1, q3] ms
    load: list[float] = field(default_factory=list)  # 1-minute load average when the model started and ended
    threads_default: int | None = None
    err_etlab_on_upstream: float | None = None
    err_upstream: float | None = None
    err_etlab_on_etlab: float | None = None
    within_tol: bool | None = None
    error: str = ""
    commit: str = ""  # the etlab commit this row measured
    date: str = ""  # UTC time the row was measured (ISO 8601)
    rounds: int | None = None  # --rounds and --latency-rounds of the run
    latency_rounds: int | None = None
    etlab_ops: dict[str, int] = field(default_factory=dict)  # op type -> delegated occurrences
    upstream_ops: dict[str, int] = field(default_factory=dict)
    remark: str = ""  # hand-written (--remark), kept when the model is re-measured: check it still holds
    # --latency-only: threads label -> when / load / rounds / which kept pair the latency fields were re-timed
    latency_retimed: dict[str, dict] = field(default_factory=dict)

    @property
    def speedup(self) -> float | None:
        return statistics.median(self.upstream_s) / statistics.median(self.etlab_s) \
            if self.etlab_s and self.upstream_s else None

    @property
    def cpu_speedup(self) -> float | None:
        return statistics.median(self.upstream_cpu) / statistics.median(self.etlab_cpu) \
            if self.etlab_cpu and self.upstream_cpu else None

    def latency_ratio(self, threads: str) -> float | None:
        t = self.latency.get(threads)
        return t["etlab"] / t["upstream"] if t and t.get("upstream") else None

    def compile_spread(self, side: str) -> float | None:
        """(max - min) / median of one side's compile samples: how much load moved them."""
        s = self.etlab_s if side == "etlab" else self.upstream_s
        return (max(s) - min(s)) / statistics.median(s) if len(s) > 1 else None

    def latency_spread(self, threads: str) -> float | None:
        """The wider of the two sides' interquartile ranges, relative to its median."""
        iqr, med = self.latency_iqr.get(threads), self.latency.get(threads)
        if not iqr or not med:
            return None
        return max((q3 - q1) / med[k] for k, (q1, q3) in iqr.items() if med.get(k))

    def note(self, text: str) -> None:
        text = text.splitlines()[0][:200].replace("|", "/") if text else ""
        self.error = f"{self.error}; {text}" if self.error else text


def _result(row: dict, path: Path, lineno: int) -> Result:
    """A Result from one saved JSON line; a line that is not one is an error naming file and line."""
    names = {f.name for f in dataclasses.fields(Result)}
    if not isinstance(row, dict) or not isinstance(row.get("name"), str):
        raise SystemExit(f"xnnpack_lowering: {path}:{lineno}: not a result line (no model name)")
    unknown = sorted(set(row) - names)
    if unknown:
        raise SystemExit(f"xnnpack_lowering: {path}:{lineno}: unknown fields {unknown}")
    return Result(**row)


def load_results(paths: list[Path], commit: str = "") -> tuple[list[Result], tuple[float, float]]:
    """Results saved by --json or the store (the last line per model wins, in file order), and the load
    at the first and last model. `commit` fills the rows that do not say which commit they measured."""
    by_name: dict[str, Result] = {}
    for path in paths:
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise SystemExit(f"xnnpack_lowering: {path}:{i}: not JSON ({e})") from None
                r = _result(row, path, i)
                r.commit = r.commit or commit
                by_name.pop(r.name, None)  # a re-measured model moves to where its newest line is
                by_name[r.name] = r
    results = list(by_name.values())
    loads = [r.load for r in results if r.load]
    return results, ((loads[0][0], loads[-1][-1]) if loads else (float("nan"), float("nan")))


def merge_into_store(new: list[Result], store: Path = STORE) -> list[Result]:
    """The store's rows with `new` replacing the rows of the same models (kept in place) or added at
    the end, written back atomically; returns every row."""
    old = load_results([store])[0] if store.is_file() else []
    fresh = {r.name: r for r in new}
    for r in old:
        if r.name in fresh and not fresh[r.name].remark:
            fresh[r.name].remark = r.remark
    rows = [fresh.pop(r.name, r) for r in old] + list(fresh.values())
    write_atomic(store, "".join(json.dumps(dataclasses.asdict(r)) + "\n" for r in rows).encode())
    return rows


def _commit() -> str:
    """The measured commit: ETLAB_BENCH_COMMIT (a run from an exported tree), else the checkout's HEAD."""
    if os.environ.get("ETLAB_BENCH_COMMIT"):
        return os.environ["ETLAB_BENCH_COMMIT"]
    p = subprocess.run(["git", "-C", str(HERE.parent), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return p.stdout.strip() or "unknown"


def write_store_and_section(new: list[Result]) -> str:
    """Merges `new` into the store, renders the section from every stored row (notes kept) and writes it."""
    rows = merge_into_store(new)
    text = render(rows, kept_notes())
    write_section(SECTION, text)
    return text


def _remarks(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name.strip():
            raise SystemExit(f"xnnpack_lowering: --remark {item!r}: expected MODEL=TEXT")
        out[name.strip()] = text.strip().replace("|", "/")
    return out
