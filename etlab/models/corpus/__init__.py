"""A corpus of model architectures for compile/run/inspect coverage: torch.nn models,
HuggingFace `transformers` models built from small configs, and the models users bring from
torchvision, timm and torchaudio (random weights, no downloads).

`CORPUS` maps a name to a `CorpusEntry` (factory, example inputs per method, dynamic shapes,
tolerance). The transformers entries need the optional extra `corpus` (`pip install etlab[corpus]`); the
torchvision/timm/torchaudio ones the libraries the Makefile installs beside it (`_library_imports`).
"""

from etlab.models.corpus._entry import (
    CorpusEntry,
    MethodAsForward,
    flat_tensors,
    max_abs_error,
    within_tolerance,
)
from etlab.models.corpus._hf_models import HF_ENTRIES
from etlab.models.corpus._library_models import LIBRARY_ENTRIES
from etlab.models.corpus._llm_models import LLM_ENTRIES, SHARED_STATE, LlamaStaticKV
from etlab.models.corpus._nn_models import NN_ENTRIES

CORPUS: dict[str, CorpusEntry] = {e.name: e for e in [*NN_ENTRIES, *HF_ENTRIES, *LLM_ENTRIES, *LIBRARY_ENTRIES]}

__all__ = ["CORPUS", "SHARED_STATE", "CorpusEntry", "LlamaStaticKV", "MethodAsForward", "flat_tensors",
           "max_abs_error", "within_tolerance"]
