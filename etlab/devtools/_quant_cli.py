"""`etlab quant report|fix`: quantization debugging over a dataset from the command line.

    etlab quant report mobilenet_v2 --inputs 1000 --backend xnnpack --html report.html
    etlab quant report mypkg.models:build --budget 'top1>=0.99'        # exit status 1 when missed
    etlab quant fix cnn --budget 'top1>=0.99' -o cnn_mixed.pte --json choices.json

MODEL is a name of etlab's zoo (`etlab.models.ZOO`: mlp, cnn, mobilenet_v2, ...) or corpus
(`etlab.models.corpus.CORPUS`), or `module:function` / `path/to/file.py:function`: a function with no
arguments returning `(model, data)`. `data` is either the dataset (a list, DataLoader or any iterable of
the model's inputs: tensors or tuples of tensors) or, as the zoo's factories return, one example: a
*tuple* of tensors, around which `--inputs` random inputs are drawn (seeded: `--seed`).

The model is quantized with EtlabQuantizer (or `--quantizer module:function`, a factory of fresh PT2E
quantizers) calibrated on the first `--calibration` inputs, compiled for `--backend` and run on etlab's
runtime for every input. `report` prints the output metrics, the layers that introduced the most error
(p95 local SQNR over the inputs) and the calibrated ranges that clipped; `--html`, `--json`, `--csv`
write the dataset view, everything as JSON, the layer table. `fix` runs auto_mixed_precision to meet
`--budget` and writes the chosen program (`-o`) and choices (`--json`).

Errors are one line on stderr (exit status 2); a missed `--budget` is exit status 1.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
from pathlib import Path

BUDGET_HELP = "an accuracy budget: 'top1>=0.99', 'top1>=99%%', 'cosine>=0.999', 'min_cosine>=0.99', 'sqnr>=30dB', " \
              "'min_sqnr>=25'"


# --- the model and its data -----------------------------------------------------------------------------


def _load_function(spec: str):
    """`module:function` or `file.py:function` -> the function (a clear error for each way it can be wrong)."""
    target, _, name = spec.rpartition(":")
    if not target or not name.isidentifier():
        raise ValueError(f"MODEL {spec!r}: expected a zoo or corpus name, or module:function / file.py:function")
    if target.endswith(".py") or "/" in target:
        path = Path(target)
        if not path.is_file():
            raise FileNotFoundError(f"MODEL {spec}: {target}: no such file")
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules.setdefault(path.stem, module)
        module_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(target)
        except ModuleNotFoundError as e:
            raise ValueError(f"MODEL {spec}: cannot import {target!r} ({e})") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"MODEL {spec}: {target} has no function {name!r}")
    return fn


def _named_model(name: str):
    from etlab.models import ZOO

    if name in ZOO:
        return ZOO[name]()
    from etlab.models.corpus import CORPUS

    if name in CORPUS:
        module, methods = CORPUS[name].build()
        if "forward" not in methods:
            raise ValueError(f"MODEL {name}: the corpus entry has no 'forward' method ({sorted(methods)})")
        return module, tuple(methods["forward"])
    raise ValueError(f"MODEL {name!r}: not a zoo model ({', '.join(sorted(ZOO))}), not a corpus model (etlab.models."
                     "corpus.CORPUS), not module:function")


def random_like(example: tuple, count: int, seed: int) -> list[tuple]:
    """`count` inputs shaped like `example`: normal floats, integers in the example's range (token ids)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        item = []
        for x in example:
            if not isinstance(x, torch.Tensor):
                item.append(x)
            elif x.is_floating_point():
                item.append(torch.randn(x.shape, generator=gen).to(x.dtype))
            elif x.dtype == torch.bool:
                item.append(torch.randint(0, 2, x.shape, generator=gen).bool())
            else:
                high = int(x.max()) + 1 if x.numel() else 2
                item.append(torch.randint(0, max(high, 2), x.shape, generator=gen).to(x.dtype))
        out.append(tuple(item))
    return out


def load_model(spec: str, inputs: int, seed: int):
    """(model, dataset, what the data is) for MODEL (see the module doc)."""
    import torch

    if ":" in spec:
        built = _load_function(spec)()
        if not isinstance(built, (tuple, list)) or len(built) != 2:
            raise ValueError(f"MODEL {spec}: the function must return (model, data), got {type(built).__name__}")
    else:
        built = _named_model(spec)
    model, data = built
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"MODEL {spec}: the model is a {type(model).__name__}, not a torch.nn.Module")
    model.eval()
    if isinstance(data, torch.Tensor):
        data = (data,)
    if isinstance(data, tuple) and all(isinstance(x, torch.Tensor) for x in data):
        return model, random_like(data, inputs, seed), f"{inputs} random inputs shaped like the example (seed {seed})"
    return model, data, "the given dataset" + (f" (first {inputs})" if inputs else "")


