"""The LLM entries of the corpus: `llama_static_kv` (`_llama_static_kv.LlamaStaticKV`), a Llama-style
decoder whose KV cache is mutable buffers, with prefill and decode methods.

The entry's example inputs decode right after the prompt (position PROMPT_TOKENS), as a generation
does: eager decode attends to the cache prefill wrote, so the compiled program matches eager only
when its methods share that cache: the entry is tagged SHARED_STATE, and whoever compiles the corpus
compiles it with `MemoryPlanningPass(share_mutable_buffers=True)`.
"""

from __future__ import annotations

import torch

from etlab.models.corpus._entry import Built, CorpusEntry
from etlab.models.corpus._llama_static_kv import LlamaStaticKV, generate

__all__ = ["LLM_ENTRIES", "PROMPT_TOKENS", "SHARED_STATE", "LlamaStaticKV", "generate"]

PROMPT_TOKENS = 8
SHARED_STATE = "shared_mutable_buffers"  # tag: compile with MemoryPlanningPass(share_mutable_buffers=True)


def _llama_static_kv() -> Built:
    module = LlamaStaticKV().eval()
    prompt = torch.randint(0, 96, (1, PROMPT_TOKENS))
    return module, {"prefill": (prompt, torch.arange(PROMPT_TOKENS)),
                    "decode": (torch.randint(0, 96, (1, 1)), torch.tensor([PROMPT_TOKENS]))}  # after the prompt


LLM_ENTRIES = [
    CorpusEntry("llama_static_kv", "torch.nn", "Llama-style decoder with its KV cache in mutable buffers (static "
                "cache written at input_pos), prefill and decode methods", _llama_static_kv,
                tags=frozenset({"llm", SHARED_STATE})),
]
