"""A/B comparison of two slices of a fleet store (e.g. build A vs build B), op by op, with statistics.

The unit of observation is a run: for each op (or op and debug handle), the time it took in one
run is the sum of its events in that run. Runs are independent samples; events of one run are not.
By default each run's time is taken relative to the typical base time of the same op on the same
device, so a fleet of fast and slow phones compares like a fleet of one (`adjust_runs`).
Per op (and stratum, e.g. device class):

- p50 change: median(head) / median(base) - 1, with a percentile-bootstrap confidence interval;
- Mann-Whitney U (two-sided), p-values corrected for the number of ops compared (Holm);
- flag "regression" when the corrected p < alpha, the change is at least `threshold` and the
  whole interval is above zero; "improvement" symmetrically. A CI gate fails on any regression.

Devices seen on one side only are left out of the adjusted comparison; with `adjust_by=None`
the raw times are compared, and then the device mix of the two sides must match.

`metric="memory"` compares memory instead of time, with the same statistics: per owner (op: "tracked",
each run's tracked peak; "planned:1", "temp", "delegate:<backend>", "unplanned", "rss", ...: the store's
memory rows, from runs traced with allocation events), one sample per block (a run, or the load), raw
bytes (memory does not scale with a device's speed); a regression is an owner that grew.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from etlab.facts import display
from etlab.fleet._queries import GROUP_COLUMNS, MEMORY_WHERE, OPS_WHERE, FleetDB, _columns

_LABEL = re.compile(r"label\.([A-Za-z_][A-Za-z0-9_.-]{0,63})")
MIN_RUNS = 3
METRICS = ("time", "memory")
BOOTSTRAP_CAP = 5_000   # larger samples are subsampled for the interval (which only widens it)


def parse_selector(text: str) -> dict[str, str]:
    """The CLI's --base/--head selector as tags; a ValueError names a selector that is not COLUMN=VALUE pairs.

    >>> parse_selector("build=B, device_class=mid")
    {'build': 'B', 'device_class': 'mid'}
    """
    out = {}
    for pair in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"selector {text!r}: expected COLUMN=VALUE[,COLUMN=VALUE...]")
        out[key.strip()] = value.strip()
    if not out:
        raise ValueError(f"selector {text!r} selects nothing")
    return out


def _selector_sql(sel: dict[str, str]) -> tuple[str, list[str]]:
    """A selector as a parameterized WHERE clause; column names are checked, values are parameters."""
    conds, params = [], []
    for col, value in sel.items():
        m = _LABEL.fullmatch(col)
        if m:
            conds.append(f"json_extract_string(labels, '$.\"{m.group(1)}\"') = ?")
        else:
            if col not in GROUP_COLUMNS:
                raise ValueError(f"selector column {col!r}: one of {', '.join(GROUP_COLUMNS)} or label.<name>")
            conds.append(f"CAST({col} AS VARCHAR) = ?")
        params.append(value)
    return " AND ".join(conds), params


def holm(p: np.ndarray) -> np.ndarray:
    """Holm-Bonferroni adjusted p-values (NaN stays NaN and does not count as a test).

    >>> holm(np.array([0.01, 0.04, np.nan, 0.03]))
    array([0.03, 0.06,  nan, 0.06])
    """
    p = np.asarray(p, dtype=np.float64)
    out = np.full_like(p, np.nan)
    ok = np.flatnonzero(~np.isnan(p))
    m = len(ok)
    if m == 0:
        return out
    order = ok[np.argsort(p[ok], kind="stable")]
    adj = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    out[order] = adj
    return out


def bootstrap_median_ratio(base: np.ndarray, head: np.ndarray, *, n_boot: int, level: float,
                           rng: np.random.Generator) -> tuple[float, float]:
    """Percentile-bootstrap interval of median(head) / median(base) - 1."""
    def medians(x: np.ndarray) -> np.ndarray:
        if len(x) > BOOTSTRAP_CAP:
            x = rng.choice(x, BOOTSTRAP_CAP, replace=False)
        out = np.empty(n_boot)
        step = max(1, 2_000_000 // len(x))
        for i in range(0, n_boot, step):
            k = min(step, n_boot - i)
            out[i : i + k] = np.median(x[rng.integers(0, len(x), size=(k, len(x)))], axis=1)
        return out

    ratio = medians(head.astype(np.float64)) / np.maximum(medians(base.astype(np.float64)), 1e-12) - 1.0
    lo, hi = np.quantile(ratio, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def compare_samples(groups: dict[tuple, tuple[np.ndarray, np.ndarray]], *, threshold: float, alpha: float,
                    n_boot: int, level: float, seed: int) -> pd.DataFrame:
    """Statistics of each group's (base, head) per-run samples; one row per group (keys as `key`)."""
    from scipy.stats import mannwhitneyu

    rng = np.random.default_rng(seed)
    rows = []
    for key, (base, head) in groups.items():
        row = {"key": key, "n_base": len(base), "n_head": len(head),
               "p50_base_ns": float(np.median(base)) if len(base) else np.nan,
               "p50_head_ns": float(np.median(head)) if len(head) else np.nan}
        row["change"] = row["p50_head_ns"] / row["p50_base_ns"] - 1 if len(base) and len(head) else np.nan
        row["ci_low"] = row["ci_high"] = row["p_value"] = np.nan
        if len(base) >= MIN_RUNS and len(head) >= MIN_RUNS:
            row["ci_low"], row["ci_high"] = bootstrap_median_ratio(base, head, n_boot=n_boot, level=level, rng=rng)
            row["p_value"] = float(mannwhitneyu(head, base, alternative="two-sided").pvalue)
        rows.append(row)
    df = pd.DataFrame(rows, columns=["key", "n_base", "n_head", "p50_base_ns", "p50_head_ns", "change", "ci_low",
                                     "ci_high", "p_value"])
    df["p_adjusted"] = holm(df["p_value"].to_numpy())
    sig = df["p_adjusted"] < alpha
    df["flag"] = np.where(sig & (df["change"] >= threshold) & (df["ci_low"] > 0), "regression",
                          np.where(sig & (df["change"] <= -threshold) & (df["ci_high"] < 0), "improvement", ""))
    return df


