"""Builds etlab's two built parts; everything else is in pyproject.toml.

1. The native runtime core (`etlab.runtime._native._core`), compiled against torch (its headers, its
   bundled pybind11, its libraries). pyproject.toml declares torch==2.13.0 as a build requirement, so
   an isolated build (`pip install .`, `pip wheel .`, `python -m build`) compiles against the same
   torch etlab runs with (pip resolves it to the CPU wheel on this machine's disk, as the Makefile's
   install does). The Makefile builds without isolation (`pip install --no-build-isolation -e .`) after
   installing torch and the build tools; such a build without torch stops with a message saying so.
   ETLAB_NO_NATIVE=1 leaves the core out on purpose (the runtime then runs its Python core and says so).
   ETLAB_SANITIZE=1 builds it for `make sanitize` instead: AddressSanitizer and UndefinedBehaviorSanitizer,
   assertions on (no NDEBUG) and pybind11's check that every reference-count change holds the GIL.

2. The JupyterLab extension (labextension/, TypeScript) into etlab/jupyter/labextension, as Jupyter
   extensions are built by their build backend: before the Python files are collected (build_py, and
   sdist, so that a wheel built from the sdist needs no node), when the built extension is missing
   or older than its sources, with npm and JupyterLab's builder (jupyterlab is a build requirement;
   node and npm must be installed). `make labextension` runs the same steps.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

from setuptools import Command, Extension, setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
NATIVE = "etlab.runtime._native._core"
NATIVE_SOURCES = ["etlab/runtime/_native/core.cpp", "etlab/runtime/_native/core_small.cpp",
                  "etlab/runtime/_native/trace.cpp",
                  "etlab/runtime/_native/dynamic.cpp", "etlab/runtime/_native/module.cpp",
                  "etlab/runtime/_native/quant.cpp",
                  "etlab/runtime/_native/quant_choose.cpp", "etlab/runtime/_native/small.cpp",
                  "etlab/runtime/_native/small_ops.cpp",
                  "etlab/runtime/_native/conv.cpp", "etlab/runtime/_native/conv_depthwise.cpp",
                  "etlab/runtime/_native/qconv.cpp", "etlab/runtime/_native/qconv_gemm.cpp",
                  "etlab/runtime/_native/qconv_depthwise.cpp", "etlab/runtime/_native/qconv_eltwise.cpp",
                  "etlab/runtime/_native/xnn_plan.cpp",
                  "etlab/runtime/_native/lstm.cpp"]
LABEXT_SRC = Path("labextension")
LABEXT_OUT = Path("etlab/jupyter/labextension")
_SANITIZERS = "-fsanitize=address,undefined"
_SANITIZE = {
    "extra_compile_args": ["-O1", "-g", _SANITIZERS, "-fno-sanitize=vptr", "-fno-omit-frame-pointer", "-UNDEBUG",
                           "-DPYBIND11_ASSERT_GIL_HELD_INCREF_DECREF"],
    "extra_link_args": [_SANITIZERS],
}


class BuildError(SystemExit):
    """A build step that cannot run here: one message saying what is missing and what to do."""

    def __init__(self, message: str):
        super().__init__(f"etlab: {message}")


def _labext_sources() -> list[Path]:
    found = [LABEXT_SRC / n for n in ("package.json", "package-lock.json", "tsconfig.json")]
    found += sorted((LABEXT_SRC / "src").glob("*.ts")) + sorted((LABEXT_SRC / "style").glob("*"))
    # the views' formatters and element builders, bundled into the extension too (labextension/src/render.ts)
    found += [Path("etlab/visualizer/static") / n for n in ("format.js", "elements.js")]
    return [p for p in found if p.is_file()]


def labextension_is_current() -> bool:
    """The built extension exists and is not older than any of its sources (the Makefile's rule);
    without sources (an installed tree) whatever was built is what there is."""
    built = HERE / LABEXT_OUT / "package.json"
    sources = [HERE / p for p in _labext_sources()]
    return built.is_file() and all(p.stat().st_mtime <= built.stat().st_mtime for p in sources)


class BuildLabextension(Command):
    """npm ci, tsc and JupyterLab's builder: labextension/ -> etlab/jupyter/labextension (+ install.json)."""

    description = "build the JupyterLab extension when it is missing or older than its sources"
    user_options: ClassVar[list] = []

    def initialize_options(self):
        pass

    def finalize_options(self):
        pass

    def run(self):
        if labextension_is_current():
            return
        if not (HERE / LABEXT_SRC / "package.json").is_file():
            raise BuildError(f"the JupyterLab extension is not built ({LABEXT_OUT} is missing) and its sources "
                             f"({LABEXT_SRC}/) are not here to build it from")
        npm, node = shutil.which("npm"), shutil.which("node")
        if not npm or not node:
            raise BuildError("building the JupyterLab extension needs node and npm (Debian: apt-get install nodejs "
                             "npm); or build it first with `make labextension`")
        try:
            import jupyterlab
        except ImportError:
            raise BuildError("building the JupyterLab extension needs jupyterlab>=4.2,<5 in the build environment "
                             "(a build requirement: an isolated build installs it; with --no-build-isolation, "
                             "install it first)") from None
        core = Path(jupyterlab.__file__).parent / "staging"
        src = HERE / LABEXT_SRC
        print(f"etlab: building the JupyterLab extension from {LABEXT_SRC}/ (npm ci, tsc, jupyterlab builder)",
              file=sys.stderr)
        builder = "node_modules/@jupyterlab/builder/lib/build-labextension.js"
        steps = [[npm, "ci", "--no-audit", "--no-fund"], ["npx", "tsc"], [node, builder, "--core-path", str(core), "."]]
        for cmd in steps:
            if subprocess.run(cmd, cwd=src).returncode != 0:
                raise BuildError(f"building the JupyterLab extension failed at `{' '.join(cmd)}` (in {src})")
        shutil.copyfile(src / "install.json", HERE / LABEXT_OUT / "install.json")  # the builder empties its output
        os.utime(HERE / LABEXT_OUT / "package.json")


def data_files() -> list[tuple[str, list[str]]]:
    """Where pip installs the built extension and the config enabling the server extension: where
    JupyterLab and jupyter_server look for them. Listed after the extension is built (its static
    file names carry content hashes)."""
    share = "share/jupyter/labextensions/etlab-labextension"
    static = sorted(str(p) for p in (LABEXT_OUT / "static").glob("*") if p.is_file())
    return [(share, [str(LABEXT_OUT / "package.json"), str(LABEXT_SRC / "install.json")]),
            (f"{share}/static", static),
            ("etc/jupyter/jupyter_server_config.d", ["etlab/jupyter/config/etlab.json"])]


class BuildPy(build_py):
    """build_py after the JupyterLab extension is built, with the package's and the wheel's lists of
    data files taken from what the build wrote."""

    def run(self):
        self.run_command("build_labextension")
        self.__dict__.pop("data_files", None)  # build_py's package data: listed again, now with the extension
        self.distribution.data_files = data_files()
        super().run()


class Sdist(sdist):
    """An sdist carries the built extension (MANIFEST.in), so a wheel built from it needs no node."""

    def run(self):
        self.run_command("build_labextension")
        super().run()


def _no_torch(reason: str):
    from setuptools.command.build_ext import build_ext

    class NoTorch(build_ext):
        """build_ext without torch: stop, saying why, instead of a package without its core."""

        def run(self):
            raise BuildError(
                f"cannot build the native runtime core: torch is not importable in the build environment ({reason}). "
                "An isolated build installs torch==2.13.0 (a build requirement); with --no-build-isolation install "
                "torch==2.13.0, setuptools, pybind11 and ninja first (as `make setup` does), or set "
                "ETLAB_NO_NATIVE=1 to leave the core out")

    return NoTorch


cmdclass = {"build_labextension": BuildLabextension, "build_py": BuildPy, "sdist": Sdist}
ext_modules = []
if os.environ.get("ETLAB_NO_NATIVE") == "1":
    print("etlab: ETLAB_NO_NATIVE=1: not building the native runtime core", file=sys.stderr)
else:
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError as e:
        ext_modules = [Extension(NATIVE, NATIVE_SOURCES)]  # listed for the sdist; building it stops with why
        cmdclass["build_ext"] = _no_torch(str(e))
    else:
        ext_modules = [CppExtension(
            NATIVE, NATIVE_SOURCES,
            **(_SANITIZE if os.environ.get("ETLAB_SANITIZE") == "1" else {"extra_compile_args": ["-O2", "-g0"]}),
        )]
        cmdclass["build_ext"] = BuildExtension.with_options(use_ninja=True)

setup(ext_modules=ext_modules, cmdclass=cmdclass, data_files=data_files())
