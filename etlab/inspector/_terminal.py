"""The Inspector's table for a terminal: what `etlab inspect` prints by default.

The frame has 17 columns, op lists of any length and one row per event: printed whole it is
hundreds of characters wide. Here: the `top` events that took longest on average (listed in
execution order; a line says how many are left out), a few columns (block, event, p50 / avg / max, ops,
backend), op lists as short operator names, long cells cut with "…", each line within `width`
characters. `etlab inspect --wide` prints the whole printable frame instead, `--all` every row.
"""

from __future__ import annotations

import numbers
import shutil

import numpy as np
import pandas as pd

from etlab.schema.etdump import OPERATOR_CALL

ELLIPSIS = "…"
MIN_FLEX = 10  # the narrowest the event and ops columns get


def terminal_width(default: int = 120) -> int:
    """The terminal's width ($COLUMNS or the tty's), `default` when the output is not a terminal."""
    return max(60, shutil.get_terminal_size((default, 24)).columns)


def cut(text: str, width: int) -> str:
    """`text`, cut to `width` characters with a trailing "…" when longer."""
    return text if len(text) <= width else text[: max(0, width - 1)] + ELLIPSIS


def short_ops(ops) -> str:
    """'convolution, batch_norm_legit_no_training' for ['aten.convolution.default',
    'aten._native_batch_norm_legit_no_training.default'] (each name once)."""
    if not isinstance(ops, (list, tuple)):
        return ""
    names = [o.split(".")[1] if isinstance(o, str) and o.count(".") >= 2 else str(o) for o in ops]
    names = [n[len("_native_"):] if n.startswith("_native_") else n.lstrip("_") for n in names]
    return ", ".join(dict.fromkeys(names))


def _stat_column(df: pd.DataFrame, stat: str) -> str | None:
    return next((c for c in df.columns if str(c).split(" ")[0] == stat), None)


def compact_table(df: pd.DataFrame, width: int, top: int | None) -> str:
    """The frame (`Inspector.to_dataframe()`) as text at most `width` characters wide: the `top`
    slowest events by average time (every event when None), in execution order, OPERATOR_CALL rows
    left out (they repeat their kernel's event)."""
    rows = df[df["event_name"].astype(str) != OPERATOR_CALL].reset_index(drop=True)
    avg = _stat_column(rows, "avg")
    keep = list(range(len(rows)))
    if top is not None and avg is not None and len(rows) > top:
        keep = sorted(rows[avg].fillna(-1.0).to_numpy().argsort(kind="stable")[::-1][:top].tolist())
    stats = [(s, _stat_column(rows, s)) for s in ("p50", "avg", "max")]
    unit = str(avg).split(" ", 1)[1] if avg and " " in str(avg) else ""
    table = [[str(rows.at[i, "event_block_name"]), str(rows.at[i, "event_name"]),
              *[cell_text(rows.at[i, c]) if c else "" for _, c in stats],
              short_ops(rows.at[i, "op_types"]), str(rows.at[i, "delegate_backend_name"] or "")] for i in keep]
    heads = ["block", "event", *[f"{s} {unit}".strip() for s, _ in stats], "ops", "backend"]
    colalign = ("left", "left", "right", "right", "right", "left", "left")
    lines = fit_table(table, heads, (1, 5), width, colalign)
    if len(keep) < len(rows):
        lines.append(cut(f"({len(keep)} of {len(rows)} events: the slowest by average, in run order; "
                         "--all: every event, --wide: every column)", width))
    return "\n".join(lines) + "\n"


def fit_table(rows: list[list[str]], heads: list[str], flex: tuple[int, ...], width: int,
              colalign: tuple[str, ...] | None = None) -> list[str]:
    """tabulate's "simple" table of `rows` (strings) as lines of at most `width` characters: the
    `flex` columns share what the other columns leave (each at least MIN_FLEX, cut with "…")."""
    fixed = [k for k in range(len(heads)) if k not in flex]
    room = width - sum(max([len(heads[k])] + [len(r[k]) for r in rows]) for k in fixed) - 2 * (len(heads) - 1)
    for _ in range(4):  # re-cut if tabulate's padding overshoots
        text = _render(rows, heads, flex, max(MIN_FLEX * len(flex), room), colalign)
        over = max((len(line) for line in text.splitlines()), default=0) - width
        if over <= 0:
            break
        room -= over
    return [line.rstrip()[:width] for line in text.splitlines()]


