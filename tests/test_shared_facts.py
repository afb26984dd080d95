"""Facts kept in two places on purpose (a lighter import), held equal here."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("name", ["graph_view.js", "table_view.js"])
def test_the_lab_server_serves_the_notebook_widgets_view_modules(name):
    """The Lab server joins the GraphView module's parts itself (importing etlab.visualizer would load torch
    and widgets into the server); what it serves is what the notebook widget and the HTML report use."""
    pytest.importorskip("jupyter_server")
    from etlab.jupyter._handlers import view_module
    from etlab.visualizer._html import graph_module_source, static_text

    expected = graph_module_source() if name == "graph_view.js" else static_text(name)
    assert view_module(name) == expected
