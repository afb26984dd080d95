"""Numeric gap when the debug buffer filled up mid-run (issue #28, torchvision Swin-V2's position-bias MLP)."""

from __future__ import annotations

import warnings

import torch

from etlab.compiler import to_edge
from etlab.inspector import Inspector
from etlab.runtime import Runtime


class _BiasMLP(torch.nn.Module):
    """A Linear over a (1, 15, 15, 2) table, as Swin-V2's continuous position bias: its Edge nodes (view,
    permute of the weight, addmm, view) share one debug handle; the permuted weight is the first to run."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(2, 512)

    def forward(self, x):
        return torch.relu(self.fc(x))


def _run(tmp_path, debug_buffer_size: int) -> Inspector:
    torch.manual_seed(0)
    model, inputs = _BiasMLP().eval(), (torch.randn(1, 15, 15, 2),)
    et = to_edge(torch.export.export(model, inputs), generate_etrecord=True).to_executorch()
    et.write_to_file(tmp_path / "m.pte")
    record = et.get_etrecord()
    record.update_representative_inputs(list(inputs))
    record.save(tmp_path / "m.etrecord")
    program = Runtime.get().load_program(tmp_path / "m.pte", enable_etdump=True, debug_buffer_size=debug_buffer_size)
    program.load_method("forward").execute(list(inputs))
    program.write_etdump_result_to_file(tmp_path / "run.etdp", tmp_path / "run.bin")
    return Inspector(etdump_path=tmp_path / "run.etdp", etrecord=tmp_path / "m.etrecord",
                     debug_buffer_path=tmp_path / "run.bin")


def _kernel_events(ins: Inspector) -> dict:
    return {e.name: e for b in ins.event_blocks for e in b.events if e.name.startswith("native_call_")}


def test_a_handle_whose_last_value_was_dropped_is_not_compared_with_an_earlier_one(tmp_path):
    """The buffer holds the (2, 512) permuted weight but not the addmm's (225, 512) result: the linear's handle
    has no runtime value. Before the fix the join took the permuted weight as the handle's output and failed
    ("the run logged a (2, 512) tensor, the ETRecord's graph computes (1, 15, 15, 512)")."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the dropped values are the premise, checked below
        ins = _run(tmp_path, 64 << 10)
    ev = _kernel_events(ins)
    permute, addmm = ev["native_call_permute_copy.out"], ev["native_call_addmm.out"]
    assert permute.debug_handles == addmm.debug_handles  # one handle for the whole linear
    assert tuple(permute.debug_data[0].shape) == (2, 512) and not addmm.debug_data
    assert permute.instruction_id < addmm.instruction_id

    df = ins.calculate_numeric_gap("MSE")
    assert df.empty  # neither the linear (addmm dropped) nor the relu (dropped) has a runtime value


def test_with_room_for_every_value_the_linear_is_compared_by_its_result(tmp_path):
    """The same model with a buffer large enough: the linear's handle is compared by addmm's output."""
    ins = _run(tmp_path, 8 << 20)
    addmm = _kernel_events(ins)["native_call_addmm.out"]
    df = ins.calculate_numeric_gap("MSE")
    linear = addmm.debug_handles if isinstance(addmm.debug_handles, tuple) else (addmm.debug_handles,)
    row = df[[h == linear for h in df["aot_debug_handle"]]]
    assert len(row) == 1 and row["runtime_ops"].iloc[0] == ["native_call_addmm.out"]
    assert tuple(row["aot_intermediate_output"].iloc[0].shape) == (1, 15, 15, 512)
    assert len(df) == 2 and all(g[0] < 1e-10 for g in df["gap"])
