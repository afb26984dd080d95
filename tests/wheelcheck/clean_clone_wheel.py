"""`make wheel-check`: etlab built and installed as someone without the Makefile would, from a clean clone.

    python -m tests.wheelcheck.clean_clone_wheel [--keep DIR] [--also-pip-install]

1. `git clone` of the committed HEAD (nothing of this work tree's builds: no node_modules, no built
   extension, no compiled core);
2. a fresh venv with only `build`; `python -m build` of the clone: an isolated sdist (the JupyterLab
   extension built by setup.py with npm and jupyterlab's builder, build requirements from
   pyproject.toml) and an isolated wheel from that sdist (the native core compiled against the
   torch==2.13.0 the build environment installed);
3. the wheel installed in a second fresh venv with its dependencies; then checked: torch is the CPU
   build of 2.13.0 (never a CUDA one), the native core imports and runs a program (`etlab run` on a
   .pte compiled by this checkout), `etlab --version`, and the Lab extension and server config are
   where JupyterLab looks;
4. with --also-pip-install, `pip install <clone>` too (the wheel built from the tree, not the sdist).

Slow (two isolated environments with torch, an npm install, the core compiled: 10-30 minutes on two
busy cores), so it is its own target, not part of `make test` (whose wheel test builds the Python half
with the prebuilt extension). Exit status 0 when every check passes; each failure is printed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(cmd, *, cwd=None, env=None, capture=False) -> subprocess.CompletedProcess:
    print("+ " + " ".join(map(str, cmd)), flush=True)
    out = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, text=True, capture_output=capture)
    if out.returncode != 0:
        if capture:
            print(out.stdout[-4000:], out.stderr[-4000:], sep="\n")
        raise SystemExit(f"wheel-check: failed ({out.returncode}): {' '.join(map(str, cmd))}")
    return out


def _venv(path: Path) -> Path:
    _run([sys.executable, "-m", "venv", path])
    return path / "bin" / "python"


def _program(folder: Path) -> Path:
    """A small delegated program compiled by this checkout (the installed wheel only has to run it)."""
    code = ("import sys, torch\nfrom etlab.compiler import to_edge_transform_and_lower\n"
            "from etlab.compiler.backends import DemoPartitioner\nfrom etlab.models import make_mlp\n"
            "m, x = make_mlp()\n"
            "to_edge_transform_and_lower(torch.export.export(m, x), partitioner=[DemoPartitioner()])"
            ".to_executorch().write_to_file(sys.argv[1])\n")
    pte = folder / "mlp.pte"
    _run([sys.executable, "-c", code, pte], env={**os.environ, "PYTHONPATH": str(ROOT)})
    return pte


def check(work: Path, also_pip: bool) -> list[str]:
    env = {**os.environ, "MAX_JOBS": os.environ.get("MAX_JOBS", "2")}
    env.pop("PYTHONPATH", None)
    clone = work / "clone"
    _run(["git", "clone", "-q", "--no-local", ROOT, clone])
    builder = _venv(work / "build-venv")
    _run([builder, "-m", "pip", "install", "-q", "build"], env=env)
    _run([builder, "-m", "build", "-o", work / "dist", clone], env=env)
    wheel = next((work / "dist").glob("etlab-*.whl"))
    venv = work / "venv"
    python = _venv(venv)
    _run([python, "-m", "pip", "install", "-q", wheel], env=env)
    failures = []
    torch = _run([python, "-c", "import torch; print(torch.__version__, torch.version.cuda)"], capture=True,
                 env=env).stdout.split()
    if torch != ["2.13.0+cpu", "None"]:
        failures.append(f"torch in the installed venv is {torch}, expected the CPU build 2.13.0+cpu")
    names = __import__("zipfile").ZipFile(wheel).namelist()
    if not any(n.startswith("etlab/runtime/_native/_core") and n.endswith(".so") for n in names):
        failures.append(f"{wheel.name} has no native core")
    out = _run([venv / "bin" / "etlab", "run", _program(work), "--runs", "3"], capture=True, env=env)
    if "on the native core" not in out.stdout:
        failures.append(f"`etlab run` did not run on the native core:\n{out.stdout}")
    version = _run([venv / "bin" / "etlab", "--version"], capture=True, env=env).stdout
    if not version.startswith("etlab 0."):
        failures.append(f"etlab --version printed {version!r}")
    share = venv / "share" / "jupyter" / "labextensions" / "etlab-labextension"
    for need in (share / "package.json", share / "install.json",
                 venv / "etc" / "jupyter" / "jupyter_server_config.d" / "etlab.json"):
        if not need.is_file():
            failures.append(f"{need.relative_to(venv)} is not installed")
    if not list((share / "static").glob("remoteEntry.*.js")):
        failures.append("the Lab extension's static files are not installed")
    if also_pip:
        direct = _venv(work / "pip-venv")
        _run([direct, "-m", "pip", "install", "-q", clone], env=env)
        _run([direct, "-c", "import etlab.runtime._native._core"], env=env)
    return failures


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.wheelcheck.clean_clone_wheel", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keep", metavar="DIR", help="work in DIR (kept) instead of a temporary folder")
    p.add_argument("--also-pip-install", action="store_true", help="also `pip install` the clone directly")
    a = p.parse_args(argv)
    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="etlab-wheel-check-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        failures = check(work, a.also_pip_install)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    for f in failures:
        print(f"wheel-check: FAILED: {f}")
    print("wheel-check: " + ("ok" if not failures else f"{len(failures)} failure(s)"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
