"""`make sanitize`: the runtime tests on a native core built with AddressSanitizer, UndefinedBehaviorSanitizer,
assertions and pybind11's GIL checks.

    python -m tests.runtime.sanitize [pytest arguments]     (default: tests/runtime)

Builds the core with `ETLAB_SANITIZE=1 setup.py build_ext` (see setup.py) into build/sanitize (its own
directory: the in-place build the other tests use is untouched), then runs pytest in a child process
that preloads libasan (a Python extension cannot bring its own: ASan must be first in the process) and
loads that build as `etlab.runtime._native._core` before anything imports the normal one. Any sanitizer
report or GIL-check failure aborts the child, so the run fails; leaks are not reported (the interpreter
keeps memory at exit by design).
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build" / "sanitize"
SO_NAME = "_core" + sysconfig.get_config_var("EXT_SUFFIX")
SANITIZER_OPTIONS = {
    "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1:halt_on_error=1:detect_odr_violation=0:"
                    "allocator_may_return_null=1",
    "UBSAN_OPTIONS": "halt_on_error=1:abort_on_error=1:print_stacktrace=1",
}


def build() -> Path:
    env = dict(os.environ, ETLAB_SANITIZE="1", MAX_JOBS=os.environ.get("MAX_JOBS", "2"))
    subprocess.run([sys.executable, "setup.py", "build_ext", "--build-lib", str(BUILD / "lib"),
                    "--build-temp", str(BUILD / "temp")], cwd=ROOT, env=env, check=True)
    so = BUILD / "lib" / "etlab" / "runtime" / "_native" / SO_NAME
    if not so.exists():
        raise SystemExit(f"sanitize: the build left no {so}")
    return so


def preloads() -> str:
    """libasan (it must come first in the process) and libstdc++: the interpreter does not link the latter,
    and without it loaded when libasan starts, ASan's interceptor of C++ throws finds no real __cxa_throw and
    aborts the first time torch throws."""
    paths = []
    for lib in ("libasan.so", "libstdc++.so.6"):
        out = subprocess.run(["g++", f"-print-file-name={lib}"], capture_output=True, text=True, check=True)
        path = os.path.realpath(out.stdout.strip())
        if not os.path.exists(path):
            raise SystemExit(f"sanitize: {lib} not found (install the compiler's {lib})")
        paths.append(path)
    return " ".join(paths)


# Run in the child: the sanitized build becomes etlab.runtime._native._core, then pytest runs.
_CHILD = """
import importlib.util, sys
import torch  # the extension links against libtorch
spec = importlib.util.spec_from_file_location("etlab.runtime._native._core", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
sys.modules["etlab.runtime._native._core"] = module
from etlab.runtime import _native
assert _native._core is module, "the normal build was loaded instead of the sanitized one"
import pytest
sys.exit(pytest.main(sys.argv[2:]))
"""


def main(argv: list[str]) -> int:
    so = build()
    args = argv or ["tests/runtime"]
    env = dict(os.environ, LD_PRELOAD=preloads(), **SANITIZER_OPTIONS)
    cmd = [sys.executable, "-c", _CHILD, str(so), "-q", "-p", "no:cacheprovider", "-n", "0", *args]
    print(f"sanitize: running {' '.join(args)} on {so.relative_to(ROOT)}", flush=True)
    return subprocess.run(cmd, cwd=ROOT, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
