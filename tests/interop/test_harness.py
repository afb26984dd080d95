"""Tests of the interop harness itself: reference env, cached artifacts, ref_tools CLI."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from .conftest import (
    EXTERNAL_FILES,
    EXTERNAL_MODEL,
    ITERS,
    MODEL_FILES,
    MODELS,
    REF_TOOLS,
    RefToolError,
    cache_key,
    external_ptd,
    run_ref,
)

pytestmark = pytest.mark.interop

TOP_KEYS = {
    "pte": {"kind", "file", "file_identifier", "extended_header", "program", "segments", "restored"},
    "bpte": {"kind", "file", "file_identifier", "bundled_program"},
    "etdp": {"kind", "file", "size_prefix", "file_identifier", "etdump"},
    "ptd": {"kind", "file", "file_identifier", "header", "flat_tensor", "buffers", "named_data"},
}
PROGRAM_KEYS = {
    "version",
    "execution_plan",
    "constant_buffer",
    "backend_delegate_data",
    "segments",
    "constant_segment",
    "mutable_data_segments",
    "named_data",
}


def _load(p: Path):
    return json.loads(Path(p).read_text())


def test_ref_python_is_upstream_1_5_1(ref_python):
    out = run_ref(ref_python, "-c", "import executorch.version as v; print(v.__version__)", timeout=120)
    assert out.stdout.strip().startswith("1.5.1"), out.stdout


def test_run_ref_raises_with_output(ref_python):
    with pytest.raises(RefToolError) as ei:
        run_ref(ref_python, "-c", "import sys; print('to-out'); sys.exit('boom-on-stderr')", timeout=60)
    msg = str(ei.value)
    assert "exit 1" in msg and "to-out" in msg and "boom-on-stderr" in msg


def test_cache_key_tracks_contents(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("x = 1\n")
    b.write_text("y = 2\n")
    k1 = cache_key([a, b], recipe="r")
    assert k1 == cache_key([a, b], recipe="r")
    a.write_text("x = 3\n")
    assert cache_key([a, b], recipe="r") != k1
    assert cache_key([a, b], recipe="r2") != cache_key([a, b], recipe="r")


def test_artifacts_exist_and_nonempty(upstream_artifacts):
    assert set(upstream_artifacts) == set(MODELS)
    for d in upstream_artifacts.values():
        for f in MODEL_FILES:
            p = d / f
            assert p.is_file() and p.stat().st_size > 0, p
    ext = upstream_artifacts[EXTERNAL_MODEL] / "external"
    for f in EXTERNAL_FILES:
        assert (ext / f).stat().st_size > 0, ext / f
    ptd = external_ptd(upstream_artifacts[EXTERNAL_MODEL])
    assert ptd.stat().st_size > 0
    assert ptd.read_bytes()[4:8] == b"FT01"
    manifest = _load(upstream_artifacts[MODELS[0]].parent / "manifest.json")
    assert manifest["ptd"] == ptd.name


@pytest.mark.parametrize("model", MODELS)
def test_upstream_outputs_match_eager(upstream_artifacts, model):
    dirs = [upstream_artifacts[model]]
    if model == EXTERNAL_MODEL:
        dirs.append(dirs[0] / "external")
    for d in dirs:
        eager = torch.load(d / "eager_outputs.pt", weights_only=True)
        ours = torch.load(d / "upstream_outputs.pt", weights_only=True)
        assert len(eager) == len(ours) > 0
        for e, u in zip(eager, ours, strict=True):
            assert e.shape == u.shape and e.dtype == u.dtype
            torch.testing.assert_close(u, e, rtol=0, atol=1e-5, msg=lambda s, d=d: f"{d}: {s}")


def _check_dump(kind: str, dump: dict, src: Path) -> None:
    assert set(dump) == TOP_KEYS[kind], (kind, sorted(dump))
    assert dump["kind"] == kind
    data = src.read_bytes()
    assert dump["file"]["nbytes"] == len(data)
    if kind == "pte":
        assert dump["file_identifier"] == "ET12"
        assert set(dump["program"]) == PROGRAM_KEYS
        plans = dump["program"]["execution_plan"]
        assert [p["name"] for p in plans] == ["forward"]
        assert len(dump["segments"]) == len(dump["program"]["segments"])
        for ev in plans[0]["values"]:
            assert "_type" in ev["val"]
        for ins in plans[0]["chains"][0]["instructions"]:
            assert ins["instr_args"]["_type"] in {"KernelCall", "DelegateCall", "MoveCall", "JumpFalseCall", "FreeCall"}
    elif kind == "bpte":
        assert dump["file_identifier"] == "BP08"
        bp = dump["bundled_program"]
        assert set(bp) == {"version", "method_test_suites", "program"}
        suites = bp["method_test_suites"]
        assert [s["method_name"] for s in suites] == ["forward"]
        assert len(suites[0]["test_cases"]) == 2
        val = suites[0]["test_cases"][0]["inputs"][0]["val"]
        assert val["_type"] == "Tensor" and set(val["data"]) == {"nbytes", "sha256"}
    elif kind == "etdp":
        assert dump["file_identifier"] == "ED00"
        assert dump["size_prefix"] == len(data) - 4
        names = [rd["name"] for rd in dump["etdump"]["run_data"]]
        assert names == ["Default"] + ["Execute"] * ITERS
    elif kind == "ptd":
        assert dump["file_identifier"] == "FT01"
        assert dump["header"]["magic"] == "FH01"
        assert set(dump["flat_tensor"]) == {"version", "segments", "named_data"}
        assert len(dump["named_data"]) == len(dump["flat_tensor"]["named_data"]) > 0


def test_cached_dumps(upstream_artifacts):
    for m, d in upstream_artifacts.items():
        _check_dump("pte", _load(d / "model.pte.json"), d / "model.pte")
        _check_dump("bpte", _load(d / "model.bpte.json"), d / "model.bpte")
        _check_dump("etdp", _load(d / "run.etdp.json"), d / "run.etdp")
        # The bundled program embeds exactly the exported program.
        bp = _load(d / "model.bpte.json")["bundled_program"]
        assert bp["program"] == _load(d / "model.pte.json")["file"], m
    ext = upstream_artifacts[EXTERNAL_MODEL] / "external"
    ptd = external_ptd(upstream_artifacts[EXTERNAL_MODEL])
    pte = _load(ext / "model.pte.json")
    _check_dump("pte", pte, ext / "model.pte")
    ptd_dump = _load(ptd.with_name(ptd.name + ".json"))
    _check_dump("ptd", ptd_dump, ptd)
    # Every externally stored tensor's name is a key of the .ptd.
    fqns = {
        v["val"]["extra_tensor_info"]["fully_qualified_name"]
        for v in pte["program"]["execution_plan"][0]["values"]
        if v["val"]["_type"] == "Tensor"
        and v["val"]["extra_tensor_info"]
        and v["val"]["extra_tensor_info"]["location"] == 1  # TensorDataLocation.EXTERNAL
    }
    assert fqns and fqns == set(ptd_dump["named_data"])


def test_dump_cli_each_kind(ref_python, upstream_artifacts, tmp_path):
    """`ref_tools.py dump KIND PATH --json OUT` for every kind, deterministic vs the cache."""
    d = upstream_artifacts[EXTERNAL_MODEL]
    ptd = external_ptd(d)
    jobs = [
        ("pte", d / "model.pte", d / "model.pte.json"),
        ("bpte", d / "model.bpte", d / "model.bpte.json"),
        ("etdp", d / "run.etdp", d / "run.etdp.json"),
        ("ptd", ptd, ptd.with_name(ptd.name + ".json")),
    ]

    def one(job):
        kind, src, cached = job
        out = tmp_path / f"{kind}.json"
        res = run_ref(ref_python, REF_TOOLS, "dump", kind, src, "--json", out)
        assert json.loads(res.stdout)["keys"] == sorted(TOP_KEYS[kind])
        return kind, src, cached, _load(out)

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(one, jobs))
    for kind, src, cached, dump in results:
        _check_dump(kind, dump, src)
        assert dump == _load(cached), f"{kind} dump is not deterministic"


def test_canonical_rules(ref_python):
    """canon(): union _type, Enum->int, bytes->digest, float specials (run in the ref python)."""
    code = f"""
