"""The viewers under a strict Content-Security-Policy: scripts only from the server itself (no blob: or
data: URLs), as a locked-down JupyterLab deployment serves it. The view modules are ES module files the
extension imports by URL (etlab/jupyter/_handlers.view_module), each fetched once per page however
many viewers use it; a blob: URL import (how they were loaded before) is refused by this policy."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.jupyter.conftest import LabPage

pytestmark = pytest.mark.xdist_group("jupyter")

# what JupyterLab itself needs ('unsafe-eval': its settings validator compiles schemas), nothing for etlab
POLICY = "script-src 'self' 'unsafe-inline' 'unsafe-eval'; worker-src 'self'; object-src 'none'"


class _StrictBrowser:
    """Hands out pages whose documents carry POLICY (added to the server's response)."""

    def __init__(self, browser):
        self.browser = browser

    def new_page(self, **kwargs):
        page = self.browser.new_page(**kwargs)

        def add_policy(route):
            if route.request.resource_type != "document":
                return route.continue_()
            response = route.fetch()
            route.fulfill(response=response, headers={**response.headers, "content-security-policy": POLICY})

        page.route("**/lab*", add_policy)
        return page


@pytest.fixture(scope="module")
def strict_page(browser, lab):
    page = LabPage(_StrictBrowser(browser), lab)
    yield page
    page.page.close()


def test_viewers_draw_under_a_strict_policy_and_load_each_module_once(strict_page):
    modules = Counter()

    def count(request) -> None:
        if "/etlab/modules/" in request.url:
            modules.update([request.url.split("/etlab/modules/")[1].split("?")[0]])

    strict_page.page.on("request", count)
    # the policy is in force: a module from a blob: URL, as the views were loaded before, is refused
    refused = strict_page.page.evaluate("""async () => {
      const url = URL.createObjectURL(new Blob(["export default 1;"], { type: "text/javascript" }));
      try { await import(url); return false; } catch (err) { return true; }
    }""")
    assert refused
    strict_page.take_errors()
    v = strict_page.open("mlp.pte")
    strict_page.wait_graph(v)
    assert v.locator("svg.canvas").first.get_attribute("data-node-count") == "7"
    v = strict_page.open("run.etdp")
    v.locator("[data-etlab-view=table] tbody tr").first.wait_for(timeout=60_000)
    strict_page.wait_graph(v)
    strict_page.shot("csp-etdp-light")
    violations = [e for e in strict_page.take_errors() if "Content Security Policy" in e or "etlab" in e]
    assert violations == []
    assert {"graph_view.js", "graph_pane.js", "graph_common.js", "graph_layout.js", "format.js", "elements.js",
            "table_view.js", "theme.css"} <= set(modules)
    assert max(modules.values()) == 1, modules  # two viewers, one load of each module
