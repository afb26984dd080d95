"""The delegation explainer across the upstream boundary.

- Upstream's own XNNPACK program of a model with an op XNNPACK cannot run: etlab's explainer names
  that node with etlab's XNNPACK rules (upstream's ETRecord records no reasons), in
  get_delegation_info's table and in `etlab info` run as a command.
- etlab's XNNPACK program with its ETRecord saved in upstream's layout: upstream's Inspector reads the
  delegate map (each XNNPACK event under backend XnnpackBackend, one DELEGATE_CALL per partition), as
  it does for upstream's own XNNPACK records.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from etlab.devtools import get_delegation_info
from etlab.etrecord import parse_etrecord
from tests.interop.conftest import ET_REF, cache_key, cached_build, run_ref

pytestmark = pytest.mark.interop
REPO = Path(__file__).resolve().parents[2]

_MODEL = '''
import torch


class Planted(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)

    def forward(self, x):
        y = torch.relu(self.lin(x))
        return torch.cumsum(y, dim=1) * 2.0  # PLANT operator


def make_planted():
    torch.manual_seed(0)
    return Planted().eval(), (torch.randn(3, 6),)
'''


@pytest.fixture(scope="session")
def upstream_planted(ref_python) -> Path:
    """Upstream's XNNPACK export of the planted model: model.pte, model.etrecord, inputs.pt."""
    def build(tmp: Path) -> None:
        (tmp / "planted.py").write_text(_MODEL)
        run_ref(ref_python, ET_REF, "export", f"{tmp / 'planted.py'}:make_planted", "--xnnpack", "--out", tmp)

    key = cache_key()[:16] + hashlib.sha256(_MODEL.encode()).hexdigest()[:8]  # the model is part of the recipe
    return cached_build("xnnpack-explainer", key, build)


def test_upstream_xnnpack_record_explained_by_etlab_rules(upstream_planted):
    record = parse_etrecord(upstream_planted / "model.etrecord")
    df = get_delegation_info(record.edge_program("forward")).get_node_delegation_dataframe()
    cumsum = df[df["op"] == "aten.cumsum.default"]
    assert len(cumsum) == 1 and not cumsum.iloc[0]["delegated"]
    row = cumsum.iloc[0]
    assert (row["backend"], row["category"]) == ("XnnpackBackend", "operator") and "cumsum" in row["reason"]
    assert "PLANT operator" in row["source"]
    assert df[df["delegated"]]["backend"].eq("XnnpackBackend").all() and df["delegated"].sum() >= 2
    p = subprocess.run([sys.executable, "-m", "etlab.cli", "info", str(upstream_planted / "model.pte"),
                        "--etrecord", str(upstream_planted / "model.etrecord")],
                       capture_output=True, text=True, timeout=600, cwd=REPO)
    assert p.returncode == 0, p.stderr
    assert "operator: 1 node(s)" in p.stdout and "aten.cumsum.default" in p.stdout and "XnnpackBackend" in p.stdout


def test_upstream_inspector_reads_etlabs_xnnpack_delegate_map(ref_python, tmp_path):
    from etlab.compiler import to_edge_transform_and_lower
    from etlab.compiler.backends.xnnpack import XnnpackPartitioner
    from etlab.models import make_cnn

    model, inputs = make_cnn()
    et = to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=[XnnpackPartitioner()],
                                     generate_etrecord=True).to_executorch()
    et.write_to_file(tmp_path / "model.pte")
    record = et.get_etrecord()
    record.update_representative_inputs(list(inputs))
    record.save(tmp_path / "model.etrecord", format="upstream")
    torch.save(list(inputs), tmp_path / "inputs.pt")
    run_ref(ref_python, ET_REF, "run", tmp_path / "model.pte", "--inputs", tmp_path / "inputs.pt",
            "--etdump", tmp_path / "run.etdp")
    run_ref(ref_python, ET_REF, "inspect", tmp_path / "run.etdp", "--etrecord", tmp_path / "model.etrecord",
            "--json", tmp_path / "inspect.json")
    rows = json.loads((tmp_path / "inspect.json").read_text())["rows"]
    calls = [r for r in rows if r["event_name"] == "DELEGATE_CALL"]
    partitions = get_delegation_info(et.exported_program()).num_delegated_subgraphs
    assert len(calls) == partitions >= 1 and all(r["delegate_backend_name"] == "XnnpackBackend" for r in calls)
    per_op = [r for r in rows if r["is_delegated_op"]]
    assert len(per_op) > 10 and all(r["delegate_backend_name"] == "XnnpackBackend" for r in per_op)
    recorded = parse_etrecord(tmp_path / "model.etrecord")._delegate_map["forward"]
    assert len(recorded) == partitions and {e["name"] for e in recorded.values()} == {"XnnpackBackend"}