def _render(rows, heads, flex, room: int, colalign) -> str:
    from tabulate import tabulate

    widths: dict[int, int] = {}
    left = room
    for n, k in enumerate(sorted(flex, key=lambda k: max([5] + [len(r[k]) for r in rows]))):
        share = left // (len(flex) - n)  # the narrowest column first: what it does not need goes to the rest
        widths[k] = max(MIN_FLEX, min(max([len(heads[k])] + [len(r[k]) for r in rows]), share))
        left -= widths[k]
    cells = [[cut(v, widths[k]) if k in widths else v for k, v in enumerate(r)] for r in rows]
    return tabulate(cells, headers=heads, tablefmt="simple", disable_numparse=True, colalign=colalign)


def cell_text(v) -> str:
    """A value as every etlab table writes it: the terminal's (`etlab inspect`, `etlab quant`, a view's text form)
    and a TableView's plain HTML, so the same number reads the same on each. Missing (None, NaN, pandas' NA / NaT):
    empty. A whole number: all its digits, also as a float below 1e15 (pandas makes an int column float when a cell
    is missing; 123456 must not read 1.235e+05 there). Any other number: 4 significant digits, the project's
    precision for measurements (format.js's fmtNum, the CLIs' summaries). A list: its items by this rule, joined."""
    if isinstance(v, (list, tuple)) or (isinstance(v, np.ndarray) and v.ndim > 0):
        items = v.tolist() if isinstance(v, np.ndarray) else v
        return ", ".join(f"[{cell_text(x)}]" if isinstance(x, (list, tuple)) else cell_text(x) for x in items)
    if v is None or v is pd.NA or v is pd.NaT:
        return ""
    if isinstance(v, (bool, np.bool_)):
        return str(bool(v))
    if isinstance(v, numbers.Integral):
        return str(int(v))
    if isinstance(v, numbers.Real):
        x = float(v)
        if x != x:
            return ""
        if x.is_integer() and abs(x) < 1e15:
            return str(int(x))
        return f"{x:.4g}"
    return str(v)


def fit_frame(df: pd.DataFrame, width: int, flex: tuple[str, ...] = (), wide: bool = False
              ) -> tuple[list[str], list[str]]:
    """`df` as table lines within `width` characters and the names of the columns left out: the `flex`
    (text) columns cut with "…" to what the others leave (at least MIN_FLEX each), and while even that
    does not fit, columns left out from the right (the caller orders them by importance; the first is
    always kept). `wide`: every column, whole, whatever the width (a CLI's --wide)."""
    heads = [str(c) for c in df.columns]
    rows = [[cell_text(v) for v in r] for r in df.itertuples(index=False)]
    align = tuple("right" if pd.api.types.is_numeric_dtype(t) and not pd.api.types.is_bool_dtype(t) else "left"
                  for t in df.dtypes)
    if wide:
        from tabulate import tabulate

        return tabulate(rows, headers=heads, tablefmt="simple", disable_numparse=True, colalign=align).splitlines(), []
    keep = len(heads)
    while keep > 1:
        sizes = [max([len(heads[k]) + 2] + [len(r[k]) for r in rows]) for k in range(keep)]
        need = sum(min(MIN_FLEX, n) if heads[k] in flex else n for k, n in enumerate(sizes)) + 2 * (keep - 1)
        if need <= width:
            break
        keep -= 1
    lines = fit_table([r[:keep] for r in rows], heads[:keep], tuple(k for k in range(keep) if heads[k] in flex),
                      width, align[:keep])
    return lines, heads[keep:]