# --- report ---------------------------------------------------------------------------------------------


def _quantize(model, dataset: list, calibration: int, quantizer_spec: str | None):
    from etlab.devtools._quant_debug import float_graph_of
    from etlab.devtools._quant_debug_fix import quantize_pt2e

    factory = _load_function(quantizer_spec) if quantizer_spec else _default_quantizer
    float_gm = float_graph_of(model, dataset[0])
    return float_gm, quantize_pt2e(float_gm, factory(), dataset[:calibration]), factory


def _default_quantizer():
    from etlab.compiler import EtlabQuantizer

    return EtlabQuantizer()


def _materialize(dataset, limit: int | None, what: str) -> list[tuple]:
    """The first `limit` inputs as tuples (the dataset is read once; the report streams the rest)."""
    import itertools

    from etlab.devtools._quant_debug import _as_inputs

    items = list(itertools.islice(iter(dataset), limit)) if limit else list(dataset)
    if not items:
        raise ValueError(f"{what}: the dataset is empty")
    return [_as_inputs(x) for x in items]


def _budget_value(budget, report) -> float:
    """The budget's metric over the report's inputs (the per-input numbers the report keeps)."""
    p = report.per_input
    metric = budget.metric
    values = {"top1": p["top1_agree"].mean(), "cosine": p["output_cosine"].mean(),
              "min_cosine": p["output_cosine"].min(), "min_sqnr": p["output_sqnr"].min(),
              "sqnr": report.output_sqnr_pooled}
    if metric not in values:
        raise ValueError(f"--budget {budget}: `etlab quant report` checks {', '.join(values)}")
    return float(values[metric])


def _jsonable(df) -> list[dict]:
    from etlab.facts.display import json_ready

    return json_ready(df.to_dict(orient="records"))


def _wrap(text: str, indent: str = "") -> str:
    """A paragraph wrapped to the terminal's width (the summary is one long sentence)."""
    import textwrap

    from etlab.inspector import terminal_width

    return textwrap.fill(text, terminal_width(), initial_indent=indent, subsequent_indent=indent + "  ",
                         break_long_words=False, break_on_hyphens=False)


def _table(df, flex: tuple[str, ...], wide: bool = False) -> str:
    """`df` as a table within the terminal's width (etlab.inspector.fit_frame): numbers to 4 significant digits,
    the `flex` (text) columns cut with "…" to what the others leave, the columns that still do not fit left out
    and named; `wide`: every column, whole."""
    from etlab.inspector import fit_frame, terminal_width

    width = terminal_width()
    lines, left_out = fit_frame(df, width, flex, wide)
    if left_out:
        lines.append(_wrap(f"({len(left_out)} of {len(df.columns)} columns left out: {', '.join(left_out)}; "
                           "--wide: every column, whole)"))
    return "\n".join(lines)


# the columns of the worst-layers table and their printed heads, on two lines (the frame's names make it ~150 wide)
_WORST_HEADS = {"order": "order", "layer": "layer", "op": "op", "module": "module", "local_sqnr_p95": "local\np95",
                "local_sqnr_mean": "local\nmean", "local_worst_input": "worst\ninput", "sqnr_p95": "output\np95",
                "input_sqnr_p95": "input\np95", "clipped_inputs": "clipped\ninputs"}


def _print_report(report, top: int, wide: bool = False) -> None:
    print(_wrap(report.summary()))
    for note in report.notes:
        print(_wrap(f"note: {note}", "  "))
    worst = report.worst(top)[list(_WORST_HEADS)].rename(columns=_WORST_HEADS)
    print("\n" + _wrap(f"Layers that introduced the most error (p95 local SQNR over {report.inputs} inputs, dB; "
                       "local: what the layer added, output / input: SQNR of its output / inputs):"))
    print(_table(worst, ("layer", "op", "module"), wide) if len(worst) else "  none ranked")
    clipped = report.clipped().head(top)[["layer", "range_lo", "range_hi", "seen_min", "seen_max", "clipped",
                                          "clipped_inputs", "first_clipped_input"]]
    print(f"\nCalibrated ranges clipped on some inputs: {len(report.clipped())} of {len(report.coverage)}")
    if len(clipped):
        print(_table(clipped, ("layer",), wide))


