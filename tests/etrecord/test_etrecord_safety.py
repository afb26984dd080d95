"""Corrupt and malicious ETRecords raise FormatError; reading never unpickles or runs file code."""

from __future__ import annotations

import copy
import io
import json
import pickle
import random
import zipfile

import pytest
import torch

from etlab.errors import FormatError
from etlab.etrecord import parse_etrecord
from etlab.etrecord._archive import read_archive

from .conftest import compiled, read_entries, write_entries

pytestmark = pytest.mark.xdist_group("etrecord")  # one worker: the compiled models are cached per process


def _record():
    return compiled("mlp").data


def _tampered(edit) -> bytes:
    manifest, blob = read_entries(_record())
    manifest = copy.deepcopy(manifest)
    edit(manifest)
    return write_entries(manifest, blob)


def _parse_and_rebuild(data: bytes):
    record = parse_etrecord(data)
    return record.edge_dialect_program, record.exported_program


def test_truncated_file(tmp_path):
    data = _record()
    for cut in (10, len(data) // 2, len(data) - 10):
        path = tmp_path / "cut.etrecord"
        path.write_bytes(data[:cut])
        with pytest.raises(FormatError, match=r"cut\.etrecord"):
            parse_etrecord(path)


def test_flipped_bytes_anywhere():
    """A flipped byte anywhere fails or changes nothing read: in an entry's data the CRC of the
    decompressed bytes catches any change (a flip in the padding after LZMA's end-of-stream marker
    decodes to the same bytes), and zipfile ignores some header fields (e.g. timestamps)."""
    data = _record()
    good, _ = read_archive(data)
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        infos = zf.infolist()
    rng = random.Random(0)
    in_data = []
    for info in infos:
        start = info.header_offset + 30 + len(info.filename) + len(info.extra)
        in_data += rng.sample(range(start + 16, start + info.compress_size), 10)  # past LZMA's props header
    in_headers = rng.sample([p for p in range(len(data)) if not any(
        i.header_offset + 30 <= p < i.header_offset + 30 + len(i.filename) + i.compress_size for i in infos)], 30)
    caught_in_data = 0
    for pos in in_data + in_headers:
        bad = bytearray(data)
        bad[pos] ^= 0xFF
        try:
            entries, _ = read_archive(bytes(bad))
        except FormatError:
            caught_in_data += pos in in_data
            continue
        assert entries == good, f"flipping byte {pos} changed what was read without an error"
    assert caught_in_data >= 0.8 * len(in_data)  # only a stream's tail padding may be inert


def test_index_pointing_past_the_blob():
    def edit(m):
        m["tensors"][0]["offset"] = 10**9

    with pytest.raises(FormatError, match=r"past the end of tensors\.bin"):
        parse_etrecord(_tampered(edit))


def test_index_lying_about_sizes():
    def edit(m):
        m["tensors"][0]["shape"] = [10**6, 10**6]

    with pytest.raises(FormatError, match=r"needs \d+ bytes"):
        parse_etrecord(_tampered(edit))


def test_zip_bomb_entry():
    manifest, _ = read_entries(_record())
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("etrecord.json", json.dumps(manifest))
        zf.writestr("tensors.bin", bytes(80 << 20))  # 80 MB of zeros: ~80 KB deflated
    assert len(buf.getvalue()) < 1 << 20
    with pytest.raises(FormatError, match="zip bomb"):
        parse_etrecord(buf.getvalue())


@pytest.mark.parametrize("name", ["../evil.json", "/etc/evil", "programs/../../x", "C:/evil", "extra.txt"])
def test_unexpected_or_traversing_entry(name):
    manifest, blob = read_entries(_record())
    with pytest.raises(FormatError, match="entry"):
        parse_etrecord(write_entries(manifest, blob, {name: b"{}"}))


def test_pickled_entry_or_file_is_refused(monkeypatch):
    payload = pickle.dumps({"debug_handle_map": {}})
    _, blob = read_entries(_record())
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("etrecord.json", payload)
        zf.writestr("tensors.bin", blob)
    with pytest.raises(FormatError, match="pickle"):
        parse_etrecord(buf.getvalue())
    with pytest.raises(FormatError, match="pickle"):
        parse_etrecord(payload)


def _first_node(m, target_prefix="torch.ops.aten."):
    nodes = m["programs"][0]["export"]["graph_module"]["graph"]["nodes"]
    return next(n for n in nodes if n["target"].startswith(target_prefix))


@pytest.mark.parametrize("target", ["torch.ops.aten.no_such_op.default", "torch.hub.load", "builtins.eval",
                                    "torch.ops.aten.__class__.__init__", "os.system"])
def test_unknown_operator(target):
    def edit(m):
        _first_node(m)["target"] = target

    with pytest.raises(FormatError, match="unknown operator"):
        parse_etrecord(_tampered(edit))


def test_code_in_a_shape_expression_is_refused(tmp_path):
    marker = tmp_path / "pwned"

    def edit(m):
        graph = m["programs"][0]["export"]["graph_module"]["graph"]
        graph["sym_int_values"] = {"s0": {"as_expr": {
            "expr_str": f"__import__('os').system('touch {marker}')", "hint": None}}}

    with pytest.raises(FormatError, match="symbolic expression"):
        _parse_and_rebuild(_tampered(edit))
    assert not marker.exists()


_INJECTION = "x=__import__('os').system('touch {marker}')"


def _graph(m):
    return m["programs"][0]["export"]["graph_module"]


@pytest.mark.parametrize("edit", [
    lambda m, code: _first_node(m).update(name=code),
    lambda m, code: _graph(m)["signature"]["input_specs"][0]["parameter"].update(parameter_name=code),
    lambda m, code: _graph(m)["module_call_graph"][0]["signature"].update(forward_arg_names=[code]),
    lambda m, code: _graph(m)["graph"]["tensor_values"].update({code: {}}),
    lambda m, code: _graph(m)["module_call_graph"][0]["signature"].update(
        in_spec=json.dumps([1, {"type": "builtins.dict", "context": json.dumps([code]), "children_spec": []}])),
    lambda m, code: m["programs"][0]["delegates"].append({"graph": "", "attr": code, "backend_id": "B"}),
], ids=["node", "parameter", "forward_arg", "value_table", "pytree_spec", "delegate_attr"])
def test_code_in_a_name_is_refused(tmp_path, edit):
    """Names become identifiers in the Python torch.fx generates and compiles for a graph."""
    marker = tmp_path / "pwned"
    with pytest.raises(FormatError, match="not a plain"):
        _parse_and_rebuild(_tampered(lambda m: edit(m, _INJECTION.format(marker=marker))))
    assert not marker.exists()


def test_guard_code_is_dropped(tmp_path):
    marker = tmp_path / "pwned"

    def edit(m):
        m["programs"][0]["export"]["guards_code"] = [f"__import__('os').system('touch {marker}')"]

    record = parse_etrecord(_tampered(edit))
    edge = record.edge_dialect_program
    assert not edge._guards_code
    edge.module()(*compiled("mlp").inputs)
    assert not marker.exists()


def test_custom_objects_are_refused():
    def edit(m):
        _first_node(m)["inputs"][0]["arg"] = {"as_custom_obj": {"name": "obj", "class_fqn": "x.Y"}}

    with pytest.raises(FormatError, match="custom"):
        parse_etrecord(_tampered(edit))


@pytest.mark.parametrize("edit", [
    lambda m: m.update(format="something else"),
    lambda m: m.update(version=99),
    lambda m: m.update(debug_handle_map={"forward": [["0", [1]]]}),
    lambda m: m.update(edge_dialect_program={"forward": 7}),
    lambda m: m["programs"][0].update(state_dict=[["w", 10**6, True, False]]),
    lambda m: m.update(representative_inputs={"value": {"eval": "1"}}),
    lambda m: m.update(ops={"forward": [["x", []]]}),
])
def test_malformed_manifest(edit):
    with pytest.raises(FormatError):
        parse_etrecord(_tampered(edit))


def test_upstream_etrecord_is_named():
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:  # upstream's layout: an identifier entry, then pickled artifacts
        zf.writestr("ETRECORD_V0", b"")
        zf.writestr("debug_handle_map", b"{}")
    with pytest.raises(FormatError, match="upstream ExecuTorch ETRecord"):
        parse_etrecord(buf.getvalue())


def test_missing_file_is_not_a_format_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        parse_etrecord(tmp_path / "missing.etrecord")


def test_loading_never_unpickles(monkeypatch):
    data = compiled("mlp", delegated=True).data

    def refuse(*args, **kwargs):
        raise AssertionError("pickle used while loading an ETRecord")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    monkeypatch.setattr(torch.serialization, "load", refuse)
    record = parse_etrecord(data)
    record.edge_dialect_program.module()(*compiled("mlp").inputs)
    assert record.exported_program is not None
    assert record.program_info().methods["forward"].aot_intermediate_outputs()
