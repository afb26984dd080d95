"""The Lab viewers' delegation section, from a real server: what each backend took and why each node
was left out, grouped by category with counts, for an .etrecord and for a .pte (from the ETRecord of
the same program beside it; a .pte alone has no graph to explain)."""

from __future__ import annotations

import shutil

import pytest

from etlab.jupyter._service import Service

pytestmark = pytest.mark.xdist_group("jupyter")


def _check(delegation: dict) -> None:
    assert delegation["source"] == "mlp.etrecord" and delegation["method"] == "forward"
    assert delegation["backends"] == [{"backend": "DemoBackend", "partitions": 3, "nodes": 6}]
    # the MLP's two relus stay out: DemoBackend does not run relu
    assert [(g["category"], g["count"]) for g in delegation["groups"]] == [("operator", 2)]
    nodes = delegation["groups"][0]["nodes"]
    assert {n["op"] for n in nodes} == {"aten.relu.default"} and all("relu" in n["reason"] for n in nodes)
    assert all(n["source"] and n["hint"] for n in nodes) and delegation["unexplained"] == []


def test_etrecord_and_pte_views_explain_delegation(lab):
    status, rec = lab.get_json("etlab/api/view/etrecord?path=mlp.etrecord")
    assert status == 200
    _check(rec["delegation"])
    status, pte = lab.get_json("etlab/api/view/pte?path=mlp.pte")
    assert status == 200
    _check(pte["delegation"])


def test_pte_without_its_etrecord_has_no_delegation_section(lab_files, tmp_path):
    shutil.copy(lab_files.root / "mlp.pte", tmp_path / "mlp.pte")
    shutil.copy(lab_files.root / "mlp.etrecord", tmp_path / "other.etrecord")
    service = Service(tmp_path)
    assert service.pte("mlp.pte")["delegation"]["source"] == "other.etrecord"  # same program, any name
    (tmp_path / "other.etrecord").unlink()
    assert service.pte("mlp.pte")["delegation"] is None


@pytest.mark.parametrize("name", ["mlp.pte", "mlp.etrecord"])
def test_viewer_draws_the_delegation_section(lab_page, name):
    v = lab_page.open(name)
    box = v.locator("[data-role=delegation]")
    assert "DemoBackend: 3 partition(s), 6 node(s)" in box.locator("h3").inner_text()
    assert box.locator("[data-role=refusal-groups] tbody tr").all_inner_texts() == ["operator\t2"]
    rows = box.locator("[data-role=refusals] tbody tr")
    assert rows.count() == 2 and all("aten.relu.default" in t for t in rows.all_inner_texts())
    assert lab_page.take_errors() == []
