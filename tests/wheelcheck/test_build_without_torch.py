"""setup.py without torch (a `--no-build-isolation` build in a venv that lacks it): the native core's build
stops with one message saying what to install, instead of a package without its core; the declared
build requirements pin the torch the core is built against. (The whole isolated build from a clean
clone is `make wheel-check`.)"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_WITHOUT_TORCH = ("import runpy, sys; sys.modules['torch'] = None; sys.argv = ['setup.py', *sys.argv[1:]]; "
                  "runpy.run_path('setup.py', run_name='__main__')")


def test_build_ext_without_torch_stops_with_what_to_install(tmp_path):
    out = subprocess.run([sys.executable, "-c", _WITHOUT_TORCH, "build_ext", "--build-lib", str(tmp_path / "lib"),
                          "--build-temp", str(tmp_path / "tmp")], cwd=REPO, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("etlab: cannot build the native runtime core: torch is not importable"), out.stderr[-2000:]
    assert "torch==2.13.0" in last and "ETLAB_NO_NATIVE=1" in last and "Traceback" not in out.stderr
    assert not (tmp_path / "lib").exists()


def test_build_requirements_pin_the_runtime_torch():
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    requires = meta["build-system"]["requires"]
    assert "torch==2.13.0" in requires and "torch==2.13.0" in meta["project"]["dependencies"]
    assert any(r.startswith("jupyterlab") for r in requires)
