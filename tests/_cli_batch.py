"""Several `etlab` commands in ONE child process: `etlab.cli.main(argv)` per command, stdout / stderr captured
per command, the exit status returned or raised (SystemExit). What a user runs, through the installed etlab
(no path override), with torch imported once instead of once per command (~3-5 s of CPU each)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_RUNNER = r"""
import contextlib, glob, io, json, sys, time, warnings
from etlab.cli import main
out = []
for argv in json.loads(sys.stdin.read()):
    # "glob:PATTERN": the first file a command before this one wrote there
    argv = [sorted(glob.glob(a[5:], recursive=True))[0] if a.startswith("glob:") else a for a in argv]
    buf, err, start = io.StringIO(), io.StringIO(), time.process_time()
    # catch_warnings: each command starts with the filters as they were and warns again what an earlier one did
    # (entering it resets the once-per-location registries), as in a process of its own
    with warnings.catch_warnings(), contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as e:  # --help, argparse errors
            status = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    out.append({"argv": argv, "status": status or 0, "stdout": buf.getvalue(), "stderr": err.getvalue(),
                "cpu_s": time.process_time() - start})
sys.__stdout__.write(json.dumps(out))
"""


def run_etlab(commands: list[list], env: dict | None = None, timeout: float = 1200) -> list[dict]:
    """Runs `commands` (argv lists, any item str()-ed) in one child; per command {argv, status, stdout, stderr,
    cpu_s}. With pytest -s it prints the child's wall and CPU seconds and the costliest commands."""
    start, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run([sys.executable, "-c", _RUNNER], input=json.dumps([[str(a) for a in c] for c in commands]),
                       capture_output=True, text=True, timeout=timeout, env=dict(os.environ) if env is None else env,
                       cwd=REPO)
    assert p.returncode == 0, p.stderr[-3000:]
    results = json.loads(p.stdout)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"\n{len(commands)} etlab commands in one process: {time.perf_counter() - start:.1f} s wall, "
          f"{after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime:.1f} s CPU")
    for r in sorted(results, key=lambda r: -r["cpu_s"])[:12]:
        print(f"{r['cpu_s']:7.2f} s CPU  {' '.join(map(str, r['argv']))[:100]}")
    return results
