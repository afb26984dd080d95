"""`make bench`: runs every benchmark; each replaces its own section of bench/RESULTS.md.

Run on a quiet machine: the ratios against torch eager and upstream are measured side by side
in each script, but absolute times move with load.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = ["compile.py", "runtime.py", "inspector.py", "startup.py", "views.py", "fleet.py", "quant.py",
           "quant_debug.py", "compare.py", "xnnpack_lowering.py"]


def main() -> int:
    failed = []
    for script in SCRIPTS:
        print(f"== bench/{script}", flush=True)
        if subprocess.run([sys.executable, str(HERE / script), *sys.argv[1:]]).returncode != 0:
            failed.append(script)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
