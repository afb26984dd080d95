"""`etlab fleet query|stats` tables within the terminal (issue 26 item 9): program hashes as 12-character
prefixes, long cells cut, the columns that do not fit left out and named; `--wide` prints everything whole."""

from __future__ import annotations

import pandas as pd

from etlab.fleet._cli import HASH_PREFIX, MAX_CELL, frame_table

SHA = "0192572a9c28" + "f" * 52


def _frame(columns: int = 20) -> pd.DataFrame:
    row = {"program": SHA, "op": "aten._native_batch_norm_legit_no_training.out" * 2, "p50_ns": 1234.56789}
    row.update({f"column_{i}": f"value {i}" for i in range(columns)})
    return pd.DataFrame([row, {**row, "p50_ns": None}])


def test_default_table_fits_and_says_what_it_left_out():
    df = _frame()
    text = frame_table(df, width=100)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100, max(lines, key=len)
    assert SHA[:HASH_PREFIX] in text and SHA not in text
    assert df.at[0, "op"][: MAX_CELL - 1] + "…" in text and df.at[0, "op"] not in text  # cut at MAX_CELL
    assert all(len(cell) <= MAX_CELL for line in lines[2:4] for cell in line.split("  ") if cell)
    note = " ".join(lines[4:])
    assert note.startswith("(2 rows)") and "columns left out (" in note and "column_19" in note
    assert "program hashes shortened to 12 characters" in note and "--wide" in note
    assert "1234.57" in lines[2]  # floats as before: 6 significant digits


def test_wide_table_is_whole_and_narrow_frames_have_no_note():
    df = _frame()
    wide = frame_table(df, wide=True, width=100)
    assert SHA in wide and "column_19" in wide.splitlines()[0] and "left out" not in wide
    small = frame_table(pd.DataFrame({"op": ["add"], "runs": [3]}), width=100)
    assert small.splitlines()[-1] == "(1 row)"
