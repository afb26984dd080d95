"""The model corpus (issue 15): its contents, and every entry compiled by etlab and run against eager.

The per-entry compile test runs the whole corpus only with ETLAB_CORPUS_FULL=1 (`make corpus`);
`make test` runs it on the fast subset that bench/corpus.py also checks against upstream.
"""

from __future__ import annotations

import os

import pytest
import torch

from etlab.compiler import ExecutorchBackendConfig, MemoryPlanningPass, to_edge
from etlab.models.corpus import CORPUS, SHARED_STATE, flat_tensors, within_tolerance
from etlab.runtime import Runtime
from tests.corpus.conftest import load_bench_corpus

FAST = load_bench_corpus().FAST

pytestmark = pytest.mark.corpus
FULL = os.environ.get("ETLAB_CORPUS_FULL") == "1"

# What the issue asks the corpus to cover, by entry name.
REQUIRED = {
    "bert", "distilbert", "gpt2", "llama_kv", "qwen2", "mistral", "t5_encoder", "vit", "whisper_encoder", "wav2vec2",
    "mobilevit", "convnext", "segformer", "lstm", "lstm_bidir_2layer", "gru", "gru_bidir_2layer", "unet",
    "efficientnet", "mobilenet_v3", "shufflenet_v2", "dilated_tcn", "detection_neck", "ds_cnn_audio",
    "recommendation_tower", "conformer_block", "sdpa_attention", "cond", "dynamic_encoder",
}


def test_corpus_has_forty_architectures_covering_the_issue():
    assert len(CORPUS) >= 40
    assert REQUIRED <= set(CORPUS), REQUIRED - set(CORPUS)
    assert set(FAST) <= set(CORPUS)
    assert {e.source for e in CORPUS.values()} == {"torch.nn", "transformers", "torchvision", "timm", "torchaudio"}
    assert any(e.dynamic_shapes for e in CORPUS.values())
    assert set(CORPUS["llama_kv"].build()[1]) == {"prefill", "decode"}
    assert set(CORPUS["llama_static_kv"].build()[1]) == {"prefill", "decode"}  # its KV cache: mutable buffers


def test_entries_are_seeded():
    """Two builds of an entry have the same weights and inputs (upstream compiles its own copy)."""
    for name in ("mobilenet_v3", "gpt2"):
        (m1, in1), (m2, in2) = CORPUS[name].build(), CORPUS[name].build()
        for (k, a), (_, b) in zip(m1.state_dict().items(), m2.state_dict().items()):
            assert torch.equal(a, b), (name, k)
        assert all(torch.equal(a, b) for a, b in zip(in1["forward"], in2["forward"]))


@pytest.mark.parametrize("name", sorted(CORPUS) if FULL else sorted(FAST))
def test_entry_compiles_and_matches_eager(name):
    entry = CORPUS[name]
    built = entry.build()
    eager = entry.eager(built)
    shared = ExecutorchBackendConfig(memory_planning_pass=MemoryPlanningPass(share_mutable_buffers=True))
    et = to_edge(entry.export(built)).to_executorch(shared if SHARED_STATE in entry.tags else None)
    program = Runtime.get().load_program(et.buffer)
    for method, inputs in built[1].items():  # in order, from one program: state carries over
        got = flat_tensors(program.load_method(method).execute(list(inputs)))
        assert len(got) == len(eager[method])
        for g, w in zip(got, eager[method]):
            assert within_tolerance(g, w, entry.atol, entry.rtol), (method, (g - w).abs().max())


def test_dynamic_entry_runs_at_other_sizes():
    """A dynamic-shape entry's program accepts sizes other than the example's."""
    entry = CORPUS["dynamic_encoder"]
    module, _ = built = entry.build()
    program = Runtime.get().load_program(to_edge(entry.export(built)).to_executorch().buffer)
    for shape in ((1, 2), (5, 31)):
        tokens = torch.randint(0, 50, shape)
        got = program.load_method("forward").execute([tokens])[0]
        with torch.no_grad():
            torch.testing.assert_close(got, module(tokens), atol=1e-4, rtol=1e-4)
