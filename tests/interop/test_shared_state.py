"""Shared mutable buffers across upstream ExecuTorch 1.5.1 and etlab, both ways.

Two programs whose methods share state (a write/read pair, and llama_static_kv's prefill/decode
with its KV cache), compiled by each side with `MemoryPlanningPass(share_mutable_buffers=True)`
and `emit_mutable_buffer_names=True`:

- the shared region of etlab's program is upstream's, field for field (memory id 2's size in every
  method, each buffer's name, offset, dtype, shape);
- upstream's program runs on etlab (both cores) with upstream's outputs, and etlab's on upstream's
  runtime with etlab's; both equal eager, so decode reads the cache prefill wrote.

Upstream's side (ref_shared_state.py) is cached by content hash like the other interop artifacts;
etlab's program runs on upstream in one reference process per session.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from etlab.compiler import ExecutorchBackendConfig, MemoryPlanningPass, to_edge
from etlab.models.corpus import MethodAsForward
from etlab.models.corpus import _llama_static_kv as llama
from etlab.runtime import Runtime
from etlab.schema import load_pte
from tests.interop.conftest import SETUP_SH, cache_key, cached_build, run_ref
from tests.runtime import _cores
from tests.runtime import _stateful_models as stateful

pytestmark = [pytest.mark.interop, pytest.mark.xdist_group("shared_state_interop")]

runtime_core = _cores.runtime_core  # autouse: every test runs on both runtime cores
HERE = Path(__file__).resolve().parent
REF_SCRIPT = HERE / "ref_shared_state.py"
MODEL_FILES = {"write_read": Path(stateful.__file__), "llama": Path(llama.__file__)}
FACTORIES = {"write_read": "WriteThenRead", "llama": "LlamaStaticKV"}
RECIPE = "shared-state v1"
PROMPT, DECODE_STEPS = 8, 5
TOL = {"rtol": 1e-5, "atol": 1e-5}


def _case(name: str):
    """(module, examples per method in program order, calls) — deterministic, so both sides agree."""
    if name == "write_read":
        torch.manual_seed(0)
        examples, calls = stateful.write_then_read_calls()
        return stateful.WriteThenRead().eval(), examples, calls
    prompt, tokens = _llama_generation()
    torch.manual_seed(0)
    module = llama.LlamaStaticKV().eval()  # the same weights, an empty cache
    calls = [("prefill", (prompt, torch.arange(PROMPT)))]
    calls += [("decode", (torch.tensor([[t]]), torch.tensor([PROMPT + i]))) for i, t in enumerate(tokens[:-1])]
    return module, {"prefill": calls[0][1], "decode": calls[1][1]}, calls


def _llama_generation() -> tuple[torch.Tensor, list[int]]:
    """The prompt and eager greedy generation (its first token from prefill): decode is fed these."""
    torch.manual_seed(0)
    module = llama.LlamaStaticKV().eval()
    prompt = torch.randint(0, 96, (1, PROMPT))
    return prompt, llama.generate(module, prompt, DECODE_STEPS)


def _eager(name: str) -> list[list[torch.Tensor]]:
    module, _, calls = _case(name)
    with torch.no_grad():
        return [[getattr(module, m)(*ins)] for m, ins in calls]


def _write_inputs(name: str, d: Path) -> None:
    module, examples, calls = _case(name)
    torch.save(module.state_dict(), d / "state.pt")
    torch.save({m: list(ins) for m, ins in examples.items()}, d / "examples.pt")
    torch.save([[m, list(ins)] for m, ins in calls], d / "calls.pt")


@pytest.fixture(scope="session")
def upstream_shared(ref_python) -> Path:
    """Per case: upstream's model.pte and its runtime's outputs for the calls (upstream_outputs.pt)."""

    def build(tmp: Path) -> None:
        jobs = []
        for name in MODEL_FILES:
            d = tmp / name
            d.mkdir()
            _write_inputs(name, d)
            jobs.append({"export": str(MODEL_FILES[name]), "factory": FACTORIES[name], "state": str(d / "state.pt"),
                         "examples": str(d / "examples.pt"), "pte": str(d / "model.pte")})
            jobs.append({"run": str(d / "model.pte"), "calls": str(d / "calls.pt"),
                         "outputs": str(d / "upstream_outputs.pt")})
        (tmp / "jobs.json").write_text(json.dumps(jobs))
        run_ref(ref_python, REF_SCRIPT, tmp / "jobs.json")

    key = cache_key((REF_SCRIPT, *MODEL_FILES.values(), Path(__file__), SETUP_SH), RECIPE)
    return cached_build("shared-state", key, build)


def _compile_here(name: str):
    module, examples, _ = _case(name)
    with torch.no_grad():
        eps = {m: torch.export.export(MethodAsForward(module, m), tuple(ins), strict=False)
               for m, ins in examples.items()}
    config = ExecutorchBackendConfig(memory_planning_pass=MemoryPlanningPass(share_mutable_buffers=True),
                                     emit_mutable_buffer_names=True)
    return to_edge(eps).to_executorch(config)


@pytest.fixture(scope="session")
def etlab_on_upstream(ref_python, upstream_shared, tmp_path_factory) -> Path:
    """etlab's programs, and upstream's runtime's outputs on them (one reference process)."""
    out = tmp_path_factory.mktemp("shared_state")
    jobs = []
    for name in MODEL_FILES:
        d = out / name
        d.mkdir()
        _compile_here(name).write_to_file(d / "model.pte")
        jobs.append({"run": str(d / "model.pte"), "calls": str(upstream_shared / name / "calls.pt"),
                     "outputs": str(d / "upstream_outputs.pt")})
    (out / "jobs.json").write_text(json.dumps(jobs))
    run_ref(ref_python, REF_SCRIPT, out / "jobs.json")
    return out


