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
FIX = ["quant", "fix", "mlp", "--budget", "sqnr>=60dB", "--inputs", "4", "--calibration", "2", "--backend",
       "portable", "--no-progress"]


def _fix(*extra: str, columns: int) -> list[str]:
    env = {**os.environ, "COLUMNS": str(columns)}
    env.pop("PYTHONPATH", None)
    p = subprocess.run([str(ETLAB), *FIX, *extra], capture_output=True, text=True, timeout=900, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout.splitlines()


@pytest.mark.slow  # two searches over a 3-layer MLP (compile and run on etlab's runtime)
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

    wide = _fix("--wide", columns=60)
    head = next(line for line in wide if line.split()[:2] == ["layer", "precision"]).split()
    assert head == ["layer", "precision", "why", "op", "weights", "activation", "observer", "alone_in_float",
                    "module"]
    assert not any("columns left out" in line or "…" in line for line in wide)
    assert "quantized, sqnr is" in "\n".join(wide) and max(len(line) for line in wide) > 60
