"""The numeric gap replays the operator forms upstream's ETRecords keep (issue 24, item 7).

Upstream's XNNPACK partitioner asks `to_edge_transform_and_lower` to keep some operators whole
(`ops_to_not_decompose`: max_pool2d, hardswish, prelu, elu, linear, upsample_bilinear2d.vec), so
the edge program its ETRecord records holds `aten.max_pool2d.default` where etlab's own holds
`max_pool2d_with_indices`. Those functional forms are on the replay allowlist; their in-place and
random relatives are not. The interop test exports a CNN with them through upstream 1.5.1, runs
it there, and computes the numeric gap with etlab's Inspector on upstream's files.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from etlab import ops

# What upstream 1.5.1's XNNPACK partitioner keeps whole (its configs' get_original_aten).
UPSTREAM_KEPT = [torch.ops.aten.max_pool2d.default, torch.ops.aten.hardswish.default, torch.ops.aten.prelu.default,
                 torch.ops.aten.elu.default, torch.ops.aten.linear.default, torch.ops.aten.upsample_bilinear2d.vec]


@pytest.mark.parametrize("op", UPSTREAM_KEPT, ids=str)
def test_upstream_kept_forms_are_replayed(op):
    assert ops.allows_replay(op)


@pytest.mark.parametrize("op", [torch.ops.aten.hardswish_.default, torch.ops.aten.elu_.default,
                                torch.ops.aten.dropout.default, torch.ops.aten.rrelu.default], ids=str)
def test_their_in_place_and_random_relatives_are_not(op):
    assert not ops.allows_replay(op)


_FACTORY = '''
import torch


class KeptWhole(torch.nn.Module):
    """A small CNN with every operator upstream's XNNPACK partitioner keeps whole."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.prelu = torch.nn.PReLU(8)
        self.fc = torch.nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        y = torch.nn.functional.hardswish(self.conv(x))
        y = torch.nn.functional.max_pool2d(self.prelu(y), 2)
        y = torch.nn.functional.elu(y)
        y = torch.nn.functional.interpolate(y, scale_factor=0.5, mode="bilinear", align_corners=False)
        return self.fc(y.flatten(1))


def make():
    torch.manual_seed(0)
    return KeptWhole().eval(), (torch.randn(1, 3, 16, 16),)
'''


@pytest.fixture(scope="module")
def upstream_xnnpack_run():
    from tests.interop.conftest import ET_REF, cached_build, run_ref, setup_reference

    try:
        ref = setup_reference()
    except RuntimeError as e:
        pytest.fail(f"upstream ExecuTorch reference environment unavailable:\n{e}", pytrace=False)
    key = hashlib.sha256(_FACTORY.encode() + Path(ET_REF).read_bytes()).hexdigest()[:24]

    def build(out: Path) -> None:
        (out / "kept_whole.py").write_text(_FACTORY)
        run_ref(ref, ET_REF, "export", f"{out / 'kept_whole.py'}:make", "--out", out, "--xnnpack")
        run_ref(ref, ET_REF, "run", out / "model.pte", "--inputs", out / "inputs.pt", "--outputs", out / "out.pt",
                "--etdump", out / "run.etdp", "--debug-buffer", out / "run.bin")

    return cached_build("upstream-kept-whole", key, build)


@pytest.mark.interop
def test_numeric_gap_on_upstream_xnnpack_etrecord_with_kept_ops(upstream_xnnpack_run):
    import json
    import zipfile

    from etlab.inspector import Inspector

    d = upstream_xnnpack_run
    with zipfile.ZipFile(d / "model.etrecord") as zf:
        graph = json.loads(zf.read("edge_dialect_exported_program/forward"))["graph_module"]["graph"]
    targets = {n["target"].rpartition(".ops.")[2] for n in graph["nodes"]}
    assert "aten.max_pool2d.default" in targets and "aten.hardswish.default" in targets, targets  # as the issue saw
    inspector = Inspector(etdump_path=d / "run.etdp", etrecord=str(d / "model.etrecord"),
                          debug_buffer_path=d / "run.bin")
    gap = inspector.calculate_numeric_gap("MSE")
    assert len(gap) > 0
    assert all(g[0] < 1e-6 for g in gap["gap"]), gap[["aot_ops", "gap"]]
