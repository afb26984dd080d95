"""`make demo`: the main job, end to end on a zoo CNN.

export -> compile with an ETRecord (linear/add partitions delegated to the demo backend) -> run
with ETDump tracing and every intermediate output -> Inspector table and numeric gap ->
demo_report.html (the whole dashboard, offline).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from etlab.schema.etdump import METHOD_EXECUTE

ITERATIONS = 20
TOP = 30  # events in the printed table (`etlab inspect`'s default)


def main(argv: list[str] | None = None) -> Path:
    """`python -m etlab.demo`: compiles the demo model, runs it with ETDump and intermediates, writes the HTML
    dashboard and returns the report's path."""
    parser = argparse.ArgumentParser(prog="python -m etlab.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="demo_out", help="folder for model.pte, model.etrecord, run.etdp, run.bin")
    parser.add_argument("--report", default="demo_report.html", help="where to write the HTML dashboard")
    parser.add_argument("--iterations", type=int, default=ITERATIONS)
    args = parser.parse_args(argv)

    console = Console()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    steps = ["import etlab", "export the CNN", "compile with an ETRecord", "run with ETDump tracing",
             "inspect", "write the report"]
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/"
                  "{task.total}"), TimeElapsedColumn(), console=console, transient=False) as progress:
        task = progress.add_task(steps[0], total=len(steps))

        def step(i: int) -> None:
            progress.update(task, completed=i, description=steps[i] if i < len(steps) else "done")

        from etlab.compiler import to_edge_transform_and_lower
        from etlab.compiler.backends import DemoPartitioner
        from etlab.inspector import Inspector, terminal_width
        from etlab.models import make_cnn
        from etlab.runtime import DebugLevel, Runtime
        from etlab.visualizer import show

        step(1)
        model, inputs = make_cnn()
        exported = torch.export.export(model, inputs)

        step(2)
        t = time.perf_counter()
        edge = to_edge_transform_and_lower(exported, partitioner=[DemoPartitioner()], generate_etrecord=True)
        et = edge.to_executorch()
        compile_ms = (time.perf_counter() - t) * 1e3
        et.write_to_file(out / "model.pte")
        record = et.get_etrecord()
        record.update_representative_inputs(list(inputs))
        record.save(out / "model.etrecord")

        step(3)
        # every intermediate output logged, the debug buffer sized from the plan (as the README's tour does)
        program = Runtime.get().load_program(out / "model.pte", enable_etdump=True,
                                             etdump_debug_level=DebugLevel.INTERMEDIATE_OUTPUTS)
        method = program.load_method("forward")
        for _ in range(args.iterations):
            outputs = method.execute(list(inputs))
        program.write_etdump_result_to_file(out / "run.etdp", out / "run.bin")
        with torch.no_grad():
            max_err = (outputs[0] - model(*inputs)).abs().max().item()

        step(4)
        inspector = Inspector(etdump_path=out / "run.etdp", etrecord=out / "model.etrecord",
                              debug_buffer_path=out / "run.bin")
        gap = inspector.calculate_numeric_gap("MSE")

        step(5)
        report = show(inspector, program=et).save_html(args.report)
        step(len(steps))

    console.width = terminal_width()  # as the table's (rich's own default is 80 columns off a terminal)
    console.rule("Inspector: what ran, joined with what was compiled")
    print(events_table(inspector), end="")
    console.print(f"every event, every column: etlab inspect {out / 'run.etdp'} --etrecord {out / 'model.etrecord'} "
                  "--all --wide", markup=False, highlight=False)
    console.rule("Summary")
    console.print(f"compile (to_edge + lowering + to_executorch): {compile_ms:.0f} ms; "
                  f"{len(et.delegate_map.get('forward', {}))} delegate call(s) to DemoBackend")
    worst = max((g for gaps in gap["gap"] for g in gaps), default=float("nan"))
    console.print(f"{args.iterations} runs: Method::execute p50 {execute_p50_ms(inspector):.3g} ms (traced, "
                  f"intermediates logged); output max |etlab - eager| = {max_err:.2e}")
    console.print(f"numeric gap per op (MSE, runtime vs the recorded graph): largest {worst:.2e} over {len(gap)} "
                  "matched ops")
    files = ", ".join(f.name for f in (out / "model.pte", out / "model.etrecord", out / "run.etdp", out / "run.bin"))
    console.print(f"files: {files} in {out.resolve()}", markup=False, highlight=False)
    console.print(f"report (the dashboard, offline; open it in a browser): {Path(report).resolve()}", markup=False,
                  highlight=False)
    console.print("the same files in JupyterLab: make lab", markup=False, highlight=False)
    return Path(report)


def execute_p50_ms(inspector) -> float:
    """The median Method::execute of the run, in ms (the figure the events table lists for it)."""
    df = inspector.to_dataframe()
    row = df[df["event_name"].astype(str) == METHOD_EXECUTE]
    return float(row["p50 (ms)"].iloc[0]) if len(row) and "p50 (ms)" in row else float("nan")


def events_table(inspector, width: int | None = None) -> str:
    """The run's events as `etlab inspect` prints them: the slowest TOP within the terminal's width (the
    whole frame, `print_data_tabular()`, is some 900 columns wide)."""
    from etlab.inspector import compact_table, terminal_width

    return compact_table(inspector.to_dataframe(), width or terminal_width(), TOP)


if __name__ == "__main__":
    main()
