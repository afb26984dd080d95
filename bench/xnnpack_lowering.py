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
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import select
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
from _xnnpack_latency import retime  # noqa: E402
from _xnnpack_ptes import default_dir, keep_pair, read_pair  # noqa: E402
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

from etlab.devtools import get_delegation_info  # noqa: E402
from etlab.models import DYNAMIC_SHAPES, ZOO  # noqa: E402
from etlab.models.corpus import CORPUS, flat_tensors, max_abs_error, within_tolerance  # noqa: E402
from etlab.schema import write_atomic  # noqa: E402

STORE = HERE / "xnnpack_lowering.jsonl"  # every measured model's newest row (see the docstring)
ZOO_TOLERANCE = (1e-4, 1e-4)


@dataclass
class Model:
    """One model of the bench: its program, inputs, eager outputs and tolerance."""

    name: str
    ep: torch.export.ExportedProgram
    inputs: tuple
    eager: list
    atol: float
    rtol: float


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


class Upstream:
    """The reference-python worker (bench/_ref_xnnpack.py): one JSON request in, one JSON answer out.
    A worker that died (a program crashed upstream's runtime) is named in the error and started again
    for the next request, so an unattended run goes on with the next model."""

    def __init__(self, ref_python: str):
        self.ref_python = ref_python
        self.proc = self._start()

    def _start(self) -> subprocess.Popen:
        return subprocess.Popen([self.ref_python, str(HERE / "_ref_xnnpack.py")], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, env=ref_env())

    def ask(self, timeout: float | None = None, **req) -> dict:
        """One request's answer; `timeout` (seconds): a worker that has not answered by then is stopped
        (and started again by the next request) and the request raises."""
        if self.proc.poll() is not None:
            self.proc = self._start()
        try:
            self.proc.stdin.write(json.dumps(req, default=str) + "\n")
            self.proc.stdin.flush()
            if timeout is not None and not select.select([self.proc.stdout], [], [], timeout)[0]:
                self.proc.kill()
                self.proc.wait(timeout=60)
                raise RuntimeError(f"upstream worker gave no answer in {timeout:.0f} s (stopped)")
            line = self.proc.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            code = self.proc.wait(timeout=60)
            raise RuntimeError(f"upstream worker exited (code {code})")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return answer

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=120)


def _etlab_partitioner():
    """etlab's XnnpackPartitioner class, or None (and why) when the backend is not there."""
    try:
        from etlab.compiler.backends.xnnpack import XnnpackPartitioner
    except Exception as e:  # not built yet, or broken: upstream's side is still measured
        return None, f"etlab: no XnnpackPartitioner ({type(e).__name__}: {e})"
    return XnnpackPartitioner, ""


def load_models(names: list[str]) -> list[tuple[str, object]]:
    """(name, factory) per requested model: zoo names first, then corpus names."""
    out = []
    for name in names:
        if name in ZOO:
            out.append((name, "zoo"))
        elif name in CORPUS:
            out.append((name, "corpus"))
        else:
            raise SystemExit(f"xnnpack_lowering: unknown model {name!r} (zoo: {sorted(ZOO)}; corpus: {sorted(CORPUS)})")
    return out


def build(name: str, kind: str) -> Model:
    if kind == "zoo":
        module, inputs = ZOO[name]()
        module.eval()
        inputs = tuple(inputs)
        with torch.no_grad():
            ep = torch.export.export(module, inputs, dynamic_shapes=DYNAMIC_SHAPES.get(ZOO[name].__name__),
                                     strict=False)
            eager = flat_tensors(module(*inputs))
        return Model(name, ep, inputs, eager, *ZOO_TOLERANCE)
    entry = CORPUS[name]
    built = entry.build()
    if list(built[1]) != ["forward"]:
        raise ValueError(f"methods {list(built[1])}: the bench lowers single-method programs")
    ep = entry.export(built)["forward"]
    return Model(name, ep, tuple(built[1]["forward"]), entry.eager(built)["forward"], entry.atol, entry.rtol)


def _etlab_compile(model: Model, partitioner_cls, res: Result | None = None):
    from etlab.compiler import to_edge_transform_and_lower

    t, cpu = time.perf_counter(), time.process_time()
    edge = to_edge_transform_and_lower(model.ep, partitioner=[partitioner_cls()])
    buf = bytes(edge.to_executorch().buffer)
    if res is not None:
        res.etlab_s.append(time.perf_counter() - t)
        res.etlab_cpu.append(time.process_time() - cpu)
    return edge, buf


def delegated_ops(info) -> dict[str, int]:
    """Op type -> occurrences in delegated graphs, from a get_delegation_info answer."""
    df = info.get_operator_delegation_dataframe()
    return {str(r["op_type"]): int(r["occurrences_in_delegated_graphs"]) for _, r in df.iterrows()
            if r["op_type"] != "Total"}


def _etlab_runtime_outputs(pte: Path, inputs) -> list:
    from etlab.runtime import Runtime

    return flat_tensors(Runtime.get().load_program(pte).load_method("forward").execute(list(inputs)))


def _tolerance_ok(got: list, model: Model) -> bool:
    return len(got) == len(model.eager) and all(within_tolerance(g, w, model.atol, model.rtol)
                                                for g, w in zip(got, model.eager))


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
        return _pairs_main(a)
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


def _pairs_main(a) -> int:
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


if __name__ == "__main__":
    sys.exit(main())
