"""Helpers shared by the bench scripts: timing, the reference python, and bench/RESULTS.md sections.

RESULTS.md holds one `## <name>` section per bench script; a script replaces its own section
(`write_section`) and leaves the others as they are.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "RESULTS.md"
SETUP_SH = REPO.parent / "shared" / "reference" / "setup.sh"
ET_REF = REPO.parent / "shared" / "reference" / "et_ref.py"

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from etlab.schema import write_atomic  # noqa: E402


def median(xs) -> float:
    return statistics.median(xs)


def interleaved(contenders: dict[str, Callable[[], object]], rounds: int = 30, per_round: int = 5,
                warmup: int = 3, clock: Callable[[], float] = time.perf_counter, warm_each: bool = False
                ) -> dict[str, float]:
    """Median seconds per call of each contender, timed in alternating rounds on `clock`.

    Alternating makes slow drift (other processes, thermal state) hit every contender alike.
    `warm_each`: one untimed call before each timed batch, and the order rotated every round (each
    contender follows each other one equally often), so that batches measure the steady state rather
    than the caches the previous contender left behind.
    """
    for fn in contenders.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {k: [] for k in contenders}
    order = list(contenders.items())
    for r in range(rounds):
        for name, fn in (order[r % len(order):] + order[: r % len(order)] if warm_each else order):
            if warm_each:
                fn()
            start = clock()
            for _ in range(per_round):
                fn()
            samples[name].append((clock() - start) / per_round)
    return {k: median(v) for k, v in samples.items()}


def ref_env() -> dict[str, str]:
    """Environment for the reference python: none of etlab's import paths."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


def reference_python() -> str | None:
    """The upstream reference python (../shared/reference/setup.sh), or None if it cannot be set up."""
    if not SETUP_SH.is_file():
        return None
    p = subprocess.run(["bash", str(SETUP_SH)], capture_output=True, text=True, env=ref_env())
    lines = [ln.strip() for ln in p.stdout.splitlines() if ln.strip()]
    return lines[-1] if p.returncode == 0 and lines else None


def run_ref(ref: str, *args, timeout: float = 1800) -> str:
    """Runs `ref *args`; returns stdout; raises RuntimeError with stderr's tail on failure."""
    p = subprocess.run([ref, *map(str, args)], capture_output=True, text=True, env=ref_env(), timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args))} failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    return p.stdout


def worker_answer(proc: subprocess.Popen, line: str, who: str) -> dict:
    """One JSON answer `line` read from a long-lived reference-python worker `proc`: an empty line (the
    worker exited) raises naming `who` and its exit code; an answer carrying "error" raises that error."""
    if not line:
        raise RuntimeError(f"{who} exited (code {proc.wait(timeout=60)})")
    answer = json.loads(line)
    if "error" in answer:
        raise RuntimeError(answer["error"])
    return answer


def write_section(name: str, body: str, path: Path = RESULTS) -> None:
    """Replaces section `## name` of RESULTS.md with `body` (which starts with that heading), atomically."""
    heading = f"## {name}"
    if not body.startswith(heading):
        body = f"{heading}\n\n{body}"
    body = body.rstrip("\n") + "\n"
    old = path.read_text() if path.is_file() else "# Benchmark results\n"
    pattern = re.compile(rf"^{re.escape(heading)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(old):
        new = pattern.sub(lambda _m: body + "\n", old).rstrip("\n") + "\n"
    else:
        new = old.rstrip("\n") + "\n\n" + body
    write_atomic(path, new.encode())
