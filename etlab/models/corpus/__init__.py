"""A corpus of model architectures for compile/run/inspect coverage: torch.nn models and
HuggingFace `transformers` models built from small configs (random weights, no downloads).

`CORPUS` maps a name to a `CorpusEntry` (factory, example inputs per method, dynamic shapes,
tolerance). The transformers entries need the optional extra `corpus` (`pip install etlab[corpus]`).
"""

from etlab.models.corpus._entry import (
    CorpusEntry,
    MethodAsForward,
    flat_tensors,
    max_abs_error,
    within_tolerance,
)
from etlab.models.corpus._hf_models import HF_ENTRIES
from etlab.models.corpus._llm_models import LLM_ENTRIES, SHARED_STATE, LlamaStaticKV
from etlab.models.corpus._nn_models import NN_ENTRIES

CORPUS: dict[str, CorpusEntry] = {e.name: e for e in [*NN_ENTRIES, *HF_ENTRIES, *LLM_ENTRIES]}

__all__ = ["CORPUS", "SHARED_STATE", "CorpusEntry", "LlamaStaticKV", "MethodAsForward", "flat_tensors",
           "max_abs_error", "within_tolerance"]
