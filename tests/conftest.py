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


def pytest_collection_modifyitems(config, items):
    import inspect

    for item in items:
        fn = getattr(item, "function", None)
        if BROWSER_FIXTURES.intersection(getattr(item, "fixturenames", ())) or (
                fn is not None and "sync_playwright" in inspect.getsource(fn)):
            item.add_marker(pytest.mark.browser)
