"""Quantized programs across etlab and upstream ExecuTorch 1.5.1, both directions.

- upstream's quantized programs (its XNNPACKQuantizer, lowered without delegation: portable plus
  quantized_decomposed kernels) run on etlab's runtime and match upstream's runtime and the
  converted model in torch eager within one quantization step of the output (bit-exact today);
- etlab's quantized programs (EtlabQuantizer, static and dynamic) run on upstream's runtime
  (`executorch.kernels.quantized` linked) and match etlab's runtime the same way.

Upstream's exports are cached by content hash like the other interop artifacts; etlab's programs
are compiled once per session and run by upstream in one process (tests/interop/ref_quant.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from etlab.runtime import Runtime
from tests.compiler._quant import assert_within_one_step, quantized_zoo
from tests.interop.conftest import SETUP_SH, ZOO, cache_key, cached_build, run_ref
from tests.runtime import _cores

pytestmark = [pytest.mark.interop, pytest.mark.xdist_group("quant_interop")]

runtime_core = _cores.runtime_core  # autouse: every test here runs on both runtime cores
HERE = Path(__file__).resolve().parent
REF_QUANT = HERE / "ref_quant.py"
REF_EXPORT = HERE / "ref_export_runtime.py"  # ref_quant.py imports its loaders
MODELS = ("mlp", "cnn", "transformer")
ETLAB_PROGRAMS = (("mlp", "static"), ("cnn", "static"), ("transformer", "static"), ("mlp", "dynamic"))
RECIPE = f"quant v1 models={','.join(MODELS)}"


@pytest.fixture(scope="session")
def upstream_quantized(ref_python) -> Path:
    """Upstream's quantized exports of the zoo models (cached by content hash, built once under a lock)."""
    return cached_build("quant", cache_key((ZOO, REF_QUANT, REF_EXPORT, SETUP_SH), RECIPE), lambda tmp: run_ref(
        ref_python, REF_QUANT, "export", ZOO, *MODELS, "--out", tmp, timeout=1200))


@pytest.fixture(scope="session")
def etlab_on_upstream(ref_python, tmp_path_factory) -> dict[str, Path]:
    """etlab's quantized programs, each run once by upstream's runtime: {"mlp-static": dir, ...}."""
    root = tmp_path_factory.mktemp("quant_on_upstream")
    dirs = {}
    for name, mode in ETLAB_PROGRAMS:
        _, inputs, _, pte, _ = quantized_zoo(name, mode)
        d = root / f"{name}-{mode}"
        d.mkdir()
        (d / "model.pte").write_bytes(pte)
        torch.save(list(inputs), d / "inputs.pt")
        dirs[f"{name}-{mode}"] = d
    run_ref(ref_python, REF_QUANT, "run", root, timeout=600)
    return dirs


def _load(path: Path) -> list:
    return torch.load(path, weights_only=True)


@pytest.mark.parametrize("model", MODELS)
def test_upstream_quantized_program_runs_on_etlab(model, upstream_quantized):
    d = upstream_quantized / model
    steps = json.loads((d / "info.json").read_text())["out_scales"]
    assert all(s is not None for s in steps)  # outputs dequantized from int8: the tolerance is one step
    method = Runtime.get().load_program(d / "model.pte").load_method("forward")
    outputs = method.execute(_load(d / "inputs.pt"))
    assert_within_one_step(outputs, _load(d / "upstream_outputs.pt"), steps)
    assert_within_one_step(outputs, _load(d / "eager_outputs.pt"), steps)


@pytest.mark.parametrize("program", [f"{n}-{m}" for n, m in ETLAB_PROGRAMS])
def test_etlab_quantized_program_runs_on_upstream(program, etlab_on_upstream):
    name, mode = program.split("-")
    _, inputs, eager, pte, steps = quantized_zoo(name, mode)
    upstream = _load(etlab_on_upstream[program] / "upstream_outputs.pt")
    ours = Runtime.get().load_program(pte).load_method("forward").execute(list(inputs))
    assert_within_one_step(upstream, ours, steps)
    assert_within_one_step(upstream, eager, steps)
