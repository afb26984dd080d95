"""notebooks/01-05 run top to bottom in a real kernel (ipykernel of this Python), and are stored
without outputs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).parents[2] / "notebooks").glob("0*.ipynb"))

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("notebooks")]


def test_the_notebooks_are_there():
    assert [p.name[:2] for p in NOTEBOOKS] == ["01", "02", "03", "04", "05"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, tmp_path):
    import nbformat  # here, not at collection: importing nbformat and nbclient costs seconds every run
    from jupyter_client.kernelspec import NATIVE_KERNEL_NAME
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") and not c.get("execution_count") for c in nb.cells if c.cell_type == "code"), \
        f"{path.name}: outputs must be stripped"
    # they open on the project's kernel ("make kernel" registers it); here the python3 kernel spec of
    # ipykernel runs them, which is sys.executable: the same venv as the tests
    assert nb.metadata.kernelspec.name == "etlab", f"{path.name}: declare the etlab kernel"
    assert NATIVE_KERNEL_NAME == "python3", sys.executable
    client = NotebookClient(nb, kernel_name="python3", timeout=300, resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    # executed and saved with its widget state, a notebook stays small: plotly.js is loaded
    # once per page, not stored in every widget (the getting-started notebook was 24.5 MB)
    size = len(nbformat.writes(nb).encode())
    assert size < 2_000_000, f"{path.name}: {size / 1e6:.1f} MB executed"
    # every view's output also carries its static copy, for saved notebooks and nbconvert
    htmls = [o["data"].get("text/html", "") for c in nb.cells for o in c.get("outputs", []) if "data" in o
             and "application/vnd.jupyter.widget-view+json" in o["data"]]
    assert htmls and all("widget-fallback" in h for h in htmls)
