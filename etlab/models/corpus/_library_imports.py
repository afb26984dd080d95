"""Importing torchvision's, timm's and torchaudio's model code with the project's CPU torch.

The torchvision and torchaudio wheels the package registry serves are CUDA builds. Their model
definitions are pure Python, but their compiled extensions do not load here:

- torchvision's `_C` fails to load quietly (it links CUDA libraries), and then its import fails at
  `torch.library.register_fake("torchvision::nms")` with `operator torchvision::nms does not exist`.
  `import_torchvision` declares the schemas of the two operators torchvision's Python registers fake
  kernels for (`nms`, `qnms`), exactly as its C++ extension would have declared them, and nothing
  more: they have no kernel, so detection models that call them (Faster R-CNN's box NMS) cannot run
  and are not in the corpus. Classification and segmentation models never call them.
- torchaudio's `__init__` loads `_torchaudio.so`, which needs `libc10_cuda.so`, and raises.
  `import_torchaudio_models` imports `torchaudio.models` (plain torch code: WaveRNN, Conformer,
  ConvTasNet, Wav2Letter, DeepSpeech, wav2vec 2.0) under a namespace package for the installed
  torchaudio folder, so the package `__init__` (the extension) is never run. Only the models are
  used; torchaudio's I/O and functional code need the extension and are not imported.

Both only run when a corpus factory is built; nothing in etlab itself imports these libraries.
"""

from __future__ import annotations

import functools
import glob
import importlib
import importlib.machinery
import importlib.util
import os
import sys
import types

import torch

# What torchvision's C++ extension declares for the operators its Python registers fake kernels for.
_TORCHVISION_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_LIBRARIES: list = []  # keeps the torch.library.Library objects (and so the declarations) alive


def _has_op(namespace: str, name: str) -> bool:
    try:
        getattr(getattr(torch.ops, namespace), name).default  # noqa: B018
        return True
    except (AttributeError, RuntimeError):
        return False


@functools.cache
def import_torchvision():
    """torchvision, imported with its operator schemas declared when its extension did not load."""
    if importlib.util.find_spec("torchvision") is None:
        raise ImportError("the corpus's torchvision models need torchvision (the `corpus` extra; see the Makefile)")
    missing = {n: s for n, s in _TORCHVISION_SCHEMAS.items() if not _has_op("torchvision", n)}
    if missing and not _torchvision_extension_loads():
        lib = torch.library.Library("torchvision", "FRAGMENT")
        for schema in missing.values():
            lib.define(schema)
        _LIBRARIES.append(lib)
    return importlib.import_module("torchvision")


def _torchvision_extension_loads() -> bool:
    """Whether torchvision's own `_C` loads (a CPU build matching torch): then it declares the ops itself."""
    spec = importlib.util.find_spec("torchvision")
    for path in glob.glob(os.path.join(os.path.dirname(spec.origin), "_C*.so")):
        try:
            torch.ops.load_library(path)
            return True
        except (OSError, RuntimeError):
            return False
    return False


@functools.cache
def import_torchaudio_models():
    """torchaudio.models; without running torchaudio's `__init__` when its extension does not load."""
    try:
        return importlib.import_module("torchaudio.models")
    except OSError:  # the extension: a CUDA build
        pass
    spec = importlib.util.find_spec("torchaudio")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the corpus's torchaudio models need torchaudio (the `corpus` extra)")
    for name in [n for n in sys.modules if n == "torchaudio" or n.startswith("torchaudio.")]:
        del sys.modules[name]  # what the failed import left half made
    package = types.ModuleType("torchaudio")
    package.__path__ = list(spec.submodule_search_locations)
    package.__spec__ = importlib.machinery.ModuleSpec("torchaudio", None, is_package=True)
    package.__spec__.submodule_search_locations = package.__path__
    package.__doc__ = "torchaudio's folder as a namespace package (etlab corpus: its extension does not load)"
    sys.modules["torchaudio"] = package
    return importlib.import_module("torchaudio.models")


def timm():
    """timm (pure Python; needs torchvision, imported first the same way)."""
    import_torchvision()
    return importlib.import_module("timm")
