"""Crafted files raise the documented error naming the file, never a bare ValueError (issue 24, item 5).

- a .bpte whose test-case tensor is qint32 (torch.frombuffer would crash the process on it) or has a
  dim order that is not a permutation: FormatError naming the file, the method, the test case and
  the value, when the program is loaded (before any value is decoded) and when its suites are read;
- the numeric gap on a run whose intermediate outputs do not have the recorded graph's shapes: a
  FormatError naming the ETDump and the debug handle, not "shapes differ".
"""

from __future__ import annotations

import pytest
import torch

from etlab.errors import FormatError
from etlab.schema import ScalarType, deserialize_bundled_program, serialize_bundled_program
from tests.runtime._programs import add_chain


def _bpte(tmp_path, edit, name: str = "crafted.bpte"):
    """A .bpte of a 3-add chain with one test case, `edit(input tensor)` applied to its schema."""
    from etlab.devtools import (
        BundledProgram,
        MethodTestCase,
        MethodTestSuite,
        serialize_from_bundled_program_to_flatbuffer,
    )

    pte, w = add_chain(3)
    x = torch.ones(2, 3)
    data = serialize_from_bundled_program_to_flatbuffer(BundledProgram(
        None, [MethodTestSuite("forward", [MethodTestCase([x], [x + 3 * w])])], pte_file=pte))
    schema = deserialize_bundled_program(data, what="honest")
    edit(schema.method_test_suites[0].test_cases[0].inputs[0].val)
    path = tmp_path / name
    path.write_bytes(bytes(serialize_bundled_program(schema)))
    return path


def _qint32(t) -> None:
    t.scalar_type = ScalarType.QINT32


def _bad_dim_order(t) -> None:
    t.dim_order = [1, 1]


@pytest.mark.parametrize("edit, defect", [
    (_qint32, "scalar type torch.qint32 is not supported for test-case values"),
    (_bad_dim_order, r"dim_order \[1, 1\] is not a permutation of its 2 dimensions"),
])
def test_crafted_bundled_inputs_are_format_errors_naming_the_file(tmp_path, edit, defect):
    from etlab.devtools import load_bundled_program, method_test_suites_from_schema, verify_bundled_program

    path = _bpte(tmp_path, edit)
    where = rf"{path}: method 'forward': test case 0: input 0: "
    with pytest.raises(FormatError, match=f"^{where}{defect}"):
        verify_bundled_program(load_bundled_program(path))
    with pytest.raises(FormatError, match=f"^{where}{defect}"):
        load_bundled_program(str(path))
    schema = deserialize_bundled_program(path.read_bytes(), what=str(path))
    with pytest.raises(FormatError, match=f"^{where}{defect}"):
        method_test_suites_from_schema(schema, what=str(path))


def test_honest_bundled_program_still_verifies(tmp_path):
    from etlab.devtools import load_bundled_program, verify_bundled_program

    reports = verify_bundled_program(load_bundled_program(_bpte(tmp_path, lambda t: None)))
    assert len(reports) == 1 and reports[0].ok


def test_numeric_gap_on_a_run_of_other_shapes_names_the_run(tmp_path):
    """A run's logged intermediate whose shape is not the recorded graph's: FormatError naming the
    ETDump, the debug handle and both shapes (was: ValueError "shapes differ")."""
    from etlab.inspector import Inspector
    from etlab.schema import deserialize_etdump, serialize_etdump
    from tests.security._craft import small_etrecord

    record = small_etrecord(tmp_path / "mlp.etrecord")
    honest = Inspector(etdump_path=tmp_path / "run.etdp", etrecord=str(record), debug_buffer_path=tmp_path / "run.bin")
    assert len(honest.calculate_numeric_gap("MSE")) > 0
    etdump = deserialize_etdump((tmp_path / "run.etdp").read_bytes(), what="run.etdp")
    shrunk = None
    for event in (e for run in etdump.run_data for e in run.events):
        entry = event.debug_event.debug_entry if event.debug_event else None
        if entry is not None and entry.tensor is not None and len(entry.tensor.sizes) == 2 \
                and entry.tensor.sizes[1] > 1:
            rows, cols = entry.tensor.sizes
            entry.tensor.sizes, entry.tensor.strides = [rows, cols - 1], [cols - 1, 1]  # fewer bytes: still inside
            shrunk = (rows, cols)
    assert shrunk is not None
    crafted = tmp_path / "crafted.etdp"
    crafted.write_bytes(bytes(serialize_etdump(etdump)))
    inspector = Inspector(etdump_path=crafted, etrecord=str(record), debug_buffer_path=tmp_path / "run.bin")
    expected = (rf"^{crafted} \(debug buffer .*run.bin\): debug handle \[\d+\] \([\w, ]+\): the run logged a "
                rf"\(\d+, \d+\) tensor, the ETRecord's graph computes \(\d+, \d+\)")
    with pytest.raises(FormatError, match=expected):
        inspector.calculate_numeric_gap("MSE")
