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
