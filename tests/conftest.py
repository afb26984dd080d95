"""Shared pytest fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# The CLI fits its tables to the terminal ($COLUMNS, else the tty's width, else 120). Tests see one
# width whatever terminal (or none) runs them; those about the width itself set their own.
os.environ["COLUMNS"] = "120"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


# Tests that drive Chromium carry the `browser` marker, so that `make test-fast` (-m "not browser ...")
# leaves them out: those using a browser fixture (tests/jupyter, tests/visualizer), or starting playwright
# themselves.
BROWSER_FIXTURES = frozenset({"browser", "lab_page"})


def pytest_configure(config):
    config.addinivalue_line("markers", "browser: drives Chromium through playwright (left out of make test-fast)")


# `make test` runs `-n 2 --dist loadgroup`: tests without an xdist_group go to whichever worker is free, one by
# one, so a file's module-scoped fixture (a compiled model, a JupyterLab server, Chromium, a search) was built on
# both workers whenever its tests were split between them. The tests that share such a fixture are kept on one
# worker (a group per file, per folder for a package-scoped fixture such as tests/jupyter's JupyterLab server; a
# group the test names itself wins): the fixture is built once.
def _shared_group(item) -> str | None:
    info = getattr(item, "_fixtureinfo", None)
    scopes = {defs[-1].scope for defs in info.name2fixturedefs.values() if defs} if info is not None else set()
    path = item.nodeid.split("::")[0]
    if "package" in scopes:
        return f"package:{path.rsplit('/', 1)[0]}"
    return f"file:{path}" if scopes & {"module", "class"} else None


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reads the xdist_group marks (it names the groups)
def pytest_collection_modifyitems(config, items):
    import inspect

    for item in items:
        fn = getattr(item, "function", None)
        if BROWSER_FIXTURES.intersection(getattr(item, "fixturenames", ())) or (
                fn is not None and "sync_playwright" in inspect.getsource(fn)):
            item.add_marker(pytest.mark.browser)
        group = _shared_group(item) if item.get_closest_marker("xdist_group") is None else None
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
