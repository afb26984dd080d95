"""`BundledProgram` (upstream's `bundled_program.core`): a program and the test suites of its methods."""

from etlab.devtools._bundled_program import BundledProgram

__all__ = ["BundledProgram"]