def _report(args) -> int:
    from etlab.devtools._amp_budget import as_budget
    from etlab.devtools._quant_dataset import dataset_report
    from etlab.inspector import output_file

    for flag in ("html", "json", "csv"):
        output_file(f"--{flag}", getattr(args, flag))
    budget = as_budget(args.budget) if args.budget else None
    model, data, what = load_model(args.model, args.inputs, args.seed)
    dataset = _materialize(data, args.inputs, f"MODEL {args.model}")
    float_gm, quantized, _ = _quantize(model, dataset, args.calibration, args.quantizer)
    backend = None if args.backend == "none" else args.backend
    report = dataset_report(float_gm, quantized, dataset, backend=backend, program=args.pte,
                            batch_size=args.batch_size, progress=not args.no_progress, label=args.model)
    print(_wrap(f"{args.model}: {what}; calibrated on the first {min(args.calibration, len(dataset))}; "
                f"{report.seconds:.1f} s"))
    _print_report(report, args.top, args.wide)
    if args.html:
        report.show().save_html(args.html, title=f"Quantization of {args.model}")  # the views, by registry
        print(f"wrote {args.html}")
    if args.csv:
        report.layers.to_csv(args.csv, index=False)
        print(f"wrote {args.csv}")
    status = 0
    if budget is not None:
        value = _budget_value(budget, report)
        met = budget.met(value)
        print(f"budget {budget}: {budget.name} {value:.6g} -> {'met' if met else 'MISSED'}")
        status = 0 if met else 1
    if args.json:
        from etlab.facts.display import json_ready
        from etlab.schema import write_atomic

        doc = {"model": args.model, "data": what, "summary": report.summary(), "output": json_ready(report.output),
               "layers": _jsonable(report.layers), "coverage": _jsonable(report.coverage),
               "per_input": _jsonable(report.per_input), "notes": report.notes,
               "budget": None if budget is None else {"budget": str(budget), "value": json_ready(value),
                                                      "met": met}}
        write_atomic(args.json, json.dumps(doc, indent=1, default=str).encode())
        print(f"wrote {args.json}")
    return status


# --- fix ------------------------------------------------------------------------------------------------


def _fix(args) -> int:
    from etlab.inspector import output_file

    output_file("-o", args.output)
    output_file("--json", args.json)
    try:
        from etlab.devtools._auto_mixed_precision import auto_mixed_precision
    except ImportError as e:
        raise ValueError(f"etlab quant fix needs etlab.devtools' auto_mixed_precision ({e})") from None
    model, data, what = load_model(args.model, args.inputs, args.seed)
    dataset = _materialize(data, args.inputs, f"MODEL {args.model}")
    factory = _load_function(args.quantizer) if args.quantizer else None
    progress = (lambda line: print(line, file=sys.stderr, flush=True)) if not args.no_progress else False
    result = auto_mixed_precision(model, dataset, budget=args.budget, quantizer_factory=factory,
                                  backend=args.backend, max_calibration=args.calibration, progress=progress)
    print(_wrap(f"{args.model}: {what}"))
    _print_fix(result, args.wide)
    if args.output:
        from etlab.schema import write_atomic

        write_atomic(args.output, bytes(result.program.buffer))
        print(f"wrote {args.output}")
    if args.json:
        from etlab.facts.display import json_ready
        from etlab.schema import write_atomic

        doc = {"model": args.model, "budget": str(result.budget), "met": result.met,
               "metric": json_ready(result.metric), "int8_metric": json_ready(result.int8_metric),
               "float_layers": result.float_layers, "config": json_ready(_config_dict(result.config)),
               "steps": _jsonable(result.steps), "layers": _jsonable(result.layers),
               "cost": json_ready(result.cost)}
        write_atomic(args.json, json.dumps(doc, indent=1, default=str).encode())
        print(f"wrote {args.json}")
    return 0 if result.met else 1


# the search's steps and the changed layers, their columns by importance (fit_frame leaves out from the right)
_STEP_ORDER = ["step", "phase", "change", "layers", "metric", "met", "kept", "why", "float_layers", "sqnr_db"]
_LAYER_ORDER = ["layer", "precision", "why", "op", "weights", "activation", "observer", "alone_in_float", "module"]


def _ordered(df, order: list[str]):
    return df[[c for c in order if c in df.columns] + [c for c in df.columns if c not in order]]


