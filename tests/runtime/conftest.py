"""Every runtime test runs on both cores (see _cores.py)."""

from tests.runtime._cores import runtime_core  # noqa: F401  (autouse fixture)