@dataclass
class FleetDiff:
    """The result of `diff`: one row per op (and stratum); `regressions` are the flagged rows."""

    table: pd.DataFrame
    base: dict[str, str]
    head: dict[str, str]
    key: list[str]
    strata: list[str]
    threshold: float
    alpha: float
    level: float
    metric: str = "time"  # "memory": the p50 columns are p50_base_bytes / p50_head_bytes

    @property
    def unit(self) -> str:
        """The unit of the compared metric: bytes for memory, nanoseconds for latency."""
        return "bytes" if self.metric == "memory" else "ns"

    @property
    def regressions(self) -> pd.DataFrame:
        """The rows flagged as significantly worse in B than in A (after the multiple-comparison correction)."""
        return self.table[self.table["flag"] == "regression"]

    @property
    def improvements(self) -> pd.DataFrame:
        """The rows flagged as significantly better in B than in A."""
        return self.table[self.table["flag"] == "improvement"]

    @property
    def exit_code(self) -> int:
        """For CI gates: 1 if any op regressed, else 0."""
        return 1 if len(self.regressions) else 0

    def format(self, only_flagged: bool = False) -> str:
        """A plain-text table for the terminal (changes in percent, times in microseconds)."""
        from tabulate import tabulate

        t = self.table if not only_flagged else self.table[self.table["flag"] != ""]
        cols = [*self.strata, *self.key]
        shown, scale = ("KiB", 1024) if self.metric == "memory" else ("us", 1e3)
        rows = [[*(r[c] for c in cols), r["n_base"], r["n_head"], f"{r[f'p50_base_{self.unit}'] / scale:.1f}",
                 f"{r[f'p50_head_{self.unit}'] / scale:.1f}",
                 f"{100 * r['change']:+.1f}%", f"[{100 * r['ci_low']:+.1f}%, {100 * r['ci_high']:+.1f}%]",
                 f"{r['p_adjusted']:.2g}", r["flag"]] for _, r in t.iterrows()]
        head = [*cols, "runs A", "runs B", f"p50 A ({shown})", f"p50 B ({shown})", "p50 change",
                f"{int(self.level * 100)}% CI", "p (Holm)", "flag"]
        sel = lambda s: ",".join(f"{k}={v}" for k, v in s.items())
        title = (f"{'memory: ' if self.metric == 'memory' else ''}"
                 f"base {sel(self.base)} vs head {sel(self.head)}: {len(self.regressions)} regression(s), "
                 f"{len(self.improvements)} improvement(s) (threshold {100 * self.threshold:.0f}%, "
                 f"alpha {self.alpha})")
        return title + "\n" + tabulate(rows, headers=head, disable_numparse=True)

    def view(self):
        """The notebook view: a sortable table and a chart of the p50 change with its interval
        (`etlab.visualizer.FleetDiffView`, found through etlab.facts.display: views sit above fleet)."""
        return display.show(self)


