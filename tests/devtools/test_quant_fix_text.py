"""`etlab quant fix` prints its result fitted to the terminal, as the rest of the CLI does (it printed pandas'
whole frames, ~300 columns): the summary wrapped, the search's steps and the changed layers as tables whose
text cells are cut with "…" and whose columns that do not fit are named; `--wide` prints every column whole.
Run through the installed `etlab` console script (make setup), as a user types it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torchao")

ETLAB = Path(sys.executable).with_name("etlab")
# the MLP misses 60 dB in int8: the search runs every phase and keeps its three linears in float
FIX = ["quant", "fix", "mlp", "--inputs", "4", "--calibration", "2", "--backend", "portable", "--no-progress"]


def _fix(*extra: str, columns: int, budget: str = "sqnr>=60dB") -> list[str]:
    env = {**os.environ, "COLUMNS": str(columns)}
    env.pop("PYTHONPATH", None)
    p = subprocess.run([str(ETLAB), *FIX, "--budget", budget, *extra], capture_output=True, text=True, timeout=900,
                       env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout.splitlines()


@pytest.mark.slow  # a whole search over a 3-layer MLP and a short one (each compiles and runs programs)
def test_quant_fix_fits_the_terminal_and_wide_prints_everything():
    lines = _fix(columns=60)
    assert max(len(line) for line in lines) <= 60, max(lines, key=len)
    text = "\n".join(lines)
    assert "budget sqnr>=60 dB met" in text and "Search: " in text and "Layers not plain int8: 3 of 3" in text
    steps_head = next(line for line in lines if line.split()[:2] == ["step", "phase"])
    assert "change" in steps_head.split()
    # what did not fit is named, with the way to see it
    left_out = " ".join(line for line in lines if "columns left out" in line or line.startswith("  "))
    assert "columns left out:" in left_out and "module" in left_out and "--wide" in left_out
    assert any("…" in line for line in lines)  # long text cut, not wrapped into the table
    layer_rows = [line.split()[0] for line in lines if line.split()[:2] in (["linear", "float"],
                                                                             ["linear_1", "float"],
                                                                             ["linear_2", "float"])]
    assert layer_rows == ["linear", "linear_1", "linear_2"]

    # --wide: every column whole; a budget int8 meets (two steps: int8, then the compiled program), so cheaper
    wide = _fix("--wide", columns=60, budget="top1>=0.5")
    head = next(line for line in wide if line.split()[:2] == ["step", "phase"]).split()
    assert head == ["step", "phase", "change", "layers", "metric", "met", "kept", "why", "float_layers", "sqnr_db"]
    assert not any("columns left out" in line or "…" in line for line in wide)
    text = "\n".join(wide)
    assert "the quantizer's own configuration: budget met" in text and max(len(line) for line in wide) > 60
    assert "Layers not plain int8: 0 of 3" in text
