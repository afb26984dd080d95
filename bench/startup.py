"""Start-up of the read-only tools: a cold `etlab inspect run.etdp`, with and without its
`--etrecord model.etrecord`, for etlab's record and for upstream ExecuTorch's (the same zoo MLP
exported by upstream 1.5.1, portable and XNNPACK; its program run on etlab's runtime), next to a
cold `import torch`.

All are fresh processes, timed alternately (median of N each, in rotating order), so machine load
hits them alike. Also records which heavy modules `import etlab.inspector` leaves out (the compiler,
torch._dynamo), and whether reading the run with its ETRecord imports torch (it should not: the
record's maps and op tables are JSON, `etlab.etrecord.read_program_info`, upstream's op tables too).
Writes the `startup` section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ET_REF, REPO, median, reference_python, run_ref, write_section

HEAVY = ("etlab.compiler", "etlab.runtime", "etlab.etrecord", "etlab.visualizer", "torch._dynamo")


def _make_run(folder: Path) -> Path:
    """A small ETDump from our runtime (zoo MLP, 5 runs) and the program's ETRecord (the README's flow)."""
    import torch

    from etlab.compiler import to_edge
    from etlab.models import make_mlp
    from etlab.runtime import Runtime

    model, inputs = make_mlp()
    et = to_edge(torch.export.export(model, inputs), generate_etrecord=True).to_executorch()
    et.write_to_file(folder / "model.pte")
    record = et.get_etrecord()
    record.update_representative_inputs(list(inputs))
    record.save(folder / "model.etrecord")
    program = Runtime.get().load_program(folder / "model.pte", enable_etdump=True)
    method = program.load_method("forward")
    for _ in range(5):
        method.execute(list(inputs))
    program.write_etdump_result_to_file(folder / "run.etdp")
    return folder / "run.etdp"


def _make_upstream_run(folder: Path, xnnpack: bool) -> Path | None:
    """Upstream's export of the zoo MLP (its .pte and .etrecord) and a run of that program on etlab's
    runtime (5 runs, timings only); None without the upstream reference environment."""
    ref = reference_python()
    if ref is None:
        return None
    import torch

    from etlab.runtime import Runtime

    run_ref(ref, ET_REF, "export", f"{REPO / 'etlab' / 'models' / 'zoo.py'}:make_mlp", "--out", folder,
            *(["--xnnpack"] if xnnpack else []))
    program = Runtime.get().load_program(folder / "model.pte", enable_etdump=True)
    method = program.load_method("forward")
    inputs = torch.load(folder / "inputs.pt", weights_only=True)
    for _ in range(5):
        method.execute(list(inputs))
    program.write_etdump_result_to_file(folder / "run.etdp")
    return folder / "run.etdp"


def _cold(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        etdp = _make_run(Path(tmp))
        etlab_cli = str(Path(sys.executable).with_name("etlab"))
        record = etdp.with_name("model.etrecord")
        upstream = {}
        for kind in ("portable", "xnnpack"):
            (Path(tmp) / kind).mkdir()
            run = _make_upstream_run(Path(tmp) / kind, kind == "xnnpack")
            if run is not None:
                upstream[kind] = run
        commands = {
            "python -c 'import torch'": [sys.executable, "-c", "import torch"],
            "python -c 'import etlab.inspector'": [sys.executable, "-c", "import etlab.inspector"],
            "etlab inspect run.etdp": [etlab_cli, "inspect", str(etdp)],
            "etlab inspect run.etdp --etrecord model.etrecord": [etlab_cli, "inspect", str(etdp), "--etrecord",
                                                                 str(record)],
            "etlab info run.etdp": [etlab_cli, "info", str(etdp)],
        }
        for kind, run in upstream.items():
            commands[f"etlab inspect upstream-{kind}.etdp"] = [etlab_cli, "inspect", str(run)]
            commands[f"etlab inspect upstream-{kind}.etdp --etrecord upstream-{kind}.etrecord"] = [
                etlab_cli, "inspect", str(run), "--etrecord", str(run.with_name("model.etrecord"))]
        samples: dict[str, list[float]] = {k: [] for k in commands}
        load0 = os.getloadavg()[0]
        order = list(commands.items())
        for r in range(args.rounds):
            for name, cmd in order[r % len(order):] + order[:r % len(order)]:  # each follows each other alike
                samples[name].append(_cold(cmd))
        probe = subprocess.run([sys.executable, "-c", "import sys, etlab.inspector; "
                                f"print([m for m in {HEAVY!r} if m in sys.modules])"],
                               capture_output=True, text=True, check=True).stdout.strip()
        torch_probe = subprocess.run([sys.executable, "-c", "import sys; from etlab.inspector import Inspector; "
                                      f"Inspector(etdump_path={str(etdp)!r}, etrecord={str(record)!r}).to_dataframe(); "
                                      "print('torch' in sys.modules)"],
                                     capture_output=True, text=True, check=True).stdout.strip()
        upstream_probe = {kind: subprocess.run(
            [sys.executable, "-c", "import sys; from etlab.inspector import Inspector; "
             f"Inspector(etdump_path={str(run)!r}, etrecord={str(run.with_name('model.etrecord'))!r}).to_dataframe(); "
             "print('torch' in sys.modules)"], capture_output=True, text=True, check=True).stdout.strip()
            for kind, run in upstream.items()}
    base = median(samples["python -c 'import torch'"])
    rows = [f"| `{name}` | {median(s):.2f} | {median(s) / base:.2f}x |" for name, s in samples.items()]
    load = f"{load0:.1f} before, {os.getloadavg()[0]:.1f} after"
    body = "\n".join([
        "## startup",
        "",
        f"`bench/startup.py`, {datetime.date.today()}, 2 cores, load average {load}: fresh processes, "
        f"timed alternately (rotating order), median of {args.rounds}. Target: cold `etlab inspect`, with and "
        "without the record, <= 1.0x `import torch`.",
        "",
        "| command | seconds | vs import torch |",
        "|---|---:|---:|",
        *rows,
        "",
        f"Heavy modules loaded by `import etlab.inspector` (of {', '.join(HEAVY)}): {probe}. "
        f"torch imported by `Inspector(run.etdp, etrecord=model.etrecord).to_dataframe()`: {torch_probe}; "
        + ", ".join(f"with upstream's {kind} record: {v}" for kind, v in upstream_probe.items())
        + ("." if upstream else " (no upstream reference environment: upstream's records not timed)."),
    ])
    write_section("startup", body)
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