import dataclasses, enum, json, sys, typing
sys.path.insert(0, {str(REF_TOOLS.parent)!r})
import ref_tools as rt

class E(enum.IntEnum):
    A = 3

@dataclasses.dataclass
class X:
    a: int

@dataclasses.dataclass
class Y:
    b: float

@dataclasses.dataclass
class Holder:
    u: "typing.Union[X, Y]"
    o: typing.Optional[X]
    e: E
    raw: bytes
    blob: typing.Optional[bytes]
    fl: typing.List[float]
    flag: bool

h = Holder(u=Y(b=float("nan")), o=X(a=1), e=E.A, raw=b"abc", blob=[1, 2],
           fl=[float("inf"), -float("inf"), 0.5], flag=True)
print(json.dumps(rt.canon(h), sort_keys=True))
"""
    out = json.loads(run_ref(ref_python, "-c", code, timeout=60).stdout)
    assert out == {
        "u": {"_type": "Y", "b": "nan"},
        "o": {"a": 1},
        "e": 3,
        "raw": {"nbytes": 3, "sha256": "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        "blob": {"nbytes": 2, "sha256": "a12871fee210fb8619291eaea194581cbd2531e4b23759d225f6806923f63222"},
        "fl": ["inf", "-inf", 0.5],
        "flag": True,
    }


def test_inspect_events(ref_python, upstream_artifacts, tmp_path):
    d = upstream_artifacts["mlp"]
    out = tmp_path / "events.json"
    run_ref(
        ref_python, REF_TOOLS, "inspect-events", d / "run.etdp",
        "--etrecord", d / "model.etrecord", "--debug-buffer", d / "run.bin", "--json", out,
    )  # fmt: skip
    ev = _load(out)
    blocks = {b["name"]: b for b in ev["event_blocks"]}
    assert set(blocks) == {"Default", "Execute"}
    assert ev["event_count"] == sum(len(b["events"]) for b in ev["event_blocks"])
    execute = blocks["Execute"]["events"]
    names = [e["name"] for e in execute]
    assert "Method::execute" in names and "OPERATOR_CALL" in names
    for e in execute:
        assert len(e["perf_data"]) == ITERS  # one sample per iteration
    ops = [e for e in execute if e["name"] == "OPERATOR_CALL"]
    assert ops and all(e["has_debug_data"] and e["debug_data"][0]["shape"] for e in ops)
    assert all(isinstance(e["instruction_id"], int) for e in ops)
    assert all(e["is_delegated_op"] is False for e in ops)