def adjust_runs(runs: pd.DataFrame, groups: list[str], by: str) -> pd.DataFrame:
    """Divides each run's time by the median base-side time of the same op on the same `by` unit
    (device), so that device speed drops out of the comparison; units seen on one side only are
    left out. Adds the column `value` (1.0 = that device's typical base time)."""
    base_med = (runs[runs["side"] == "base"].groupby([*groups, by], dropna=False)["run_ns"].median()
                .rename("base_median"))
    both = runs.groupby([*groups, by], dropna=False)["side"].nunique().rename("sides")
    out = runs.join(base_med, on=[*groups, by]).join(both, on=[*groups, by])
    out = out[(out["sides"] == 2) & (out["base_median"] > 0)]
    return out.assign(value=out["run_ns"] / out["base_median"])


def diff(store, base: dict | str, head: dict | str, *, key=None, strata=(), where: str | None = None,
         adjust_by: str | None = "device", threshold: float = 0.05, alpha: float = 0.05, level: float = 0.95,
         n_boot: int = 1000, seed: int = 0, db: FleetDB | None = None, metric: str = "time") -> FleetDiff:
    """Compares the runs selected by `base` with those selected by `head` (see the module docstring).

    base/head: {column: value} or "column=value,..." (columns of the store or label.<name>).
    key: what an "op" is (default its name; ("op", "debug_handle") compares instruction by instruction; for
    memory the owner and the block's name, so that load and run bytes are two rows).
    strata: columns compared separately (e.g. "device_class"); where: extra SQL condition.
    adjust_by: each run is measured relative to its device's typical base time (`adjust_runs`),
    which takes the spread between fast and slow devices out of the test; None compares raw times.
    The p50 columns are raw times either way; change, interval and p-value use the adjusted ones.
    metric: "time", or "memory" (bytes per owner and block, never adjusted; see the module docstring).
    """
    if metric not in METRICS:
        raise ValueError(f"metric {metric!r}: one of {', '.join(METRICS)}")
    if metric == "memory":
        adjust_by = None
    if not key:
        key = ("op", "run_name") if metric == "memory" else ("op",)
    base = parse_selector(base) if isinstance(base, str) else dict(base)
    head = parse_selector(head) if isinstance(head, str) else dict(head)
    key, strata = _columns(key, "key"), _columns(strata, "strata")
    extra_cols = _columns([adjust_by], "adjust_by") if adjust_by and adjust_by not in (*strata, *key) else []
    own = db is None
    db = db or FleetDB(store)
    try:
        cols = ", ".join([*strata, *key, *extra_cols])
        frames = []
        for side, sel in (("base", base), ("head", head)):
            cond, params = _selector_sql(sel)
            extra = f" AND ({where})" if where else ""
            value, rows = ("bytes", MEMORY_WHERE) if metric == "memory" else ("duration_ns", OPS_WHERE)
            q = (f"SELECT {cols}, file_id, run, sum({value}) AS run_ns FROM events "
                 f"WHERE {rows} AND {cond}{extra} GROUP BY {cols}, file_id, run")
            frames.append(db.sql(q, params).assign(side=side))
    finally:
        if own:
            db.close()
    group_cols = [*strata, *key]
    runs = pd.concat(frames, ignore_index=True)
    raw = runs.groupby([*group_cols, "side"], dropna=False)["run_ns"].median().unstack("side")
    runs = adjust_runs(runs, group_cols, adjust_by) if adjust_by else runs.assign(value=runs["run_ns"])
    groups: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
    empty = np.zeros(0)
    for k, g in runs.groupby(group_cols, sort=True, dropna=False):
        k = k if isinstance(k, tuple) else (k,)
        by_side = dict(tuple(g.groupby("side")))
        groups[k] = tuple(by_side[s]["value"].to_numpy(np.float64) if s in by_side else empty
                          for s in ("base", "head"))
    table = compare_samples(groups, threshold=threshold, alpha=alpha, n_boot=n_boot, level=level, seed=seed)
    keys = pd.DataFrame(table.pop("key").tolist(), columns=group_cols) if len(table) else \
        pd.DataFrame(columns=group_cols)
    table = pd.concat([keys, table], axis=1)
    if len(table):  # report raw medians (the adjusted ones are relative units)
        idx = pd.MultiIndex.from_frame(table[group_cols]) if len(group_cols) > 1 else table[group_cols[0]]
        for side in ("base", "head"):
            col = raw[side] if side in raw else pd.Series(np.nan, index=raw.index)
            table[f"p50_{side}_ns"] = col.reindex(idx).to_numpy()
    if metric == "memory":
        table = table.rename(columns={"p50_base_ns": "p50_base_bytes", "p50_head_ns": "p50_head_bytes"})
    return FleetDiff(table=table, base=base, head=head, key=key, strata=strata, threshold=threshold, alpha=alpha,
                     level=level, metric=metric)
