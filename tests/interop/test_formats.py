"""Issue-2 interop: upstream files read by etlab, and etlab-written files read by upstream."""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
import re
from pathlib import Path

import pytest
import torch

from etlab.schema import bundled_program, etdump, flat_tensor, program
from etlab.schema._generated.layouts import LAYOUTS

from .conftest import ET_REF, external_ptd, run_ref

pytestmark = pytest.mark.interop
MODELS = ["mlp", "cnn", "transformer"]
REF_TOOLS = Path(__file__).with_name("ref_tools.py")
REF_BUNDLED = Path(__file__).with_name("ref_bundled.py")
NS_OF = {program: "program", etdump: "etdump", bundled_program: "bundled_program", flat_tensor: "flat_tensor"}


def plain(obj, ns: str, union: bool = False):
    """Our model in the canonical JSON form ref_tools.py writes for upstream's view of a file."""
    if dataclasses.is_dataclass(obj):
        rows = LAYOUTS["tables"][ns][type(obj).__name__]
        out = {}
        for name, _slot, kind, typ, _align, _default in rows:
            v = getattr(obj, name)
            is_bytes = kind == "vector" and typ == ("scalar", "B") and "bytes" in str(
                {f.name: f.type for f in dataclasses.fields(obj)}[name])
            if v is not None and is_bytes:
                data = bytes(v)
                out[name] = {"nbytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            else:
                out[name] = plain(v, ns, union=kind == "union")
        if union:
            out["_type"] = type(obj).__name__
        return out
    if isinstance(obj, list):
        return [plain(x, ns) for x in obj]
    if isinstance(obj, enum.Enum):
        return int(obj)
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    return obj


# Fields etlab's schemas add to upstream's (upstream's readers skip them): absent from upstream's files,
# so our reading of an upstream file must give None there.
# etdump.fbs fields upstream's schema lacks: ETDump.debug_buffer (the debug buffer's size and digest) and
# RunData.threads (intra-op threads of the block); in upstream's file they read as absent (None or 0).
ETLAB_ONLY = {".debug_buffer", ".run_data[].threads"}


def diff(ours, theirs, path="") -> list[str]:
    """Every place the two trees disagree (empty when equal)."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        out = []
        for k in sorted(set(ours) | set(theirs)):
            if re.sub(r"\[\d+\]", "[]", f"{path}.{k}") in ETLAB_ONLY and k not in theirs:
                out += [] if ours[k] in (None, 0) else [f"{path}.{k}: {ours[k]!r} in upstream's file"]
            elif k not in ours or k not in theirs:
                out.append(f"{path}.{k}: only in {'ours' if k in ours else 'upstream'}")
            else:
                out += diff(ours[k], theirs[k], f"{path}.{k}")
        return out
    if isinstance(ours, list) and isinstance(theirs, list):
        if len(ours) != len(theirs):
            return [f"{path}: {len(ours)} items vs upstream {len(theirs)}"]
        return [d for i, (a, b) in enumerate(zip(ours, theirs)) for d in diff(a, b, f"{path}[{i}]")]
    if isinstance(ours, float) or isinstance(theirs, float):
        return [] if ours == theirs or (ours == pytest.approx(theirs, rel=1e-6)) else [f"{path}: {ours} != {theirs}"]
    return [] if ours == theirs else [f"{path}: {ours!r} != upstream {theirs!r}"]


def _sha(b) -> dict:
    data = bytes(b)
    return {"nbytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


@pytest.mark.parametrize("name", MODELS)
def test_upstream_pte_fields_match_upstreams_own_reading(upstream_artifacts, name):
    d = upstream_artifacts[name]
    theirs = json.loads((d / "model.pte.json").read_text())
    pte = program.load_pte(d / "model.pte")
    assert diff(plain(pte.program, "program"), theirs["program"]) == []
    assert [_sha(s) for s in pte.segments] == theirs["segments"]
    eh = theirs["extended_header"]
    assert (pte.header.program_size, pte.header.segment_base_offset, pte.header.segment_data_size) == (
        eh["program_size"], eh["segment_base_offset"], eh["segment_data_size"])


@pytest.mark.parametrize("name", MODELS)
def test_upstream_bpte_and_etdp_fields_match(upstream_artifacts, name):
    d = upstream_artifacts[name]
    bp = bundled_program.deserialize_bundled_program((d / "model.bpte").read_bytes())
    assert diff(plain(bp, "bundled_program"), json.loads((d / "model.bpte.json").read_text())["bundled_program"]) == []
    dump = etdump.deserialize_etdump((d / "run.etdp").read_bytes())
    assert diff(plain(dump, "etdump"), json.loads((d / "run.etdp.json").read_text())["etdump"]) == []


def test_upstream_ptd_fields_match(upstream_artifacts):
    ext = upstream_artifacts["mlp"] / "external"
    ptd_path = external_ptd(upstream_artifacts["mlp"])
    theirs = json.loads(Path(str(ptd_path) + ".json").read_text())
    ptd = flat_tensor.deserialize_ptd(ptd_path.read_bytes())
    assert diff(plain(ptd.flat_tensor, "flat_tensor"), theirs["flat_tensor"]) == []
    assert [_sha(s) for s in ptd.segments] == theirs["buffers"]
    ext_pte = program.load_pte(ext / "model.pte")
    assert diff(plain(ext_pte.program, "program"), json.loads((ext / "model.pte.json").read_text())["program"]) == []


def _run_upstream(ref_python, pte: Path, inputs: Path, out: Path) -> list[torch.Tensor]:
    run_ref(ref_python, str(ET_REF), "run", str(pte), "--inputs", str(inputs), "--outputs", str(out))
    return torch.load(out, weights_only=True)


@pytest.mark.parametrize("name", MODELS)
def test_reserialized_pte_runs_on_upstream_with_identical_outputs(ref_python, upstream_artifacts, name, tmp_path):
    d = upstream_artifacts[name]
    pte = program.load_pte(d / "model.pte")
    ours = tmp_path / "ours.pte"
    ours.write_bytes(program.reserialize_pte(pte))  # our layout: 4096-aligned segments, upstream wrote 128
    outs = _run_upstream(ref_python, ours, d / "inputs.pt", tmp_path / "out.pt")
    expected = torch.load(d / "upstream_outputs.pt", weights_only=True)
    assert len(outs) == len(expected)
    for a, b in zip(outs, expected):
        assert torch.equal(a, b)


def test_reserialized_bpte_runs_on_upstream(ref_python, upstream_artifacts, tmp_path):
    d = upstream_artifacts["mlp"]
    bp = bundled_program.deserialize_bundled_program((d / "model.bpte").read_bytes())
    # Re-embed our own re-serialization of the program, so both layers are ours.
    bp.program = program.reserialize_pte(program.deserialize_pte(bp.program))
    ours = tmp_path / "ours.bpte"
    ours.write_bytes(bundled_program.serialize_bundled_program(bp))
    run_ref(ref_python, str(REF_BUNDLED), str(d / "model.bpte"), "--json", str(tmp_path / "theirs.json"))
    run_ref(ref_python, str(REF_BUNDLED), str(ours), "--json", str(tmp_path / "ours.json"))
    theirs_cases = json.loads((tmp_path / "theirs.json").read_text())["cases"]
    ours_cases = json.loads((tmp_path / "ours.json").read_text())["cases"]
    assert len(ours_cases) == 2 and all(c["passed"] for c in ours_cases)
    assert [c["outputs"] for c in ours_cases] == [c["outputs"] for c in theirs_cases]


def test_upstream_inspector_reads_our_etdp(ref_python, upstream_artifacts, tmp_path):
    d = upstream_artifacts["cnn"]
    ours = tmp_path / "ours.etdp"
    ours.write_bytes(etdump.serialize_etdump(etdump.deserialize_etdump((d / "run.etdp").read_bytes())))
    reports = {}
    for label, path in (("theirs", d / "run.etdp"), ("ours", ours)):
        out = tmp_path / f"{label}.json"
        run_ref(ref_python, str(REF_TOOLS), "inspect-events", str(path), "--debug-buffer", str(d / "run.bin"),
                "--json", str(out))
        reports[label] = json.loads(out.read_text())

    def summary(rep):
        return [(b["name"], [(e["name"], e["instruction_id"], e["perf_data"], e["has_debug_data"])
                             for e in b["events"]]) for b in rep["event_blocks"]]

    assert reports["ours"]["event_count"] == reports["theirs"]["event_count"] > 0
    assert summary(reports["ours"]) == summary(reports["theirs"])


def test_our_ptd_is_accepted_by_upstream(ref_python, upstream_artifacts, tmp_path):
    ext = upstream_artifacts["mlp"] / "external"
    theirs = flat_tensor.deserialize_ptd(external_ptd(upstream_artifacts["mlp"]).read_bytes())
    # Write a fresh .ptd from the named tensors alone, with our own layout choices.
    named = theirs.named()
    flat = flat_tensor.FlatTensor(version=0, named_data=[
        flat_tensor.NamedData(key=k, segment_index=i, tensor_layout=flat_tensor.TensorLayout(
            layout.scalar_type, list(layout.sizes), list(layout.dim_order)))
        for i, (k, (layout, _)) in enumerate(named.items())])
    ours = tmp_path / "ours.ptd"
    ours.write_bytes(flat_tensor.serialize_ptd(flat, [bytes(data) for _, data in named.values()],
                                               segment_alignment=64))
    run_ref(ref_python, str(REF_TOOLS), "run-with-data", str(ext / "model.pte"), str(ours),
            "--inputs", str(ext / "inputs.pt"), "--outputs", str(tmp_path / "out.pt"))
    outs = torch.load(tmp_path / "out.pt", weights_only=True)
    expected = torch.load(ext / "upstream_outputs.pt", weights_only=True)
    assert all(torch.equal(a, b) for a, b in zip(outs, expected, strict=True))
