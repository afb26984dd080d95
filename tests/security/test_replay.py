"""ETRecord graph replay runs only pure allowlisted operators on dense tensors of supported dtypes."""

from __future__ import annotations

import pytest

from etlab.errors import FormatError
from etlab.etrecord import parse_etrecord
from tests.security._craft import (
    edge_graph,
    edit_etrecord,
    file_write_graph,
    run_isolated,
    small_etrecord,
    sparse_input_graph,
)


@pytest.fixture(scope="module")
def record_path(tmp_path_factory):
    return small_etrecord(tmp_path_factory.mktemp("etrecord") / "mlp.etrecord")


def test_untouched_record_replays(record_path):
    outputs = parse_etrecord(record_path).intermediate_outputs("forward")
    assert len(outputs) >= 3


def test_graph_calling_from_file_select_fill_is_refused_before_anything_runs(record_path, tmp_path):
    victim = tmp_path / "site-packages" / "evil.pth"
    victim.parent.mkdir()
    crafted = edit_etrecord(record_path, tmp_path / "evil.etrecord", file_write_graph(victim))
    record = parse_etrecord(crafted)  # the graph is well-formed: it parses
    with pytest.raises(FormatError, match=r"node 'ff': operator 'aten.from_file.default' is not one etlab replays"):
        record.intermediate_outputs("forward")
    assert not victim.exists()


def test_inspector_numeric_gap_on_the_crafted_record_writes_nothing(record_path, tmp_path):
    """The issue's path: the AOT side of the numeric gap (inspector.show(), etlab report) replays the graph."""
    from etlab.inspector import Inspector

    victim = tmp_path / "evil.pth"
    crafted = edit_etrecord(record_path, tmp_path / "evil.etrecord", file_write_graph(victim))
    inspector = Inspector(etdump_path=record_path.parent / "run.etdp", etrecord=str(crafted),
                          debug_buffer_path=record_path.parent / "run.bin")
    with pytest.raises(FormatError, match=r"node 'ff': operator 'aten.from_file.default'"):
        inspector.calculate_numeric_gap("MSE")
    assert not victim.exists()
    honest = Inspector(etdump_path=record_path.parent / "run.etdp", etrecord=str(record_path),
                       debug_buffer_path=record_path.parent / "run.bin")
    assert len(honest.calculate_numeric_gap("MSE")) > 0


def test_in_place_operator_alone_is_refused(record_path, tmp_path):
    def fill_weight(manifest):
        graph = edge_graph(manifest)
        weight = next(iter(graph["tensor_values"]))
        graph["tensor_values"]["filled"] = graph["tensor_values"][weight]
        graph["nodes"].insert(0, {
            "target": "torch.ops.aten.fill_.Scalar", "name": "filled", "metadata": {},
            "is_hop_single_tensor_return": None, "outputs": [{"as_tensor": {"name": "filled"}}],
            "inputs": [{"name": "self", "arg": {"as_tensor": {"name": weight}}, "kind": 1},
                       {"name": "value", "arg": {"as_int": 7}, "kind": 1}]})

    record = parse_etrecord(edit_etrecord(record_path, tmp_path / "fill.etrecord", fill_weight))
    with pytest.raises(FormatError, match=r"node 'filled': operator 'aten.fill_.Scalar'"):
        record.intermediate_outputs("forward")


def test_sparse_tensor_in_record_is_a_format_error_in_a_live_process(record_path, tmp_path):
    crafted = edit_etrecord(record_path, tmp_path / "sparse.etrecord", sparse_input_graph)
    proc = run_isolated(
        "from etlab.etrecord import parse_etrecord\n"
        "from etlab.errors import FormatError\n"
        "try:\n"
        f"    parse_etrecord({str(crafted)!r}).intermediate_outputs('forward')\n"
        "except FormatError as e:\n"
        "    print('refused:', e)\n")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "refused:" in proc.stdout and "layout 1 is not strided" in proc.stdout
    assert str(crafted) in proc.stdout  # the error names the file


def test_layout_argument_other_than_strided_is_refused(record_path, tmp_path):
    def sparse_arg(manifest):
        node = edge_graph(manifest)["nodes"][0]
        node["inputs"].append({"name": "layout", "arg": {"as_layout": 1}, "kind": 2})

    with pytest.raises(FormatError, match="layout argument 1 is not strided"):
        parse_etrecord(edit_etrecord(record_path, tmp_path / "layout.etrecord", sparse_arg))
