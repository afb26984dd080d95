"""The corpus's models from torchvision, timm and torchaudio (issue 28): what it holds, how the libraries
are imported with the project's CPU torch, and a small model of each library compiled and run.
The whole set compiles under `make corpus` (ETLAB_CORPUS_FULL=1, tests/corpus/test_corpus.py)."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

from etlab.compiler import to_edge
from etlab.models.corpus import CORPUS, flat_tensors, within_tolerance
from etlab.runtime import Runtime

pytestmark = pytest.mark.corpus
_HAVE_LIBS = all(importlib.util.find_spec(n) is not None for n in ("torchvision", "timm", "torchaudio"))
needs_libs = pytest.mark.skipif(not _HAVE_LIBS, reason="the corpus libraries are installed by `make setup`")


def _by(source: str) -> list:
    return [e for e in CORPUS.values() if e.source == source]


def test_library_entries_cover_the_issue():
    timm = _by("timm")
    assert len(timm) >= 20
    assert {f for e in timm for f in e.tags} >= {"conv", "attention", "hybrid"}
    assert all(sum(f in e.tags for e in timm) >= 5 for f in ("conv", "attention", "hybrid"))
    tv = {e.name for e in _by("torchvision")}
    assert {"tv_convnext_tiny", "tv_regnet_y_400mf", "tv_swin_t", "tv_fcn_resnet50", "tv_lraspp_mobilenet"} <= tv
    assert {"ta_wavernn", "ta_deepspeech", "ta_wav2vec2"} <= {e.name for e in _by("torchaudio")}
    assert len(CORPUS) >= 100


@needs_libs
def test_torchvision_imports_with_only_its_python_operators_declared():
    """The CUDA wheel's `_C` does not load: nms/qnms get their schemas (no kernel), models import."""
    from etlab.models.corpus._library_imports import import_torchvision

    tv = import_torchvision()
    assert hasattr(tv.models, "resnet18") and hasattr(tv.models.segmentation, "fcn_resnet50")
    assert torch.ops.torchvision.nms.default._schema.name == "torchvision::nms"


@needs_libs
def test_torchaudio_models_import_without_the_extension():
    from etlab.models.corpus._library_imports import import_torchaudio_models

    models = import_torchaudio_models()
    assert models.WaveRNN and models.DeepSpeech
    assert "torchaudio._extension" not in sys.modules or sys.modules["torchaudio"].__file__ is not None


@needs_libs
@pytest.mark.parametrize("name", ["tv_squeezenet", "timm_lcnet_050", "ta_wav2letter"])
def test_a_model_of_each_library_compiles_and_matches_eager(name):
    entry = CORPUS[name]
    built = entry.build()
    eager = entry.eager(built)
    program = Runtime.get().load_program(to_edge(entry.export(built)).to_executorch().buffer)
    got = flat_tensors(program.load_method("forward").execute(list(built[1]["forward"])))
    assert len(got) == len(eager["forward"])
    for g, w in zip(got, eager["forward"]):
        assert within_tolerance(g, w, entry.atol, entry.rtol), (g - w).abs().max()
