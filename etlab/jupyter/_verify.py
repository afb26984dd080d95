"""`python -m etlab.jupyter._verify FILE.bpte`: runs every bundled test case with etlab's runtime
and prints the reports as one JSON object. The server runs it as a child process with a time limit,
so a program that loops or crashes costs that process, never the server."""

from __future__ import annotations

import json
import sys

from etlab.errors import Error


def verify(path: str, name: str) -> dict:
    """Every test case's verdict, with each output's check (max abs diff, mismatched elements)."""
    from etlab.devtools import load_bundled_program, verify_bundled_program

    program = load_bundled_program(path)
    reports = verify_bundled_program(program)
    return {"file": name, "passed": all(r.ok for r in reports), "cases": [
        {"method": r.method, "index": r.test_case, "ok": r.ok, "rtol": r.rtol, "atol": r.atol,
         "outputs": [{"index": o.index, "ok": o.ok, "max_abs_diff": o.max_abs_diff, "mismatched": o.mismatched,
                      "numel": o.numel, "problem": o.problem, "text": o.describe()} for o in r.outputs]}
        for r in reports]}


def main(argv: list[str]) -> int:
    path, name = argv[0], argv[1] if len(argv) > 1 else argv[0]
    try:
        out = verify(path, name)
    # etlab's own errors (a bad file, a program that cannot load or run) and a ValueError or OSError naming the
    # input; anything else is a bug: it ends the child with a traceback, whose last line the server reports.
    except (Error, ValueError, OSError) as e:
        out = {"file": name, "error": f"{type(e).__name__}: {e}".replace(path, name)}
    sys.stdout.write(json.dumps(out, allow_nan=False, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
