"""`etlab inspect run.etdp --etrecord model.etrecord` reads the record without importing torch, for
etlab's records and upstream ExecuTorch's alike (upstream's op tables are read from the programs'
torch.export JSON: op types from the targets' names), with the op types torch itself resolves."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

from etlab.etrecord import read_program_info
from etlab.etrecord._program_json import EDGE_OP_PREFIX
from etlab.etrecord._upstream_json import program_bases
from tests.interop.conftest import ref_python, upstream_artifacts  # noqa: F401  (upstream's files)
from tests.interop.test_upstream_xnnpack_views import xnnpack  # noqa: F401

ETLAB = str(Path(sys.executable).with_name("etlab"))  # the console script the README tells users to run
_IMPORT = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)\s*$")


def imported_modules(cmd: list[str]) -> tuple[subprocess.CompletedProcess, set[str]]:
    """Runs `cmd` with Python's import log on (-X importtime, through the environment so the installed
    console script runs as users run it); returns the process and every module it imported."""
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"})
    modules = {m.group(1) for line in out.stderr.splitlines() if (m := _IMPORT.match(line))}
    return out, modules


def _timed_run(pte: Path, inputs: Path, out: Path) -> Path:
    """An ETDump of timings only (no intermediate tensors: showing those needs torch) of upstream's
    program run 3 times on etlab's runtime."""
    import torch

    from etlab.runtime import Runtime

    program = Runtime.get().load_program(pte, enable_etdump=True)
    method = program.load_method("forward")
    for _ in range(3):
        method.execute(list(torch.load(inputs, weights_only=True)))
    program.write_etdump_result_to_file(out)
    return out


def test_cli_inspect_with_upstream_records_imports_no_torch(upstream_artifacts, xnnpack, tmp_path):  # noqa: F811
    for i, d in enumerate([upstream_artifacts["cnn"], xnnpack]):  # portable, XNNPACK
        run = _timed_run(d / "model.pte", d / "inputs.pt", tmp_path / f"run{i}.etdp")
        for extra in ([], ["--etrecord", str(d / "model.etrecord"), "--format", "json"]):
            out, modules = imported_modules([ETLAB, "inspect", str(run), *extra])
            assert out.returncode == 0, out.stderr[-3000:]
            assert "etlab.inspector._cli" in modules  # the log is read: the command's own modules are in it
            assert not {m for m in modules if m == "torch" or m.startswith("torch.")}, (d, extra)
            if extra:
                assert "etlab.etrecord._upstream_json" in modules
                rows = json.loads(out.stdout)  # the events joined with the record's ops
                assert any(op.startswith("aten.") for r in rows for op in r["op_types"]), d


def test_cli_inspect_with_an_etlab_record_imports_no_torch(tmp_path):
    import torch

    from etlab.compiler import to_edge
    from etlab.models import make_mlp
    from etlab.runtime import Runtime

    model, inputs = make_mlp()
    et = to_edge(torch.export.export(model, inputs), generate_etrecord=True).to_executorch()
    et.write_to_file(tmp_path / "model.pte")
    et.get_etrecord().save(tmp_path / "model.etrecord")
    program = Runtime.get().load_program(tmp_path / "model.pte", enable_etdump=True)
    program.load_method("forward").execute(list(inputs))
    program.write_etdump_result_to_file(tmp_path / "run.etdp")
    out, modules = imported_modules([ETLAB, "inspect", str(tmp_path / "run.etdp"), "--etrecord",
                                     str(tmp_path / "model.etrecord")])
    assert out.returncode == 0, out.stderr[-3000:]
    assert "etlab.inspector._cli" in modules and not {m for m in modules if m == "torch" or m.startswith("torch.")}


def _torch_op_types(path: Path) -> dict[int, list[tuple[str, str]]]:
    """Debug handle -> (node, op type) of each recorded edge program, op types resolved through torch:
    an edge op's name, a Python scalar function's name, else the resolved operator's own name."""
    import torch

    from etlab.etrecord._graph_check import SCALAR_TARGETS, resolve_operator

    def walk(program: dict, out: dict) -> None:
        later = []
        for node in program["graph_module"]["graph"]["nodes"]:
            target = node["target"]
            if "executorch_call_delegate" in target:
                later.append(json.loads(node["inputs"][0]["arg"]["as_string"])["original_module"])
            handle = (node.get("metadata") or {}).get("debug_handle")
            if handle is None or target == "_operator.getitem":
                continue
            if target.startswith(EDGE_OP_PREFIX):
                op = target[len(EDGE_OP_PREFIX):]
            elif target in SCALAR_TARGETS:
                op = target.rpartition(".")[2]
            else:
                found = resolve_operator(target)
                op = found.name() if isinstance(found, torch._ops.HigherOrderOperator) else found.__name__
            out.setdefault(int(handle), []).append((node["name"], op))
        for child in later:
            walk(child, out)

    with zipfile.ZipFile(path) as zf:
        entries = {n: zf.read(n) for n in zf.namelist()}
    tables = {}
    for base in program_bases(entries):
        if base.startswith("edge_dialect_exported_program"):
            method = base.split("/", 1)[1] if "/" in base else "forward"
            walk(json.loads(entries[base]), tables.setdefault(method, {}))
    return tables


def test_upstream_op_types_equal_torchs(upstream_artifacts, xnnpack, tmp_path):  # noqa: F811
    from etlab.etrecord import ETRecord
    from tests.etrecord.conftest import compiled

    etlab_written = tmp_path / "cnn-upstream-layout.etrecord"
    record = ETRecord.from_sources(compiled("cnn", True).executorch.get_etrecord())
    record.save(etlab_written, format="upstream")
    paths = [*(d / "model.etrecord" for d in upstream_artifacts.values()), xnnpack / "model.etrecord",
             etlab_written]
    seen = set()
    for path in paths:
        info = read_program_info(path)
        expected = _torch_op_types(path)
        assert set(info.methods) >= set(expected)
        for method, table in expected.items():
            got = {h: [(o.name, o.op_type) for o in ops] for h, ops in info.methods[method].ops.items()}
            assert got == table, path
            seen |= {op for rows in table.values() for _, op in rows}
    assert any(op.startswith("aten.") for op in seen) and "executorch_call_delegate" in seen
