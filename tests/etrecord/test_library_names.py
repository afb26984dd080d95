"""Parameter and module names as model libraries spell them (issue 28): torchvision's RegNet names
blocks `block1-0`. The ETRecord keeps them in both formats, the Inspector reads upstream's record of
such a model, and the graph check still refuses a path that is not letters, digits, '_', '-' and dots."""

from __future__ import annotations

import textwrap

import pytest
import torch

from etlab.compiler import to_edge
from etlab.errors import FormatError
from etlab.etrecord import parse_etrecord
from etlab.etrecord._graph_check import check_name, check_path
from tests.interop.conftest import ET_REF, ref_python, run_ref  # noqa: F401  (ref_python: the fixture)

_MODEL = textwrap.dedent('''
    import torch
    from torch import nn

    class Dashed(nn.Module):
        """A RegNet-like stage: blocks named 'block1-0', 'block1-1' and a buffer 'scale-1'."""

        def __init__(self):
            super().__init__()
            self.block1 = nn.Sequential()
            self.block1.add_module("block1-0", nn.Linear(4, 4))
            self.block1.add_module("block1-1", nn.ReLU())
            self.register_buffer("scale-1", torch.full((4,), 2.0))

        def forward(self, x):
            return self.block1(x) * getattr(self, "scale-1")

    def make():
        torch.manual_seed(0)
        return Dashed().eval(), (torch.randn(2, 4),)
''')


def _make():
    scope: dict = {}
    exec(compile(_MODEL, "dashed_model.py", "exec"), scope)
    return scope["make"]()


def _targets(ep) -> set[str]:
    return {s.target for s in ep.graph_signature.input_specs if s.target}


@pytest.mark.parametrize("fmt", ["etlab", "upstream"])
def test_dashed_names_round_trip(tmp_path, fmt):
    model, inputs = _make()
    et = to_edge(torch.export.export(model, inputs, strict=False), generate_etrecord=True).to_executorch()
    record = et.get_etrecord()
    path = tmp_path / "model.etrecord"
    record.save(path, **({"format": fmt} if fmt == "upstream" else {}))
    back = parse_etrecord(path)
    want = {"block1.block1-0.weight", "block1.block1-0.bias", "scale-1"}
    assert want <= _targets(back.exported_program)
    assert want <= _targets(back.edge_dialect_program)
    assert {"block1.block1-0.weight", "block1.block1-0.bias"} <= set(back.exported_program.state_dict)


def test_path_check_keeps_refusing_what_is_not_a_name():
    check_path("trunk_output.block1.block1-0.proj.0.weight", "f", "parameter_name")
    for bad in ('block"-0.weight', "a\\b", "a b", "a..b", ".a", "a\nb", "a)", "é"):
        with pytest.raises(FormatError, match="is not a plain dotted path"):
            check_path(bad, "f", "parameter_name")
    with pytest.raises(FormatError, match="plain"):
        check_name("p_block1-0", "f", "name")  # value names stay Python identifiers


def test_hostile_parameter_path_in_a_record_is_refused(tmp_path):
    """A record whose parameter path smuggles a quote is refused naming the path (both formats' reader)."""
    import io
    import zipfile

    model, inputs = _make()
    record = to_edge(torch.export.export(model, inputs, strict=False), generate_etrecord=True).to_executorch() \
        .get_etrecord()
    buf = io.BytesIO()
    record.save(buf)
    entries = {}
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as zf:
        for n in zf.namelist():
            entries[n] = zf.read(n)
    changed = 0
    for name, data in entries.items():
        if b"block1-0" in data and name.endswith(".json"):
            entries[name] = data.replace(b"block1.block1-0.weight", b'block1.block1\\"0.weight')
            changed += 1
    assert changed
    out = tmp_path / "hostile.etrecord"
    with zipfile.ZipFile(out, "w") as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
    with pytest.raises(FormatError, match="is not a plain dotted path"):
        parse_etrecord(out)


@pytest.mark.interop
@pytest.mark.slow
def test_inspector_reads_upstreams_record_of_a_dashed_model(tmp_path, ref_python):  # noqa: F811
    from etlab.inspector import Inspector
    from etlab.runtime import DebugLevel, Runtime

    (tmp_path / "dashed_model.py").write_text(_MODEL)
    out = tmp_path / "up"
    run_ref(ref_python, ET_REF, "export", f"{tmp_path / 'dashed_model.py'}:make", "--out", out)
    inputs = torch.load(out / "inputs.pt", weights_only=True)
    program = Runtime.get().load_program(str(out / "model.pte"), enable_etdump=True,
                                         etdump_debug_level=DebugLevel.INTERMEDIATE_OUTPUTS)
    program.load_method("forward").execute(list(inputs))
    program.write_etdump_result_to_file(str(out / "run.etdp"), str(out / "run.bin"))
    inspector = Inspector(etdump_path=str(out / "run.etdp"), etrecord=str(out / "model.etrecord"),
                          debug_buffer_path=str(out / "run.bin"))
    assert "block1.block1-0.weight" in _targets(parse_etrecord(out / "model.etrecord").exported_program)
    gap = inspector.calculate_numeric_gap("MSE")
    assert len(gap) >= 3
    assert all(float(v) < 1e-10 for v in gap["gap"].explode())
