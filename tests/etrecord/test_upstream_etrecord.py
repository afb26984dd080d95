"""Upstream ExecuTorch's ETRecord layout: written by `save(format="upstream")`, read back by
`parse_etrecord` without pickle; crafted members (pickles that run code, bad zips, bad graphs)
are FormatErrors naming the member. The interop tests prove the same against upstream's files."""

from __future__ import annotations

import base64
import io
import json
import os
import pickle
import zipfile
from collections import OrderedDict

import pytest
import torch

from etlab.errors import FormatError
from etlab.etrecord import parse_etrecord
from etlab.etrecord._torch_pickle import load_torch_bytes
from tests.etrecord.conftest import compiled


def _upstream_bytes(record) -> bytes:
    buf = io.BytesIO()
    record.save(buf, format="upstream")
    return buf.getvalue()


def _entries(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def _zip(entries: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
    return buf.getvalue()


def _torch_bytes(value) -> bytes:
    buf = io.BytesIO()
    torch.save(value, buf)
    return buf.getvalue()


def _with_pickle(torch_zip: bytes, pkl: bytes) -> bytes:
    """A torch.save zip whose data.pkl is replaced by `pkl` (storages kept)."""
    entries = _entries(torch_zip)
    name = next(n for n in entries if n.endswith("/data.pkl"))
    entries[name] = pkl
    return _zip(entries)


# -- the torch.save reader -------------------------------------------------------------------------


def test_torch_save_values_read_like_torch_load():
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    value = {
        "view": base[1:, 2:5], "transposed": base.t(), "param": torch.nn.Parameter(torch.randn(3)),
        "ints": torch.tensor([1, -2, 3], dtype=torch.int64), "mask": torch.tensor([True, False]),
        "half": torch.randn(2, 2).to(torch.bfloat16), "empty": torch.empty(0, 3), "scalar": torch.tensor(2.5),
        "nested": [(1, 2.5, "s", None, True), {"k": [base[0]]}], "od": OrderedDict(a=torch.ones(2)),
        "big": 2**70,
    }
    ours = load_torch_bytes(_torch_bytes(value), "t")
    ref = torch.load(io.BytesIO(_torch_bytes(value)), weights_only=True)
    flat_ours, spec_ours = torch.utils._pytree.tree_flatten(ours)
    flat_ref, spec_ref = torch.utils._pytree.tree_flatten(ref)
    assert spec_ours == spec_ref
    for a, b in zip(flat_ours, flat_ref):
        if isinstance(b, torch.Tensor):
            assert type(a) is type(b) and a.dtype == b.dtype and a.stride() == b.stride() and torch.equal(a, b)
        else:
            assert a == b
    assert ours["view"].data_ptr() != 0 and ours["view"].untyped_storage().data_ptr() == \
        ours["transposed"].untyped_storage().data_ptr()  # one storage, as saved


class _RunsCode:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_pickle_that_runs_code_is_refused_and_does_not_run(tmp_path):
    marker = tmp_path / "pwned"
    payload = pickle.dumps(_RunsCode(str(marker)), protocol=2)
    pickle.loads(payload).close()  # what an unrestricted loader does with it:
    assert marker.exists()          # it creates the file
    marker.unlink()

    member = _with_pickle(_torch_bytes({"w": torch.ones(2)}), payload)
    with pytest.raises(FormatError, match=r"representative_inputs.*(io|builtins|_io)\.open"):
        load_torch_bytes(member, "entry 'representative_inputs'")
    data = _upstream_bytes(compiled("mlp").record)
    for name in ("representative_inputs", "edge_dialect_exported_program/forward_state_dict"):
        entries = _entries(data)
        entries[name] = member
        with pytest.raises(FormatError, match=name):  # a program's members are read when it is rebuilt
            parse_etrecord(_zip(entries)).edge_dialect_program  # noqa: B018
    assert not marker.exists()


@pytest.mark.parametrize("pkl, match", [
    (b"\x80\x02cos\nsystem\nq\x00X\x02\x00\x00\x00idq\x01\x85q\x02Rq\x03.", "os.system"),
    (b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\nq\x00}b.", "BUILD"),
    (b"\x80\x02ccollections\nOrderedDict\nq\x00X\x01\x00\x00\x00aq\x01\x85q\x02Rq\x03.", "REDUCE"),
    (b"\x80\x02]q\x00h\x00a.", "nested|holds itself"),                   # a list that holds itself
    (b"\x80\x02X\x01\x00\x00\x00a", "STOP|malformed"),                    # truncated
    (b"\x80\x02(X\x01\x00\x00\x00a.", "leaves items|MARK"),
    (b"\x80\x02ctorch\nFloatStorage\nq\x00.", "bare"),
    (b"\x80\x02c__builtin__\neval\nq\x00.", "eval"),
    (b"\x80\x02\x82\x01.", "EXT1"),
])
def test_refused_pickles(pkl, match):
    member = _with_pickle(_torch_bytes({}), pkl)
    with pytest.raises(FormatError, match=match):
        load_torch_bytes(member, "m")


def test_tensor_outside_its_storage_is_refused():
    good = _torch_bytes(torch.arange(4.0))
    entries = _entries(good)
    name = next(n for n in entries if n.endswith("/data.pkl"))
    pkl = entries[name]
    assert b"K\x04\x85" in pkl  # size (4,)
    entries[name] = pkl.replace(b"K\x04\x85", b"K\x09\x85", 1)
    with pytest.raises(FormatError, match="more elements than its storage"):
        load_torch_bytes(_zip(entries), "m")
    entries[name] = pkl.replace(b"K\x04\x85", b"K\x03\x85", 1).replace(b"K\x01\x85", b"K\x02\x85", 1)
    with pytest.raises(FormatError, match="outside its storage"):  # 3 elements, stride 2: index 4 of 4
        load_torch_bytes(_zip(entries), "m")
    huge = pkl.replace(b"K\x04\x85", b"J\x00\xca\x9a\x3b\x85", 1).replace(b"K\x01\x85", b"K\x00\x85", 1)
    entries[name] = huge  # 1e9 elements, stride 0, over a 4-element storage
    with pytest.raises(FormatError, match="more elements than its storage"):
        load_torch_bytes(_zip(entries), "m")


@pytest.mark.parametrize("rename, match", [
    ("archive/../evil", "unexpected entry"),
    ("archive/data/x", "unexpected entry"),
    ("other/data.pkl", "one plain top directory"),
])
def test_torch_zip_layout_is_checked(rename, match):
    entries = _entries(_torch_bytes([torch.ones(1)]))
    entries[rename] = entries.pop(next(n for n in entries if n.endswith("/version")))
    with pytest.raises(FormatError, match=match):
        load_torch_bytes(_zip(entries), "m")


def test_storage_size_must_match_its_entry():
    entries = _entries(_torch_bytes([torch.ones(4)]))
    entries[next(n for n in entries if "/data/" in n)] = b"\0" * 8
    with pytest.raises(FormatError, match="holds 8 bytes"):
        load_torch_bytes(_zip(entries), "m")


# -- the upstream layout, written and read back ----------------------------------------------------


@pytest.mark.parametrize("name, delegated", [("mlp", True), ("cnn", False), ("transformer", False)])
def test_upstream_layout_round_trip(name, delegated):
    c = compiled(name, delegated=delegated)
    record = c.record
    record.update_representative_inputs(list(c.inputs))
    with torch.no_grad():
        record.update_reference_outputs([[c.model(*c.inputs)]])
    data = _upstream_bytes(record)
    names = set(_entries(data))
    assert {"ETRECORD_V0", "edge_dialect_exported_program/forward", "exported_program", "debug_handle_map",
            "representative_inputs", "reference_outputs"} <= names
    back = parse_etrecord(data)
    assert back._debug_handle_map == {m: {i: list(h) for i, h in v.items()}
                                      for m, v in record._debug_handle_map.items()}
    ours, theirs = record.program_info().methods["forward"], back.program_info().methods["forward"]
    assert theirs.instruction_debug_handles == ours.instruction_debug_handles
    assert theirs.delegates == ours.delegates
    assert {h: [(o.name, o.op_type, o.stack_trace, o.module_hierarchy) for o in v] for h, v in theirs.ops.items()} \
        == {h: [(o.name, o.op_type, o.stack_trace, o.module_hierarchy) for o in v] for h, v in ours.ops.items()}
    torch.testing.assert_close(back._reference_outputs["forward"][0][0], record._reference_outputs["forward"][0][0])
    aot_ours, aot_back = ours.aot_intermediate_outputs(), theirs.aot_intermediate_outputs()
    assert aot_back.keys() == aot_ours.keys()
    for k in aot_ours:
        torch.testing.assert_close(aot_back[k], aot_ours[k])
    assert back.exported_program is not None


def test_multi_method_and_graph_map_round_trip():
    from etlab.compiler import to_edge

    class Two(torch.nn.Module):
        def forward(self, x):
            return x.relu() + 1

    ep = torch.export.export(Two(), (torch.randn(3),))
    edge = to_edge({"forward": ep, "other": ep}, generate_etrecord=True)
    record = edge.to_executorch().get_etrecord()
    record.add_extra_export_modules({"extra": ep})
    back = parse_etrecord(_upstream_bytes(record))
    assert set(back.edge_dialect_program) == {"forward", "other"}
    assert set(back.graph_map) == {"extra/forward"}
    assert set(back.methods) == {"forward", "other"}
    x = torch.randn(3)
    torch.testing.assert_close(back.edge_program("other").module()(x), x.relu() + 1)


def _tamper(mutate) -> bytes:
    entries = _entries(_upstream_bytes(compiled("mlp", delegated=True).record))
    mutate(entries)
    return _zip(entries)


def _edit_program(entries, edit, name="edge_dialect_exported_program/forward"):
    doc = json.loads(entries[name])
    edit(doc)
    entries[name] = json.dumps(doc).encode()


def _nodes(doc):
    return doc["graph_module"]["graph"]["nodes"]


def _edit_lowered(doc, edit):
    node = next(n for n in _nodes(doc) if n["target"].endswith("executorch_call_delegate"))
    lowered = json.loads(node["inputs"][0]["arg"]["as_string"])
    edit(lowered)
    node["inputs"][0]["arg"]["as_string"] = json.dumps(lowered)


@pytest.mark.parametrize("mutate, match", [
    (lambda e: e.update({"../evil": b""}), "absolute or parent-relative"),
    (lambda e: e.update({"a/b/c/d/e/f": b"{}"}), "unexpected entry"),
    (lambda e: e.update({"stray_state_dict": b""}), "belongs to no program"),
    (lambda e: e.pop("edge_dialect_exported_program/forward_constants"), "lacks"),
    (lambda e: e.update({"debug_handle_map": b'{"forward": {"x": 1}}'}), "not an instruction id"),
    (lambda e: e.update({"delegate_map": b'{"forward": {"0": {"name": 3}}}'}), "backend name"),
    (lambda e: e.update({"export_graph_id": b'"id"'}), "export_graph_id"),
    (lambda e: e.update({"representative_inputs": pickle.dumps([1])}), "not a torch.save zip"),
    (lambda e: _edit_program(e, lambda d: _nodes(d)[1].update(
        target="executorch.exir.dialects.edge.ops.aten.from_file.default")), "from_file|unknown operator"),
    (lambda e: _edit_program(e, lambda d: _nodes(d)[1]["metadata"].update(debug_handle="1; rm")), "debug handle"),
    (lambda e: _edit_program(e, lambda d: d["graph_module"]["graph"]["nodes"][1].update(name="a b(c)")),
     "plain"),
    (lambda e: _edit_program(e, lambda d: _edit_lowered(d, lambda m: m.update(processed_bytes="%%%"))),
     "base64"),
    (lambda e: _edit_program(e, lambda d: _edit_lowered(d, lambda m: m.update(backend_id="a b"))),
     "backend id"),
    (lambda e: _edit_program(e, lambda d: _edit_lowered(d, lambda m: m.update(
        original_state_dict=base64.b64encode(pickle.dumps({"w": 1})).decode()))), "state dict"),
])
def test_tampered_upstream_records_are_format_errors(mutate, match):
    with pytest.raises(FormatError, match=match):
        parse_etrecord(_tamper(mutate)).edge_dialect_program  # noqa: B018 - rebuilding is part of reading


def test_replay_of_an_upstream_graph_is_checked_like_ours():
    """A graph upstream's layout carries an impure operator in (aten.bernoulli) loads for viewing but
    is refused before any node runs when the numeric gap would replay it."""
    def to_bernoulli(doc):
        node = next(n for n in _nodes(doc) if n["target"].endswith("aten.relu.default"))
        node["target"] = "executorch.exir.dialects.edge.ops.aten.bernoulli.default"
        node["inputs"] = [{"name": "self", "arg": node["inputs"][0]["arg"]}]

    record = parse_etrecord(_tamper(lambda e: _edit_program(e, to_bernoulli)))
    with pytest.raises(FormatError, match="bernoulli"):
        record.program_info().methods["forward"].aot_intermediate_outputs()


def test_upstream_save_is_atomic_and_rejects_unknown_formats(tmp_path):
    record = compiled("mlp").record
    path = tmp_path / "r.etrecord"
    record.save(path, format="upstream")
    assert zipfile.ZipFile(path).namelist()[0] == "ETRECORD_V0"
    assert not [p for p in os.listdir(tmp_path) if p != "r.etrecord"]
    with pytest.raises(ValueError, match="format"):
        record.save(tmp_path / "x", format="pickle")


def test_reading_upstream_layout_never_unpickles(monkeypatch):
    c = compiled("mlp", delegated=True)
    c.record.update_representative_inputs(list(c.inputs))
    data = _upstream_bytes(c.record)

    def refuse(*args, **kwargs):
        raise AssertionError("pickle used while loading an upstream ETRecord")

    for obj, name in ((pickle, "loads"), (pickle, "load"), (pickle, "Unpickler"), (torch, "load"),
                      (torch.serialization, "load")):
        monkeypatch.setattr(obj, name, refuse)
    record = parse_etrecord(data)
    assert record.program_info().methods["forward"].aot_intermediate_outputs()
    assert torch.equal(record._representative_inputs[0], c.inputs[0])
