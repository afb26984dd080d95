"""Builds etlab's one compiled part, the native runtime core (`etlab.runtime._native._core`).

Everything else is in pyproject.toml. The extension compiles against the installed torch (its
headers, its bundled pybind11, its libraries), so it is built without build isolation:
`pip install --no-build-isolation -e .` (the Makefile does this after installing torch,
setuptools, pybind11 and ninja). Set ETLAB_NO_NATIVE=1 to skip it; the runtime then runs its
Python core and says so.

ETLAB_SANITIZE=1 builds it for `make sanitize` instead: AddressSanitizer and UndefinedBehaviorSanitizer,
assertions on (no NDEBUG) and pybind11's check that every reference-count change holds the GIL
(tests/runtime/sanitize.py builds it into its own directory and runs the runtime tests on it).
"""

import os
import sys

from setuptools import setup

_SANITIZERS = "-fsanitize=address,undefined"
_SANITIZE = {
    "extra_compile_args": ["-O1", "-g", _SANITIZERS, "-fno-sanitize=vptr", "-fno-omit-frame-pointer", "-UNDEBUG",
                           "-DPYBIND11_ASSERT_GIL_HELD_INCREF_DECREF"],
    "extra_link_args": [_SANITIZERS],
}

ext_modules, cmdclass = [], {}
try:
    if os.environ.get("ETLAB_NO_NATIVE") == "1":
        raise ImportError("ETLAB_NO_NATIVE=1")
    from torch.utils.cpp_extension import BuildExtension, CppExtension
except ImportError as e:  # e.g. an isolated build, which has no torch: Python core only
    print(f"etlab: not building the native runtime core ({e}); use pip install --no-build-isolation",
          file=sys.stderr)
else:
    ext_modules = [CppExtension(
        "etlab.runtime._native._core",
        ["etlab/runtime/_native/core.cpp", "etlab/runtime/_native/trace.cpp", "etlab/runtime/_native/module.cpp",
         "etlab/runtime/_native/quant.cpp", "etlab/runtime/_native/quant_choose.cpp"],
        **(_SANITIZE if os.environ.get("ETLAB_SANITIZE") == "1" else {"extra_compile_args": ["-O2", "-g0"]}),
    )]
    cmdclass = {"build_ext": BuildExtension.with_options(use_ninja=True)}

setup(ext_modules=ext_modules, cmdclass=cmdclass)
