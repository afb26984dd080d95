"""`make demo`: the main job. Until the compiler and runtime land it reports the environment and
round-trips a program through the formats module."""

from __future__ import annotations

import platform

import torch

import etlab
from etlab.schema import program as pte


def main() -> None:
    print(f"etlab {etlab.__version__} on Python {platform.python_version()}, torch {torch.__version__}")
    prog = pte.Program(version=0, execution_plan=[pte.ExecutionPlan(name="forward", operators=[
        pte.Operator(name="aten::add", overload="out")], non_const_buffer_sizes=[0])])
    blob = pte.serialize_pte(prog)
    back = pte.deserialize_pte(blob).program
    print(f"formats: wrote and re-read a {len(blob)}-byte .pte with method {back.execution_plan[0].name!r}")


if __name__ == "__main__":
    main()