def _run_here(pte: Path, calls) -> list[list[torch.Tensor]]:
    program = Runtime.get().load_program(pte)
    methods: dict = {}
    return [methods.setdefault(m, program.load_method(m)).execute(list(ins)) for m, ins in calls]


def _close(got, want) -> None:
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        assert len(g) == len(w)
        for a, b in zip(g, w):
            torch.testing.assert_close(a, b, **TOL, msg=lambda m, k=k: f"call {k}: {m}")


def _shared_region(pte: Path) -> dict:
    """Per method: memory id 2's size and its tensors by name (offset, dtype, shape, initial data)."""
    out = {}
    for plan in load_pte(pte).program.execution_plan:
        assert len(plan.non_const_buffer_sizes) == 3, plan.name
        state = {}
        for v in plan.values:
            t = v.val
            info = getattr(t, "allocation_info", None)
            if info is not None and info.memory_id == 2:
                extra = t.extra_tensor_info
                state[extra.fully_qualified_name] = (info.memory_offset, int(t.scalar_type), list(t.sizes),
                                                     list(t.dim_order), t.data_buffer_idx, int(extra.location))
        out[plan.name] = (plan.non_const_buffer_sizes[2], state)
    return out


@pytest.mark.parametrize("name", list(MODEL_FILES))
def test_etlab_shared_region_is_upstreams(name, upstream_shared, etlab_on_upstream, runtime_core):
    if runtime_core != "native":
        pytest.skip("a compile-time check: once is enough")
    ours = _shared_region(etlab_on_upstream / name / "model.pte")
    theirs = _shared_region(upstream_shared / name / "model.pte")
    assert ours == theirs
    sizes = {size for size, _ in theirs.values()}
    assert len(sizes) == 1 and sizes.pop() > 0
    if name == "llama":
        names = {f"module.layers.{i}.{kv}_cache" for i in (0, 1) for kv in "kv"}
        assert all(set(state) == names for _, state in theirs.values())


@pytest.mark.parametrize("name", list(MODEL_FILES))
def test_upstream_shared_program_runs_here_as_upstream_and_eager(name, upstream_shared):
    d = upstream_shared / name
    calls = torch.load(d / "calls.pt", weights_only=True)
    got = _run_here(d / "model.pte", calls)
    _close(got, torch.load(d / "upstream_outputs.pt", weights_only=True))
    _close(got, _eager(name))
    if name == "llama":  # token for token: etlab running upstream's program generates eager's tokens
        assert [int(out[0].argmax(-1)) for out in got] == _llama_generation()[1]


@pytest.mark.parametrize("name", list(MODEL_FILES))
def test_etlab_shared_program_runs_on_upstream_as_here_and_eager(name, upstream_shared, etlab_on_upstream):
    d = etlab_on_upstream / name
    calls = torch.load(upstream_shared / name / "calls.pt", weights_only=True)
    upstream = torch.load(d / "upstream_outputs.pt", weights_only=True)
    _close(upstream, _run_here(d / "model.pte", calls))
    eager = _eager(name)
    _close(upstream, eager)
    if name == "llama":  # token for token: upstream's runtime on our program generates eager's tokens
        assert [int(out[0].argmax(-1)) for out in upstream] == _llama_generation()[1]