def _print_fix(result, wide: bool = False) -> None:
    """The result as MixedPrecisionResult.explain() says it, fitted to the terminal: the summary wrapped, the
    search's steps and the layers it changed as tables within the width (`wide`: every column, whole)."""
    print(_wrap(result.summary()))
    steps = _ordered(result.steps, _STEP_ORDER)
    print("\n" + _wrap(f"Search: {len(steps)} step(s) (kept: carried on to the next step; metric: "
                       f"{result.budget.name} on the dataset)"))
    print(_table(steps, ("change", "layers", "why"), wide) if len(steps) else "  no step")
    changed = _ordered(result.changed_layers(), _LAYER_ORDER)
    print("\n" + _wrap(f"Layers not plain int8: {len(changed)} of {len(result.layers)}"))
    if len(changed):
        print(_table(changed, ("layer", "why", "module"), wide))


def _config_dict(config) -> dict:
    import dataclasses

    if hasattr(config, "to_dict"):
        return config.to_dict()
    if dataclasses.is_dataclass(config):
        return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    return {"config": str(config)}


# --- the parser -----------------------------------------------------------------------------------------


def _common(p: argparse.ArgumentParser, backends: tuple[str, ...]) -> None:
    p.add_argument("model", metavar="MODEL", help="a zoo or corpus name, or module:function / file.py:function "
                   "returning (model, dataset) or (model, example inputs)")
    p.add_argument("--inputs", type=int, default=100, help="inputs to run (random ones for an example; the first "
                   "N of a dataset; default 100)")
    p.add_argument("--calibration", type=int, default=16, help="the first K inputs calibrate the quantizer "
                   "(default 16)")
    p.add_argument("--backend", choices=backends, default="xnnpack",
                   help="the program that ships: lowered to XNNPACK (default) or portable kernels")
    p.add_argument("--quantizer", metavar="MODULE:FUNCTION", help="a factory of fresh PT2E quantizers "
                   "(default etlab.compiler.EtlabQuantizer)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (default: torch's own)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--json", metavar="OUT.json", help="write the result as JSON")
    p.add_argument("--wide", action="store_true", help="print every column of the tables, whole (by default they "
                   "fit the terminal: long cells cut with \"…\", the columns that do not fit named)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `etlab quant` (report and fix subcommands); the CLI-usage tests read it."""
    parser = argparse.ArgumentParser(prog="etlab quant", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="per-layer quantization error over a dataset, on the shipped program",
                         description="Per-layer quantization error (mean and p95 SQNR, local vs inherited) over "
                         "a dataset, the shipped program's output metrics and calibration coverage.")
    _common(rep, ("xnnpack", "portable", "none"))
    rep.add_argument("--pte", metavar="FILE.pte", help="run this compiled program instead of compiling one")
    rep.add_argument("--batch-size", type=int, default=None, help="inputs per batch of the torch passes "
                     "(default: from a memory budget)")
    rep.add_argument("--top", type=int, default=10, help="rows of the worst-layer and clipped tables (default 10)")
    rep.add_argument("--budget", help=BUDGET_HELP + "; exit status 1 when missed")
    rep.add_argument("--html", metavar="OUT.html", help="write the dataset view as one offline HTML page")
    rep.add_argument("--csv", metavar="OUT.csv", help="write the per-layer table as CSV")
    rep.set_defaults(run=_report)
    fix = sub.add_parser("fix", help="choose what to keep in float (or 16-bit) to meet an accuracy budget",
                         description="auto_mixed_precision: the fewest float layers (and cheaper fixes) that meet "
                         "the budget on the shipped program over the dataset; exit status 1 when it cannot.")
    _common(fix, ("xnnpack", "portable"))
    fix.add_argument("--budget", required=True, help=BUDGET_HELP)
    fix.add_argument("-o", "--output", metavar="OUT.pte", help="write the chosen program")
    fix.set_defaults(run=_fix)
    return parser


def quant_main(argv: list[str] | None = None) -> int:
    """`etlab quant ...`; returns the exit status."""
    args = build_parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    try:
        for flag in ("inputs", "calibration", "top", "batch_size"):
            value = getattr(args, flag, None)
            if value is not None and value < 1:
                raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")
        if args.threads < 0:
            raise ValueError(f"--threads must be >= 0, got {args.threads}")
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        if getattr(args, "pte", None):
            from etlab.inspector import input_file

            input_file("--pte", args.pte)
        return args.run(args)
    except BrokenPipeError:
        raise
    except (ValueError, TypeError, OSError, ImportError, RuntimeError) as e:
        from etlab.inspector import error_line

        print(f"etlab quant: error: {error_line(e)}", file=sys.stderr)
        return 2
    finally:
        sys.stdout.flush()
