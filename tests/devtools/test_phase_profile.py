"""LLM-shaped profiling (issue 15 item 4): a prefill and a decode method profiled in one ETDump are
separate phases with per-token statistics, and the KV cache the program plans is counted."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from etlab.devtools import kv_cache_bytes, kv_cache_dataframe, profile, state_buffers
from etlab.inspector import block_methods, phase_of, phase_runs, phases
from etlab.models.corpus import CORPUS, LlamaStaticKV

PROMPT = 8
DECODE_STEPS = 5


def _model_and_inputs():
    built = CORPUS["llama_static_kv"].build()
    module, methods = built
    prompt, positions = methods["prefill"]
    token = methods["decode"][0]
    return module, {"prefill": (prompt, positions), "decode": lambda i: (token, torch.tensor([PROMPT + i]))}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    module, inputs = _model_and_inputs()
    return profile(module, inputs, iterations=2, decode_steps=DECODE_STEPS, debug=False, progress=False,
                   workdir=tmp_path_factory.mktemp("llm"))


def _execute_times(inspector) -> list[list[float]]:
    """Method::execute durations of each execution block, read straight from the events."""
    return [next(e.perf_data.raw for e in b.events if e.name == "Method::execute")
            for b in inspector.event_blocks if any(e.name == "Method::execute" for e in b.events)]


def test_prefill_and_decode_are_separate_phases_of_one_etdump(run):
    df = run.phases
    assert list(df["method"]) == ["prefill", "decode"] and list(df["phase"]) == ["prefill", "decode"]
    prefill, decode = df.iloc[0], df.iloc[1]
    assert (prefill["runs"], prefill["tokens_per_run"]) == (2, PROMPT)  # two generations
    assert (decode["runs"], decode["tokens_per_run"]) == (2 * DECODE_STEPS, 1)
    # every run of the ETDump is in exactly one phase, with the latency its Method::execute event has
    blocks = _execute_times(run.inspector)
    assert sum(len(b) for b in blocks) == 2 + 2 * DECODE_STEPS
    runs = df.attrs["runs"]
    assert sorted(runs["latency"]) == pytest.approx(sorted(x for b in blocks for x in b))
    assert set(block_methods(run.inspector, run.program)) == {None, "prefill", "decode"}


def test_per_token_statistics(run):
    df, runs = run.phases, run.phases.attrs["runs"]
    to_s = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[df.attrs["unit"]]
    for row in df.itertuples():
        lat = runs[runs["method"] == row.method]["latency"].to_numpy()
        per_token = lat / row.tokens_per_run
        assert (row.latency_p50, row.latency_p90, row.latency_p99) == pytest.approx(
            tuple(np.percentile(lat, [50, 90, 99])))
        assert (row.per_token_p50, row.per_token_p90, row.per_token_p99) == pytest.approx(
            tuple(np.percentile(per_token, [50, 90, 99])))
        assert row.per_token_p50 <= row.per_token_p90 <= row.per_token_p99
        assert row.tokens_per_s == pytest.approx(row.runs * row.tokens_per_run / (lat.sum() * to_s))
    prefill = df.iloc[0]
    assert prefill.per_token_p50 == pytest.approx(prefill.latency_p50 / PROMPT)  # latency per prompt token


def test_kv_cache_bytes_equal_the_cache_buffers(run):
    module = LlamaStaticKV()
    want = sum(b.numel() * b.element_size() for name, b in module.named_buffers() if name.endswith("_cache"))
    assert want == 2 * 2 * (1 * 2 * 32 * 8) * 4  # layers x (k, v) x (batch, kv heads, max seq, head dim) x fp32
    for method in ("prefill", "decode"):
        assert kv_cache_bytes(run.program, method) == want
        buffers = [b for b in state_buffers(run.program, method)]
        assert {b.buffer for b in buffers} == {f"module.layers.{i}.{kv}_cache" for i in (0, 1) for kv in "kv"}
        assert all(b.role == "kv_cache" and b.mem_id == 2 and b.offset is not None and b.shared for b in buffers)
    kv = kv_cache_dataframe(run.program)
    assert kv.attrs["kv_cache_bytes"] == {"decode": want, "prefill": want}
    assert kv.attrs["program_kv_cache_bytes"] == want  # one cache for both methods
    assert run.kv_cache.attrs["kv_cache_bytes"] == kv.attrs["kv_cache_bytes"]


def test_decode_steps_advance_their_position_and_match_eager(run):
    """The decode inputs were a callable of the step: the profiled decode method saw positions 8, 9, ...;
    its methods share the KV cache, so prefill then decode steps equal eager's generation."""
    module, inputs = _model_and_inputs()
    from etlab.runtime import Runtime

    program = Runtime.get().load_program(run.program.buffer)
    prefill, decode = program.load_method("prefill"), program.load_method("decode")
    with torch.no_grad():
        got, want = prefill.execute(list(inputs["prefill"]))[0], module.prefill(*inputs["prefill"])
        assert torch.allclose(got, want, atol=1e-5)
        for step in range(3):
            got = decode.execute(list(inputs["decode"](step)))[0]
            want = module.decode(*inputs["decode"](step))  # attends to the prompt prefill cached
            assert torch.allclose(got, want, atol=1e-5), step


def test_methods_can_be_named_and_wrong_names_are_refused(run):
    blocks = block_methods(run.inspector, run.program)
    exec_blocks = [m for m in blocks if m is not None]
    named = phase_runs(run.inspector, run.program, methods=list(exec_blocks))
    assert list(named["method"]) == list(run.phases.attrs["runs"]["method"])
    with pytest.raises(ValueError, match="not methods of the program"):
        phases(run.inspector, run.program, methods=["prefill", "generate"])
    with pytest.raises(ValueError, match="one method name per execution block"):
        phases(run.inspector, run.program, methods=["prefill"])
    with pytest.raises(ValueError, match="positive int"):
        phases(run.inspector, run.program, tokens={"decode": 0})
    tokens = phases(run.inspector, run.program, tokens={"prefill": 4})
    assert tokens.iloc[0]["tokens_per_run"] == 4


def test_phase_names():
    assert [phase_of(m) for m in ("prefill", "text_decoder_prefill", "decode", "decode_one", "forward")] == \
        ["prefill", "prefill", "decode", "decode", "forward"]


def test_a_program_file_attributes_blocks_too(run):
    """The .pte the profile wrote (no compile-time objects) gives the same phases."""
    from_file = phases(run.inspector, run.workdir / "model.pte")
    assert list(from_file["method"]) == list(run.phases["method"])
    assert from_file["latency_p50"].tolist() == pytest.approx(run.phases["latency_p50"].tolist())
    assert not any(math.isnan(x) for x in from_file["tokens_per_s"])
