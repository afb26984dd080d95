"""The committed generated code matches what `make schemas` produces from the .fbs files."""

from __future__ import annotations

import filecmp
from pathlib import Path

from etlab.schema import _generate


def _tree(root: Path) -> dict[str, Path]:
    return {str(p.relative_to(root)): p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


def test_generated_code_is_up_to_date(tmp_path):
    fresh = tmp_path / "gen"
    _generate.generate(fresh)
    committed, regenerated = _tree(_generate.OUT_DIR), _tree(fresh)
    assert sorted(committed) == sorted(regenerated), "run `make schemas`: generated file set differs"
    stale = [name for name in committed if not filecmp.cmp(committed[name], regenerated[name], shallow=False)]
    assert not stale, f"run `make schemas`: stale generated files {stale}"


def test_layouts_follow_the_fbs_field_order():
    from etlab.schema._generated.layouts import LAYOUTS

    tensor = LAYOUTS["tables"]["program"]["Tensor"]
    assert [row[0] for row in tensor][:4] == ["scalar_type", "storage_offset", "sizes", "dim_order"]
    evalue = LAYOUTS["tables"]["program"]["EValue"]
    assert evalue == [("val", 1, "union", "program.KernelTypes", None, None)]  # slot 0 is the union's type tag
