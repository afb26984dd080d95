"""Start-up of the read-only tools: a cold `etlab inspect run.etdp`, with and without its
`--etrecord model.etrecord`, next to a cold `import torch`.

All are fresh processes, timed alternately (median of N each, in rotating order), so machine load
hits them alike. Also records which heavy modules `import etlab.inspector` leaves out (the compiler,
torch._dynamo), and whether reading the run with its ETRecord imports torch (it should not: the
record's maps and op tables are JSON, `etlab.etrecord.read_program_info`).
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

from _common import median, write_section

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
        commands = {
            "python -c 'import torch'": [sys.executable, "-c", "import torch"],
            "python -c 'import etlab.inspector'": [sys.executable, "-c", "import etlab.inspector"],
            "etlab inspect run.etdp": [etlab_cli, "inspect", str(etdp)],
            "etlab inspect run.etdp --etrecord model.etrecord": [etlab_cli, "inspect", str(etdp), "--etrecord",
                                                                 str(record)],
            "etlab info run.etdp": [etlab_cli, "info", str(etdp)],
        }
        samples: dict[str, list[float]] = {k: [] for k in commands}
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
    base = median(samples["python -c 'import torch'"])
    rows = [f"| `{name}` | {median(s):.2f} | {median(s) / base:.2f}x |" for name, s in samples.items()]
    load = os.getloadavg()[0]
    body = "\n".join([
        "## startup",
        "",
        f"`bench/startup.py`, {datetime.date.today()}, 2 cores, load average {load:.1f}: fresh processes, "
        f"timed alternately (rotating order), median of {args.rounds}. Target: cold `etlab inspect`, with and "
        "without the record, <= 1.0x `import torch`.",
        "",
        "| command | seconds | vs import torch |",
        "|---|---:|---:|",
        *rows,
        "",
        f"Heavy modules loaded by `import etlab.inspector` (of {', '.join(HEAVY)}): {probe}. "
        f"torch imported by `Inspector(run.etdp, etrecord=model.etrecord).to_dataframe()`: {torch_probe}.",
    ])
    write_section("startup", body)
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
