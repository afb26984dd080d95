"""`make fuzz`: the standing fuzz campaign over every loader, load+execute and Inspector+report.

    python -m tests.fuzz.campaign --seconds 600 --workers 2 [--targets pte,etdp] [--no-results]

Runs each target for an equal share of the time budget on every worker, prints progress every
few seconds, saves one reproducer per new finding under tests/fuzz/reproducers/<target>/, and
replaces the "Robustness" section of bench/RESULTS.md with what it tried and what it found.
See tests/fuzz/README.md for the design (seeds, mutators, outcomes, the in-flight record).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tests.fuzz.supervisor import REPRODUCERS, Campaign, Totals, owner_of
from tests.fuzz.targets import TARGETS

FINDING_OUTCOMES = ("exception", "memory", "crash", "hang")


def _split(counter) -> dict[str, int]:
    """Counts by outcome ('ok', 'clean', ...) from 'outcome:error' keys."""
    out: dict[str, int] = {}
    for key, n in counter.items():
        outcome = key.split(":", 1)[0]
        out[outcome] = out.get(outcome, 0) + n
    return out


def results_section(t: Totals, targets: list[str], command: str) -> str:
    """The Robustness section of bench/RESULTS.md: inputs and outcomes per target, then findings."""
    rate = t.inputs() / t.seconds if t.seconds else 0.0
    real = [f for f in t.findings.values() if f.outcome in FINDING_OUTCOMES]
    lines = [
        "## Robustness", "",
        f"`{command}`: structure-aware fuzzing (tests/fuzz), {t.workers} worker processes, "
        f"{t.seconds:.0f} s wall, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.", "",
        f"**{t.inputs():,} inputs, {rate:,.0f} inputs/s; {sum(f.count for f in real):,} finding input(s) in "
        f"{len(real)} distinct signature(s); {t.restarts} worker restart(s).**", "",
        "Outcomes: ok = accepted (and run); clean = FormatError / LoadError / ExecutionError / ValueError naming "
        "the input; unnamed = one of those without the input's name in the message; exception = any other "
        "exception type; crash = the worker died on a signal; hang = one input used > 5 s of CPU (or 50 s of wall "
        "time); memory = peak memory grew by more than 50x the input (+32 MiB for the interpreter).", "",
        "| target | what | inputs | inputs/s (all workers) | ok | clean | unnamed | exception | crash | hang "
        "| memory |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in targets:
        c = _split(t.per_target.get(name, {}))
        n = sum(c.values())
        # inputs/s with all workers on this target: inputs per worker-second times the workers
        rate = n / t.busy[name] * t.workers if t.busy.get(name) else 0.0
        lines.append(f"| {name} | {TARGETS[name].about} | {n:,} | {rate:,.0f} | "
                     + " | ".join(f"{c.get(k, 0):,}" for k in ("ok", "clean", "unnamed", "exception", "crash",
                                                                 "hang", "memory")) + " |")
    lines += ["", "Clean errors by type: " + "; ".join(
        f"{name}: " + ", ".join(f"{k.split(':', 1)[1]} {n:,}" for k, n in sorted(t.per_target.get(name, {}).items())
                                if k.startswith("clean:"))
        for name in targets if any(k.startswith("clean:") for k in t.per_target.get(name, {}))) + ".", ""]
    findings = sorted(t.findings.values(), key=lambda f: (f.outcome not in FINDING_OUTCOMES, f.target, f.signature))
    if findings:
        lines += ["| finding | inputs | owner | reproducer |", "|---|---:|---|---|"]
        repo = REPRODUCERS.parents[2]
        for f in findings:
            where = Path(f.reproducer).resolve().relative_to(repo) if f.reproducer else \
                "(counted, not saved)" if f.outcome == "unnamed" else "(not saved: cap reached)"
            lines.append(f"| {f.outcome}: {f.target} {f.error.split(' ')[0]} in {f.frame} | {f.count:,} | "
                         f"{owner_of(f.frame, f.target)} | {where} |")
    else:
        lines.append("No findings.")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.fuzz.campaign", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=300)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--targets", default=",".join(TARGETS), help=f"comma-separated, of {', '.join(TARGETS)}")
    p.add_argument("--seed", type=int, default=int(time.time()) % 100000)
    p.add_argument("--slice", type=float, default=10.0, help="seconds on one target before a worker moves on")
    p.add_argument("--no-results", action="store_true", help="do not rewrite bench/RESULTS.md")
    p.add_argument("--no-save", action="store_true", help="do not save reproducers")
    args = p.parse_args(argv)
    targets = [t for t in args.targets.split(",") if t]
    unknown = [t for t in targets if t not in TARGETS]
    if unknown:
        p.error(f"unknown target(s) {unknown}; targets are {list(TARGETS)}")
    print(f"fuzzing {', '.join(targets)} for {args.seconds:.0f} s on {args.workers} worker(s), seed {args.seed}",
          flush=True)
    campaign = Campaign(targets, seconds=args.seconds, workers=args.workers, seed=args.seed,
                        reproducers=None if args.no_save else REPRODUCERS, slice_seconds=args.slice,
                        progress=lambda line: print(line, flush=True))
    totals = campaign.run()
    section = results_section(totals, targets, f"make fuzz FUZZ_SECONDS={args.seconds:.0f} "
                                               f"FUZZ_WORKERS={args.workers}")
    print(section)
    if not args.no_results:
        from bench._common import write_section

        write_section("Robustness", section)
        print("wrote the Robustness section of bench/RESULTS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
