"""`python -m etlab.jupyter._verify FILE.bpte [NAME] [--rtol R] [--atol A]`: runs every bundled test
case with etlab's runtime and prints the reports as one JSON object. The server runs it as a child
process with a time limit, so a program that loops or crashes costs that process, never the server.

The tolerance defaults to etlab.devtools' (rtol 1e-4, atol 1e-6: see `_bundled_runtime`); the report
names the one used, so a verdict never hides what "passed" meant."""

from __future__ import annotations

import argparse
import json
import sys

from etlab.errors import Error


def tolerance_arg(name: str, text: str | None) -> float | None:
    """A tolerance given as text (a query argument or a command-line option): None when not given, else a
    finite number >= 0; a ValueError naming the argument otherwise."""
    if text is None or str(text).strip() == "":
        return None
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: not a number: {str(text)[:40]!r}") from None
    from etlab.devtools import check_tolerance

    check_tolerance(value, 0.0) if name == "rtol" else check_tolerance(0.0, value)
    return value


def verify(path: str, name: str, rtol: float | None = None, atol: float | None = None) -> dict:
    """Every test case's verdict, with each output's check (max abs diff, mismatched elements), and the
    tolerance it was checked with."""
    from etlab.devtools import DEFAULT_ATOL, DEFAULT_RTOL, load_bundled_program, verify_bundled_program

    rtol = DEFAULT_RTOL if rtol is None else rtol
    atol = DEFAULT_ATOL if atol is None else atol
    program = load_bundled_program(path)
    reports = verify_bundled_program(program, rtol=rtol, atol=atol)
    return {"file": name, "passed": all(r.ok for r in reports), "rtol": rtol, "atol": atol,
            "default_rtol": DEFAULT_RTOL, "default_atol": DEFAULT_ATOL, "cases": [
                {"method": r.method, "index": r.test_case, "ok": r.ok, "rtol": r.rtol, "atol": r.atol,
                 "outputs": [{"index": o.index, "ok": o.ok, "max_abs_diff": o.max_abs_diff,
                              "mismatched": o.mismatched, "numel": o.numel, "problem": o.problem,
                              "text": o.describe()} for o in r.outputs]}
                for r in reports]}


def main(argv: list[str]) -> int:
    """Parses the command line and prints the verification report as one JSON object; a bad file or tolerance prints
    a JSON error naming it instead (still exit 0: the server reads the JSON), anything else ends with a traceback."""
    ap = argparse.ArgumentParser(prog="python -m etlab.jupyter._verify", description=__doc__)
    ap.add_argument("path", help="the .bpte")
    ap.add_argument("name", nargs="?", help="how the report names it (default: the path)")
    ap.add_argument("--rtol", help="relative tolerance (default 1e-4)")
    ap.add_argument("--atol", help="absolute tolerance (default 1e-6)")
    args = ap.parse_args(argv)
    path, name = args.path, args.name or args.path
    try:
        out = verify(path, name, tolerance_arg("rtol", args.rtol), tolerance_arg("atol", args.atol))
    # etlab's own errors (a bad file, a program that cannot load or run) and a ValueError or OSError naming the
    # input; anything else is a bug: it ends the child with a traceback, whose last line the server reports.
    except (Error, ValueError, OSError) as e:
        out = {"file": name, "error": f"{type(e).__name__}: {e}".replace(path, name)}
    sys.stdout.write(json.dumps(out, allow_nan=False, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
