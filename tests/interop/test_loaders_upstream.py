"""Upstream files must not be rejected: the hardened loaders read every file ExecuTorch 1.5.1 wrote.

A few fields are compared with upstream's own dump of the same file (``*.json`` from
ref_tools.py); full field-by-field agreement is the business of the round-trip interop tests.
Damaged copies of upstream files (real layouts, real sizes) must fail with FormatError only.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import random
from pathlib import Path

import pytest

from etlab import FormatError
from etlab.schema import (
    bundled_program,
    deserialize_bundled_program,
    deserialize_etdump,
    deserialize_ptd,
    deserialize_pte,
    etdump,
    load_file,
    load_pte,
)
from etlab.schema.flat_tensor import PtdFile
from etlab.schema.program import PteFile

from .conftest import EXTERNAL_MODEL, MODELS, external_ptd

pytestmark = pytest.mark.interop


def _dump(path: Path) -> dict:
    return json.loads(path.with_name(path.name + ".json").read_text())


def _sha(data) -> str:
    return hashlib.sha256(data).hexdigest()


def _assert_pte_like_upstream(pte: PteFile, dump: dict, file_size: int) -> None:
    hdr = dump["extended_header"]
    assert pte.header is not None
    assert (pte.header.program_size, pte.header.segment_base_offset, pte.header.segment_data_size) == (
        hdr["program_size"], hdr["segment_base_offset"], hdr["segment_data_size"])
    assert [(len(s), _sha(s)) for s in pte.segments] == [(s["nbytes"], s["sha256"]) for s in dump["segments"]]
    for s in pte.segments:
        assert isinstance(s, memoryview)
    plan, up_plan = pte.program.execution_plan[0], dump["program"]["execution_plan"][0]
    assert plan.name == up_plan["name"] == "forward"
    assert [(o.name, o.overload) for o in plan.operators] == [(o["name"], o["overload"]) for o in up_plan["operators"]]
    assert len(plan.values) == len(up_plan["values"]) > 0
    assert plan.inputs == up_plan["inputs"] and plan.outputs == up_plan["outputs"]
    assert len(plan.chains[0].instructions) == len(up_plan["chains"][0]["instructions"]) > 0
    assert pte.header.segment_base_offset + pte.header.segment_data_size <= file_size


@pytest.mark.parametrize("model", MODELS)
def test_upstream_pte_is_accepted(upstream_artifacts, model, monkeypatch):
    path = upstream_artifacts[model] / "model.pte"
    dump = _dump(path)
    from_disk = load_pte(path)
    _assert_pte_like_upstream(from_disk, dump, path.stat().st_size)
    # Segments are views of the bytes read, not copies (small files are read into memory once) ...
    assert len({id(s.obj) for s in from_disk.segments}) == 1
    # ... and of the file's mapping when the file is large.
    monkeypatch.setattr("etlab.schema._files.SMALL_FILE_BYTES", 0)
    assert all(isinstance(s.obj, mmap.mmap) for s in load_pte(path).segments)
    in_memory = deserialize_pte(path.read_bytes(), what=str(path))
    assert in_memory.program == from_disk.program
    offsets = in_memory.program.constant_segment.offsets
    assert offsets == dump["program"]["constant_segment"]["offsets"] and len(offsets) > 1


@pytest.mark.parametrize("model", MODELS)
def test_upstream_bpte_is_accepted(upstream_artifacts, model):
    path = upstream_artifacts[model] / "model.bpte"
    dump = _dump(path)["bundled_program"]
    bundled = load_file(path)
    assert isinstance(bundled, bundled_program.BundledProgram)
    assert [s.method_name for s in bundled.method_test_suites] == [s["method_name"] for s in dump["method_test_suites"]]
    for suite, up_suite in zip(bundled.method_test_suites, dump["method_test_suites"], strict=True):
        assert len(suite.test_cases) == len(up_suite["test_cases"]) == 2
        for case, up_case in zip(suite.test_cases, up_suite["test_cases"], strict=True):
            for ours, theirs in [*zip(case.inputs, up_case["inputs"], strict=True),
                                 *zip(case.expected_outputs, up_case["expected_outputs"], strict=True)]:
                assert type(ours.val).__name__ == theirs["val"]["_type"]
                if theirs["val"]["_type"] == "Tensor":
                    assert ours.val.sizes == theirs["val"]["sizes"]
                    assert _sha(ours.val.data) == theirs["val"]["data"]["sha256"]
    # The embedded program is a whole .pte, and as upstream as the file beside it.
    embedded = deserialize_pte(bundled.program, what=f"{path} (embedded program)")
    plan = embedded.program.execution_plan[0]
    assert plan.name == "forward" and plan.operators and embedded.segments
    assert deserialize_bundled_program(path.read_bytes()).method_test_suites == bundled.method_test_suites


@pytest.mark.parametrize("model", MODELS)
def test_upstream_etdp_is_accepted(upstream_artifacts, model):
    path = upstream_artifacts[model] / "run.etdp"
    dump = _dump(path)["etdump"]
    trace = load_file(path)
    assert isinstance(trace, etdump.ETDump)
    assert [r.name for r in trace.run_data] == [r["name"] for r in dump["run_data"]]
    debug_bytes = (upstream_artifacts[model] / "run.bin").stat().st_size
    n_debug = 0
    for run, up_run in zip(trace.run_data, dump["run_data"], strict=True):
        assert len(run.events or []) == len(up_run["events"] or [])
        for ev, up_ev in zip(run.events or [], up_run["events"] or [], strict=True):
            if up_ev["profile_event"]:
                prof = ev.profile_event
                assert (prof.name, prof.start_time, prof.end_time) == (
                    up_ev["profile_event"]["name"], up_ev["profile_event"]["start_time"],
                    up_ev["profile_event"]["end_time"])
            if up_ev["debug_event"] and up_ev["debug_event"]["debug_entry"]["tensor"]:
                tensor = ev.debug_event.debug_entry.tensor
                assert tensor.offset == up_ev["debug_event"]["debug_entry"]["tensor"]["offset"]
                assert tensor.offset < debug_bytes  # -1: an empty tensor, nothing written
                n_debug += 1
    assert n_debug > 0, "upstream recorded intermediate outputs (--debug-buffer); we must see them"
    assert deserialize_etdump(path.read_bytes()) == trace


def test_upstream_ptd_is_accepted(upstream_artifacts):
    model_dir = upstream_artifacts[EXTERNAL_MODEL]
    path = external_ptd(model_dir)
    dump = _dump(path)
    ptd = load_file(path)
    assert isinstance(ptd, PtdFile)
    named = ptd.named()
    assert list(named) == [nd["key"] for nd in dump["flat_tensor"]["named_data"]]
    for nd in dump["flat_tensor"]["named_data"]:
        layout, data = named[nd["key"]]
        assert layout.sizes == nd["tensor_layout"]["sizes"]
        assert _sha(data) == dump["buffers"][nd["segment_index"]]["sha256"]
    assert deserialize_ptd(path.read_bytes()).flat_tensor == ptd.flat_tensor
    program = load_pte(model_dir / "external" / "model.pte")  # names its weights, holds none
    assert program.program.execution_plan[0].operators


def _damaged(data: bytes, rng: random.Random):
    n = len(data)
    for cut in sorted({rng.randrange(n) for _ in range(12)} | {0, 7, 8, 40, n - 1}):
        yield data[:cut]
    for _ in range(40):
        out = bytearray(data)
        # Damage where the structure lives: the FlatBuffer region at the front of the file.
        for _ in range(rng.randint(1, 8)):
            bit = rng.randrange(min(n, 8192) * 8)
            out[bit // 8] ^= 1 << (bit % 8)
        yield bytes(out)


@pytest.mark.parametrize("name, load", [("model.pte", deserialize_pte), ("model.bpte", deserialize_bundled_program),
                                        ("run.etdp", deserialize_etdump)])
def test_damaged_upstream_files_fail_cleanly(upstream_artifacts, name, load):
    path = upstream_artifacts["mlp"] / name
    rng = random.Random(name)  # seeded: CI sees the same damage every run
    for data in _damaged(path.read_bytes(), rng):
        try:
            load(data, what=str(path))
        except FormatError as e:
            assert str(e).startswith(f"{path}: ")
            assert e.__cause__ is None, f"the verifier missed a defect the reader then hit: {e.__cause__!r}"
