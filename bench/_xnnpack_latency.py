"""`bench/xnnpack_lowering.py --latency-only`: the latency of the kept `.pte` pairs timed again, nothing lowered.

The bench's rows were measured with the machine loaded by other work, where a second thread is rarely free;
this mode re-times only the latency of each stored row from its kept pair (bench/_xnnpack_ptes.py) on
upstream's runtime, by the bench's method (both programs in one process, alternating rounds, one untimed
call before each batch, the order rotated every round), and updates only the latency fields of the row
(and `latency_retimed`, which its note renders: when, at what load, how many rounds, from which pair).

Rounds are chosen to fit a time budget: each model's cost per round is estimated from its stored
latency (measured under load, so an upper bound on a quiet machine), a batch is about 20 ms of calls (at
most 50, at least 1), and one common time cap per model gives each model between `min_rounds` and
`max_rounds` rounds (small models get the most). The estimate is printed before the first model.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from _xnnpack_ptes import Pair, read_pair

LABELS = {"1": 1, "default": 0}  # threads label -> the worker's `threads` (0: the pool's default size)
BATCH_S = 0.02  # a timed batch is about this long (per_round calls), so fast models are not timer noise
MAX_PER_ROUND = 50
FALLBACK_CALL_S = 0.1  # per call and side when a row has no stored latency to estimate from
LOAD_S_PER_BYTE = 1 / 200e6  # loading a program (XNNPACK packs the weights) ~ bytes / 200 MB/s, estimated


@dataclass
class Plan:
    """One model's re-timing: its kept pair, threads label, rounds and calls per batch, estimated seconds."""

    model: str
    pair: Pair
    label: str
    rounds: int
    per_round: int
    call_s: float  # estimated seconds of one call of each side, summed
    fixed_s: float  # loading both programs and the warm-up calls

    @property
    def seconds(self) -> float:
        return self.fixed_s + self.rounds * (self.per_round + 1) * self.call_s


def _call_s(row, label: str) -> float:
    """Both sides' stored latency of one call (seconds, summed): this label's, else the other's."""
    for k in (label, *LABELS):
        t = row.latency.get(k)
        if t and t.get("etlab") and t.get("upstream"):
            return (t["etlab"] + t["upstream"]) / 1e3
    return 2 * FALLBACK_CALL_S


def plan(rows: list, pairs: dict[str, Pair], labels: list[str], budget_s: float, min_rounds: int = 5,
         max_rounds: int = 30) -> list[Plan]:
    """Rounds per (model, label) so that the estimated total fits `budget_s` where it can: one common time
    cap per model (found by bisection); no model gets fewer than `min_rounds` rounds (then the estimate says
    the budget is exceeded) or more than `max_rounds`."""
    base = []
    for label in labels:
        for r in rows:
            if r.name not in pairs:
                continue
            call = _call_s(r, label)
            per_round = max(1, min(MAX_PER_ROUND, int(BATCH_S / (call / 2))))
            size = sum(pairs[r.name].path(n).stat().st_size for n in ("etlab.pte", "upstream.pte"))
            base.append(Plan(r.name, pairs[r.name], label, max_rounds, per_round, call,
                             3 * call + size * LOAD_S_PER_BYTE + 0.2))

    def with_cap(cap: float) -> list[Plan]:
        return [replace(p, rounds=max(min_rounds, min(max_rounds, int(cap / ((p.per_round + 1) * p.call_s)))))
                for p in base]

    lo, hi = 0.0, max((p.seconds for p in base), default=0.0)
    if sum(p.seconds for p in with_cap(hi)) <= budget_s:
        return with_cap(hi)
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(p.seconds for p in with_cap(mid)) <= budget_s else (lo, mid)
    return with_cap(lo)


def _minutes(s: float) -> str:
    return f"{int(s // 60)}m{int(s % 60):02d}s"


def retime(rows: list, store: Path, labels: list[str], budget_s: float, ask: Callable[..., dict],
           save: Callable[[object], None], max_rounds: int = 30, log: Callable[[str], None] = print,
           dry_run: bool = False) -> list:
    """Re-times every row of `rows` that has a kept pair (the others are named and left as they are);
    `ask(**request)` is the upstream worker's, `save(row)` stores a row as soon as it is updated.
    Returns the updated rows. `dry_run`: only the plan and its estimate are printed."""
    pairs, lacking = {}, []
    for r in rows:
        try:
            pairs[r.name] = read_pair(store, r.name)
        except ValueError as e:
            lacking.append(f"{r.name} ({e})")
    if lacking:
        log(f"[latency] no usable kept pair for {len(lacking)} rows (left as they are): " + "; ".join(lacking))
    plans = plan(rows, pairs, labels, budget_s, max_rounds=max_rounds)
    total = sum(p.seconds for p in plans)
    rounds = [p.rounds for p in plans] or [0]
    log(f"[latency] {len(pairs)} kept pairs, threads {', '.join(labels)}: {len(plans)} timings, estimated "
        f"{_minutes(total)} (budget {_minutes(budget_s)}; from the rows' latency measured under load, so an upper "
        f"bound on a quiet machine; plus the upstream worker's start-up); rounds {min(rounds)}-{max(rounds)}, "
        f"load now {os.getloadavg()[0]:.1f}")
    if dry_run:
        for p in plans:
            log(f"[latency plan] {p.model} {p.label}: {p.rounds} rounds of {p.per_round}, ~{p.seconds:.1f} s")
        return []
    t0 = time.perf_counter()
    ask(cmd="ready", timeout=900)
    log(f"[latency] upstream's worker started in {time.perf_counter() - t0:.1f} s")
    by_name, updated, start = {r.name: r for r in rows}, {}, time.perf_counter()
    for i, p in enumerate(plans, 1):
        row = by_name[p.model]
        before = os.getloadavg()[0]
        t0 = time.perf_counter()
        try:
            t = ask(cmd="latency", ptes={"etlab": str(p.pair.path("etlab.pte")),
                                         "upstream": str(p.pair.path("upstream.pte"))},
                    inputs=str(p.pair.path("inputs.pt")), threads=LABELS[p.label], rounds=p.rounds,
                    per_round=p.per_round, timeout=120 + 10 * p.seconds)
        except RuntimeError as e:
            log(f"[latency {i}/{len(plans)}] {p.model} {p.label}: FAILED ({e}); row left as it is")
            continue
        row.latency[p.label] = t["median_ms"]
        row.latency_iqr[p.label] = t.get("iqr_ms", {})
        if p.label == "default":
            row.threads_default = t["threads"]
        row.latency_retimed[p.label] = {
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "load": [before, os.getloadavg()[0]],
            "rounds": p.rounds, "per_round": p.per_round, "threads": t["threads"], "pte_commit": p.pair.commit,
            "pte_source": p.pair.source}
        save(row)
        updated[row.name] = row
        elapsed = time.perf_counter() - start
        left = sum(q.seconds for q in plans[i:])
        ms = t["median_ms"]
        log(f"[latency {i}/{len(plans)}] {p.model} {p.label}: etlab {ms['etlab']:.3g} / upstream {ms['upstream']:.3g} "
            f"ms ({ms['etlab'] / ms['upstream']:.3f}), {p.rounds} rounds of {p.per_round}, "
            f"{time.perf_counter() - t0:.1f} s; elapsed {_minutes(elapsed)}, estimated left {_minutes(left)}")
    return list(updated.values())
