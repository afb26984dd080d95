"""The server's JSON against its contract (the etlab/jupyter/_contract package, TypeScript: labextension/src/
contract.d.ts): what every endpoint answers for real files holds to the TypedDicts, and the .d.ts the
extension compiles against is the one generated from them, also where etlab cannot be imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from etlab.jupyter import _contract as C
from etlab.jupyter._service import Service

pytestmark = pytest.mark.xdist_group("jupyter")

REPO = Path(__file__).resolve().parents[2]


def _sent(value):
    """The value as the browser receives it (the worker sends json.dumps of it)."""
    return json.loads(json.dumps(value, allow_nan=False))


@pytest.fixture(scope="module")
def service(lab_files):
    return Service(lab_files.root)


@pytest.mark.parametrize("call, reply", [
    (lambda s: s.stat("mlp.pte"), C.Stat),
    (lambda s: s.pte("mlp.pte"), C.PteView),
    (lambda s: s.etrecord("mlp.etrecord"), C.EtrecordView),
    (lambda s: s.bpte("mlp.bpte"), C.BpteView),
    (lambda s: s.etdp("run.etdp"), C.EtdpView),                        # paired with the .etrecord beside it
    (lambda s: s.etdp("run.etdp", "mlp.pte"), C.EtdpView),             # the .pte: its graph and memory plan
    (lambda s: s.etdp("other_run.etdp"), C.EtdpView),                  # no program of this run beside it
    (lambda s: s.etdp("run.etdp", part="graphs"), C.EtdpGraphs),
    (lambda s: s.compare("run.etdp", "run2.etdp", "mlp.pte"), C.CompareView),
    (lambda s: s.compare("run.etdp", "run2.etdp"), C.CompareView),
    (lambda s: s.artifacts(""), C.Artifacts),
], ids=["stat", "pte", "etrecord", "bpte", "etdp", "etdp-pte", "etdp-unpaired", "etdp-graphs", "compare-pte",
        "compare", "artifacts"])
def test_every_endpoint_answers_what_the_contract_says(service, call, reply):
    value = _sent(call(service))
    C.check(value, reply, reply.__name__)


def test_the_etdp_view_names_its_parts(service):
    """The optional parts the contract allows are there when they should be (the check alone would pass
    a view that dropped them)."""
    with_pte = _sent(service.etdp("run.etdp", "mlp.pte"))
    assert with_pte["paired"] == "pte" and with_pte["graphs"] and with_pte["memory"] and with_pte["steps"] > 0
    with_record = _sent(service.etdp("run.etdp"))
    assert with_record["paired"] == "etrecord" and with_record["graphs_pending"]
    graphs = _sent(service.etdp("run.etdp", part="graphs"))["graphs"]
    assert {g["kind"] for g in graphs} >= {"aten", "edge"}
    assert any(n["latency"] for g in graphs for n in g["nodes"])


@pytest.mark.slow
def test_verify_report_is_what_the_contract_says(service):
    C.check(_sent(service.verify("mlp.bpte")), C.VerifyReport, "VerifyReport")


def test_check_refuses_what_the_contract_does_not_say():
    good = {"path": "a.pte", "size": 3, "mtime_ns": "12"}
    C.check(good, C.Stat)
    for bad, says in [({**good, "size": "3"}, "Stat.size: expected int"),
                      ({**good, "extra": 1}, "does not name: ['extra']"),
                      ({"path": "a.pte", "size": 3}, "no 'mtime_ns'"),
                      ({**good, "size": True}, "expected int")]:
        with pytest.raises(C.ContractError, match=says.replace("[", r"\[").replace("]", r"\]")):
            C.check(bad, C.Stat, "Stat")
    with pytest.raises(C.ContractError, match=r"rows\[0\]\.focus"):
        C.check({"a": "x", "b": "y", "unit": "ms", "columns": [], "graphs": [], "warning": None,
                 "rows": [{"name": "n", "instruction": 1, "ops": "", "p50_a": 1.0, "p50_b": None, "delta": None,
                           "ratio": None, "focus": {"name": None}}]}, C.CompareView, "view")
    with pytest.raises(C.ContractError, match="expected one of"):
        C.check({"path": "x", "kind": "zip", "size": 1, "mtime": 0.0, "program": None, "error": None},
                C.ArtifactFile)


def test_the_typescript_contract_is_generated_from_the_typeddicts():
    """labextension/src/contract.d.ts is _contract_ts's output for _contract as it is now (run as the
    Makefile runs it: a script by path, before etlab is installed)."""
    out = REPO / "labextension" / "src" / "contract.d.ts"
    p = subprocess.run([sys.executable, str(REPO / "etlab" / "jupyter" / "_contract_ts.py"), str(out), "--check"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    text = out.read_text(encoding="utf-8")
    assert "export interface IPteView {" in text and "  delegation: IDelegation | null;" in text
    assert "  memory?: IMemoryBlock[];" in text  # NotRequired -> optional


# Run in a Python that cannot import etlab: isolated (-I: no script folder, no PYTHONPATH) and without site
# (-S: not the venv's site-packages, where etlab is installed), as the generator runs before etlab is installed.
_NO_ETLAB = [sys.executable, "-I", "-S"]


def test_the_contract_loads_by_path_where_etlab_cannot_be_imported(tmp_path):
    """The generator loads the _contract package from its folder alone: in a Python without etlab it writes the
    same .d.ts as the committed one, and the loaded contract checks values (its ContractError a ValueError)."""
    gen = REPO / "etlab" / "jupyter" / "_contract_ts.py"
    no_etlab = subprocess.run([*_NO_ETLAB, "-c", "import etlab"], capture_output=True, text=True, timeout=120)
    assert no_etlab.returncode != 0 and "No module named 'etlab'" in no_etlab.stderr  # else the test proves nothing
    out = tmp_path / "contract.d.ts"
    p = subprocess.run([*_NO_ETLAB, str(gen), str(out)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert out.read_text(encoding="utf-8") == (REPO / "labextension" / "src" / "contract.d.ts").read_text(
        encoding="utf-8")
    script = f"""
import runpy, sys
C = runpy.run_path({str(gen)!r})["load_contract"]()
assert not any(m == "etlab" or m.startswith("etlab.") for m in sys.modules), sorted(sys.modules)
C.check({{"path": "a.pte", "size": 3, "mtime_ns": "12"}}, C.Stat)
try:
    C.check({{"path": "a.pte", "size": "3", "mtime_ns": "12"}}, C.Stat, "Stat")
except ValueError as e:
    print(type(e).__name__, e)
"""
    p = subprocess.run([*_NO_ETLAB, "-c", script], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "ContractError Stat.size: expected int, got str '3'"
