"""read_program_info: the Inspector's view of an etlab ETRecord, read without importing torch, must be
what parse_etrecord(...).program_info() gives; graphs, reference outputs and the AOT replay come from
the full reader on first use; a malformed map fails at once, a malformed program when it is used."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
import torch

from etlab.errors import FormatError
from etlab.etrecord import ETRecord, parse_etrecord, read_program_info
from tests.etrecord.conftest import compiled, read_entries, write_entries

_FIELDS = ("instruction_debug_handles", "instruction_handle_occurrences", "instruction_num_outputs", "delegates",
           "ops")


def _assert_same_program_info(quick, full):
    """The quick reader's ProgramInfo has the full reader's methods, their tables and graph names."""
    assert list(quick.methods) == list(full.methods)
    for m in full.methods:
        for f in _FIELDS:
            assert getattr(quick.methods[m], f) == getattr(full.methods[m], f), (m, f)
        assert (quick.methods[m].aot_intermediate_outputs is None) == (full.methods[m].aot_intermediate_outputs is None)
    assert sorted(quick.graphs) == sorted(full.graphs)


@pytest.mark.parametrize("name,delegated", [("mlp", False), ("cnn", True)])
def test_same_program_info_as_the_full_reader(name, delegated):
    data = compiled(name, delegated).data
    quick, full = read_program_info(data), parse_etrecord(data).program_info()
    _assert_same_program_info(quick, full)
    assert len(quick.graphs["edge_dialect_exported_program"].graph.nodes) == \
        len(full.graphs["edge_dialect_exported_program"].graph.nodes)


def test_reference_outputs_and_replay_come_from_the_file():
    c = compiled("mlp")
    record = ETRecord.from_sources(c.executorch.get_etrecord(), representative_inputs=list(c.inputs))
    record.update_reference_outputs({"forward": [[c.model(*c.inputs).detach()]]})
    path_data = io.BytesIO()
    record.save(path_data)
    info = read_program_info(path_data.getvalue())
    refs = info.methods["forward"].reference_outputs
    assert len(refs) == 1 and torch.equal(refs[0][0], c.model(*c.inputs).detach())
    aot = info.methods["forward"].aot_intermediate_outputs()
    assert aot and all(isinstance(k, tuple) for k in aot)


def test_reading_an_etlab_record_imports_no_torch(tmp_path):
    path = tmp_path / "model.etrecord"
    path.write_bytes(compiled("mlp").data)
    code = ("import sys; from etlab.etrecord import read_program_info; "
            f"info = read_program_info({str(path)!r}); assert info.methods['forward'].ops; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"


def test_format_constants_agree_with_the_writer():
    from etlab.etrecord import _archive, _etrecord

    assert (_archive.FORMAT, _archive.VERSION) == (_etrecord.FORMAT, _etrecord.VERSION)


def test_a_malformed_map_fails_at_once_a_malformed_program_when_used():
    manifest, blob = read_entries(compiled("mlp").data)
    bad_map = dict(manifest, debug_handle_map={"forward": [[0, "x"]]})
    with pytest.raises(FormatError, match="debug handles must be a list of integers"):
        read_program_info(write_entries(bad_map, blob))
    bad_program = dict(manifest, programs=[{"export": "not a program"}] * len(manifest["programs"]))
    info = read_program_info(write_entries(bad_program, blob))  # maps and ops are fine
    assert info.methods["forward"].ops
    with pytest.raises(FormatError):
        info.graphs["edge_dialect_exported_program"]


@pytest.mark.parametrize("name,delegated", [("mlp", False), ("cnn", True)])
def test_upstream_layout_same_program_info_as_the_full_reader(name, delegated):
    """Upstream's layout (written by etlab's upstream writer): op tables resolved now, values and graphs later."""
    buf = io.BytesIO()
    c = compiled(name, delegated)
    record = ETRecord.from_sources(c.executorch.get_etrecord(), representative_inputs=list(c.inputs))
    record.save(buf, format="upstream")
    quick, full = read_program_info(buf.getvalue()), parse_etrecord(buf.getvalue()).program_info()
    _assert_same_program_info(quick, full)
    aot = quick.methods["forward"].aot_intermediate_outputs()
    assert aot.keys() == full.methods["forward"].aot_intermediate_outputs().keys()
