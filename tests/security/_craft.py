"""Builders of crafted (hostile but well-formed) files for the security tests.

Each builder writes what an attacker would: a real `.pte` or `.etrecord` whose only defect is
what it asks etlab to do. `run_isolated` runs a snippet in a fresh interpreter, so a native crash
(SIGSEGV, SIGBUS) shows up as a negative return code instead of killing pytest.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from etlab.etrecord._archive import MANIFEST, TENSOR_BLOB, dump_json, load_json, read_archive, write_archive

REPO = Path(__file__).resolve().parents[2]


def run_isolated(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs `code` in a new Python with this checkout first on the path; returns the finished process."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)


_LOAD_AND_RUN = """
import json, sys, torch
from etlab.runtime import Runtime
verdicts = {}
for name, path, inputs in json.loads(sys.argv[1]):
    try:
        method = Runtime.get().load_program(path).load_method("forward")
        method.execute([torch.ones(shape, dtype=getattr(torch, dtype)) for shape, dtype in inputs])
        verdicts[name] = "RAN"
    except Exception as e:
        verdicts[name] = type(e).__name__ + ": " + str(e)
print(json.dumps(verdicts))
"""


def load_and_run_isolated(programs: dict[str, tuple[bytes, list]], folder: Path) -> dict[str, str]:
    """Loads and runs each crafted .pte (name -> (bytes, [(shape, dtype name), ...] inputs of ones)) in
    one fresh interpreter; returns name -> "RAN" or "<ErrorType>: message". Fails on a native crash."""
    jobs = []
    for name, (data, inputs) in programs.items():
        path = folder / f"{name}.pte"
        path.write_bytes(data)
        jobs.append([name, str(path), inputs])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", _LOAD_AND_RUN, json.dumps(jobs)], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, f"the loader crashed (rc {proc.returncode}): {proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def small_etrecord(path: Path) -> Path:
    """An ETRecord of the zoo MLP with representative inputs (so its graph gets replayed), and next
    to it the run an Inspector joins it with: run.etdp and its debug buffer run.bin."""
    from etlab.compiler import to_edge
    from etlab.models import ZOO
    from etlab.runtime import Runtime

    model, inputs = ZOO["mlp"]()
    et = to_edge(torch.export.export(model, tuple(inputs)), generate_etrecord=True).to_executorch()
    record = et.get_etrecord()
    record.update_representative_inputs(list(inputs))
    record.save(path)
    program = Runtime.get().load_program(et.buffer, enable_etdump=True, debug_buffer_size=1 << 20)
    program.load_method("forward").execute(list(inputs))
    program.write_etdump_result_to_file(path.parent / "run.etdp", path.parent / "run.bin")
    return path


def edit_etrecord(src: Path, dst: Path, edit) -> Path:
    """Writes `src` to `dst` with `edit(manifest)` applied to its JSON manifest (tensor bytes kept)."""
    entries, where = read_archive(src)
    manifest = load_json(entries, MANIFEST, where)
    edit(manifest)
    write_archive(dst, dump_json(manifest), entries.get(TENSOR_BLOB, b""))
    return dst


def edge_graph(manifest: dict) -> dict:
    """The serialized torch.export graph of the edge program of `forward`."""
    doc = manifest["programs"][manifest["edge_dialect_program"]["forward"]]
    return doc["export"]["graph_module"]["graph"]


def _meta(dtype: int, sizes: list[int], layout: int = 7) -> dict:
    strides, step = [], 1
    for n in reversed(sizes):
        strides.insert(0, {"as_int": step})
        step *= max(n, 1)
    return {"dtype": dtype, "sizes": [{"as_int": n} for n in sizes], "requires_grad": False,
            "device": {"type": "cpu", "index": None}, "strides": strides, "storage_offset": {"as_int": 0},
            "layout": layout}


def _node(target: str, name: str, inputs: list[tuple[str, dict]], kinds=None) -> dict:
    return {"target": target, "name": name, "metadata": {}, "is_hop_single_tensor_return": None,
            "inputs": [{"name": n, "arg": a, "kind": (kinds or {}).get(n, 1)} for n, a in inputs],
            "outputs": [{"as_tensor": {"name": name}}]}


def file_write_graph(victim: Path):
    """An edit that prepends from_file(victim, shared=True) -> select -> fill_(65) to the edge graph:
    replaying it would create `victim` and write 'A' into it."""
    def edit(manifest: dict) -> None:
        graph = edge_graph(manifest)
        size = 16
        graph["tensor_values"].update({"ff": _meta(1, [size]), "sel": _meta(1, []), "filled": _meta(1, [])})
        graph["nodes"][:0] = [
            _node("torch.ops.aten.from_file.default", "ff", [
                ("filename", {"as_string": str(victim)}), ("shared", {"as_bool": True}), ("size", {"as_int": size}),
                ("dtype", {"as_scalar_type": 1})], kinds={"dtype": 2}),
            _node("torch.ops.aten.select.int", "sel", [
                ("self", {"as_tensor": {"name": "ff"}}), ("dim", {"as_int": 0}), ("index", {"as_int": 0})]),
            _node("torch.ops.aten.fill_.Scalar", "filled", [
                ("self", {"as_tensor": {"name": "sel"}}), ("value", {"as_int": 65})]),
        ]
    return edit


def sparse_input_graph(manifest: dict) -> None:
    """Marks the edge graph's first tensor (a weight) as a sparse COO tensor."""
    graph = edge_graph(manifest)
    name = next(iter(graph["tensor_values"]))
    graph["tensor_values"][name] = copy.deepcopy(graph["tensor_values"][name]) | {"layout": 1}


# -- torch.save members whose pickle shares containers -----------------------------------------------


def shared_list_pickle(levels: int, refs: int = 2) -> bytes:
    """A protocol-2 pickle of `levels` lists, each holding the previous one `refs` times (memo gets):
    a few bytes per level, refs**levels elements when walked as a tree (60 levels x 2 refs: 2**60)."""
    out = bytearray(b"\x80\x02]r\x00\x00\x00\x00")  # [] memoized as 0
    for i in range(1, levels + 1):
        get = b"j" + (i - 1).to_bytes(4, "little")
        out += b"0]r" + i.to_bytes(4, "little") + b"(" + get * refs + b"e"  # pop the last, new list, APPENDS
    return bytes(out + b".")


def torch_member(pkl: bytes) -> bytes:
    """A torch.save zip (as upstream writes for an ETRecord member) whose data.pkl is `pkl`."""
    import io

    from tests.fuzz.mutate import replace_torch_pickle

    buf = io.BytesIO()
    torch.save({}, buf)
    return replace_torch_pickle(buf.getvalue(), pkl)


def upstream_etrecord_with(src: Path, dst: Path, members: dict[str, bytes]) -> Path:
    """`src` (an etlab ETRecord) saved in upstream's layout to `dst`, with `members` replaced."""
    import io
    import zipfile

    from etlab.etrecord import parse_etrecord

    buf = io.BytesIO()
    parse_etrecord(src).save(buf, format="upstream")
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as zf:
        entries = {n: zf.read(n) for n in zf.namelist()}
    assert set(members) <= set(entries), sorted(entries)
    entries.update(members)
    with zipfile.ZipFile(dst, "w") as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
    return dst
