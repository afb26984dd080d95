"""Inspector.compare / `etlab compare` on upstream-made files: upstream ExecuTorch's float portable
build of a zoo model against its XNNPACKQuantizer-quantized portable build (et_ref.py export
[--quantize]), each with upstream's ETRecord (read by etlab.etrecord, without pickle) and upstream's
ETDump with intermediate outputs. The two graphs' debug handles differ: rows re-join by module + op.
And the float build against upstream's quantized XNNPACK-delegated CNN, run by etlab's host runtime
(whose XNNPACK backend logs each delegated node under its handle)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from etlab.facts.quant import op_kind, qdq_kind
from etlab.facts.source import module_path
from etlab.inspector import Inspector
from tests.interop.conftest import ET_REF, ITERS, REPO, SETUP_SH, ZOO, cache_key, cached_build, run_ref

pytestmark = pytest.mark.interop

MODELS = ("mlp", "cnn")
SIDES = ("float", "int8")
RECIPE = f"compare-quantized v3 iters={ITERS} dbg={16 << 20} models={','.join(MODELS)} xnnpack=cnn"


def _build(ref_python: str, root: Path) -> None:
    run_ref(ref_python, ET_REF, "export", f"{ZOO}:make_cnn", "--out", root / "cnn" / "int8-xnnpack", "--quantize",
            "--xnnpack")
    for m in MODELS:
        d = root / m / "int8"
        run_ref(ref_python, ET_REF, "export", f"{ZOO}:make_{m}", "--out", d, "--quantize")
        run_ref(ref_python, ET_REF, "run", d / "model.pte", "--inputs", d / "inputs.pt", "--etdump",
                d / "run.etdp", "--debug-buffer", d / "run.bin", "--debug-buffer-size", str(16 << 20),
                "--iters", str(ITERS))


@pytest.fixture(scope="module")
def upstream_builds(ref_python, upstream_artifacts, tmp_path_factory) -> Path:
    """<model>/float/: the shared upstream artifacts (model.pte, model.etrecord, run.etdp, run.bin, ...);
    <model>/int8/: the same export quantized (model.pte, model.etrecord, inputs.pt, run.etdp, run.bin);
    cnn/int8-xnnpack/: quantized and XNNPACK-delegated (model.pte, model.etrecord, inputs.pt; not run).
    Upstream-made; the quantized builds cached under their own key, the folders linked side by side."""
    built = cached_build("compare_quantized", cache_key((ZOO, ET_REF, SETUP_SH), RECIPE),
                         lambda tmp: _build(ref_python, tmp))
    root = tmp_path_factory.mktemp("upstream_builds")
    for m in MODELS:
        (root / m).mkdir()
        (root / m / "float").symlink_to(upstream_artifacts[m], target_is_directory=True)
        for side in ("int8", "int8-xnnpack"):
            if (built / m / side).is_dir():
                (root / m / side).symlink_to(built / m / side, target_is_directory=True)
    return root


def _inspector(d: Path) -> Inspector:
    return Inspector(etdump_path=d / "run.etdp", debug_buffer_path=d / "run.bin", etrecord=d / "model.etrecord")


@pytest.mark.parametrize("model", MODELS)
def test_upstream_float_vs_xnnpack_quantized_portable_builds_pair_by_module_and_op(model, upstream_builds):
    fl, q8 = (_inspector(upstream_builds / model / side) for side in SIDES)
    c = fl.compare(q8, name_a="upstream float", name_b="upstream int8")
    assert c.by == "module+op" and c.rows
    ops_a = fl.program_info.methods["forward"].ops
    ops_b = q8.program_info.methods["forward"].ops
    weighted = {h for h, ops in ops_a.items() if op_kind(ops[-1].op_type) in ("aten.convolution", "aten.addmm")}
    assert len(weighted) == {"mlp": 3, "cnn": 17}[model]
    for h in weighted:
        (row,) = [r for r in c.rows if h in r.handles_a]
        assert row.present == "both" and row.join == "module+op", (row.key, row.present)
        assert row.module == module_path(ops_a[h][-1].module_hierarchy)
        b_kinds = [op_kind(o.op_type) for hb in row.handles_b for o in ops_b[hb]]
        assert op_kind(ops_a[h][-1].op_type) in b_kinds and any(qdq_kind(k) for k in b_kinds), row.key
        assert row.runs_a == row.runs_b == ITERS and row.latency_b > 0
    # no q/dq row of its own; every row of both builds found its counterpart
    assert not [r.key for r in c.rows if all(qdq_kind(o) for o in r.ops)]
    assert c.summary.matched_pct == 100.0, [(r.key, r.present) for r in c.rows if r.present != "both"]
    # every pair compared its output (the quantized side's codes dequantized), an int8-sized difference
    assert c.summary.compared_outputs == len(c.rows), [(r.key, r.numeric_note) for r in c.rows if r.numeric_note]
    assert all(15 < r.sqnr < 70 for r in c.rows), [(r.key, r.sqnr) for r in c.rows]
    assert c.summary.biggest_numeric and c.summary.biggest_latency


def test_cli_on_upstream_float_and_quantized_folders(upstream_builds, tmp_path):
    """The folders hold upstream's .etrecord: `etlab compare` picks them up in a fresh process (quantized
    ops resolved) and prints how each row joined."""
    a, b = (upstream_builds / "cnn" / side for side in SIDES)
    out = subprocess.run([sys.executable, "-m", "etlab.cli", "compare", str(a), str(b), "--json",
                          str(tmp_path / "c.json")], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())  # the summary and notes wrap to the terminal
    assert "warning" not in out.stderr and "joined by module+op" in text and "folded in" in text
    data = json.loads((tmp_path / "c.json").read_text())
    assert data["by"] == "module+op" and {r["join"] for r in data["rows"]} == {"module+op"}


def test_float_portable_vs_quantized_xnnpack_delegated_on_the_host_runtime(upstream_builds, tmp_path):
    from etlab.runtime import DebugLevel, Runtime

    d = upstream_builds / "cnn" / "int8-xnnpack"
    program = Runtime.get().load_program(d / "model.pte", enable_etdump=True,
                                         etdump_debug_level=DebugLevel.INTERMEDIATE_OUTPUTS)
    method = program.load_method("forward")
    for _ in range(ITERS):
        method.execute(list(torch.load(d / "inputs.pt", weights_only=True)))
    program.write_etdump_result_to_file(tmp_path / "run.etdp", tmp_path / "run.bin")
    fl = _inspector(upstream_builds / "cnn" / "float")
    xq = Inspector(etdump_path=tmp_path / "run.etdp", debug_buffer_path=tmp_path / "run.bin",
                   etrecord=d / "model.etrecord")
    c = fl.compare(xq, name_a="float portable", name_b="int8 XNNPACK")
    assert c.by == "module+op"
    # every op of the float build pairs with the delegated node(s) standing for it
    assert c.summary.only_a == 0 and all(r.join == "module+op" for r in c.rows if r.present == "both")
    assert all(r.backend_b == "XnnpackBackend" for r in c.rows if r.present == "both" and "conv" in r.key)
    # the float linear (addmm) and XNNPACK's aten.linear pair by order in their module
    (fc,) = [r for r in c.rows if r.module == "classifier.1"]
    assert "paired by order" in fc.join_note and fc.present == "both"
    # what stays on B's side: XNNPACK's own operators (no debug handle) and its weights' time
    assert all(not r.handles_b or all(qdq_kind(o) for o in r.ops) for r in c.only_in_b), \
        [(r.key, r.ops) for r in c.only_in_b]
    assert c.summary.compared_outputs == c.summary.matched and all(15 < r.sqnr < 70 for r in c.rows if r.sqnr)
