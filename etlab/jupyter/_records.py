"""What the .etrecord and .bpte viewers show: the recorded graphs with the module hierarchy, and
a bundled program's test cases (verification runs in a child process, see `_verify`)."""

from __future__ import annotations

from etlab.inspector import program_signature
from etlab.jupyter._program import method_summary, signature, signature_hash
from etlab.schema import bundled_program as B
from etlab.schema import deserialize_pte


def record_signature(record) -> dict[str, list[list]]:
    """The program signature of an ETRecord (etlab.inspector.program_signature of its ProgramInfo)."""
    return program_signature(record.program_info())


def record_graph_kinds(record) -> list[str]:
    """The graph kinds an ETRecord holds, in compile order."""
    kinds = []
    if record.exported_program is not None:
        kinds.append("aten")
    if record.methods:
        kinds.append("edge")
    names = set(record.program_info().graphs)
    if names & {"et_dialect_graph_module", "et_dialect_program", "executorch_program"}:
        kinds.append("runtime")
    return kinds


def module_tree(graph: dict) -> list[dict]:
    """The module hierarchy of a graph (its module groups) with the node count under each, depth first."""
    groups = {g["id"]: g for g in graph.get("groups", [])}
    counts: dict[str, int] = {}
    for n in graph.get("nodes", []):
        gid = n.get("group")
        while gid is not None and gid in groups:
            counts[gid] = counts.get(gid, 0) + 1
            gid = groups[gid].get("parent")
    children: dict[str | None, list[str]] = {}
    for g in groups.values():
        children.setdefault(g.get("parent"), []).append(g["id"])
    out = []

    def visit(parent, depth):
        for gid in children.get(parent, []):
            g = groups[gid]
            out.append({"id": gid, "label": g.get("label", gid), "kind": g.get("kind", "module"),
                        "type": g.get("module_type", "") or g.get("backend", "") or "", "depth": depth,
                        "nodes": counts.get(gid, 0)})
            visit(gid, depth + 1)

    visit(None, 0)
    return out


def etrecord_view(record, *, method: str = "forward") -> dict:
    """The recorded graphs (compare panes share debug handles) and the module hierarchy."""
    from etlab.visualizer import GraphView

    kinds = record_graph_kinds(record)
    methods = list(record.methods)
    method = method if method in methods else (methods[0] if methods else method)
    graphs = []
    if kinds:
        gv = GraphView(record, graph=kinds, method=method, shown=kinds[:2] if len(kinds) > 1 else None)
        graphs = gv.graphs
    edge = next((g for g in graphs if g.get("kind") == "edge"), graphs[0] if graphs else {})
    info = record.program_info().methods.get(method)
    return {"methods": methods, "method": method, "kinds": kinds, "graphs": graphs,
            "modules": module_tree(edge),
            "instructions": len(info.instruction_debug_handles) if info else 0,
            "delegates": [{"instruction": i, "backend": d.backend_name} for (_, i), d in
                          sorted((info.delegates if info else {}).items())],
            "signature": signature_hash(record_signature(record))}


def _value_summary(v: B.Value) -> dict:
    """A bundled value as the viewer lists it: kind, dtype and shape, and the first few numbers."""
    val = v.val
    if isinstance(val, B.Tensor):
        st = getattr(val.scalar_type, "name", str(val.scalar_type)).lower()
        preview = []
        data = bytes(val.data or b"")[:64]
        if st == "float" and len(data) >= 4:
            import struct

            preview = [round(x, 5) for x in struct.unpack(f"<{len(data) // 4}f", data[: len(data) // 4 * 4])][:8]
        return {"kind": "tensor", "dtype": st, "shape": [int(s) for s in val.sizes or ()],
                "bytes": len(val.data or b""), "preview": preview}
    for cls, key in ((B.Int, "int_val"), (B.Bool, "bool_val"), (B.Double, "double_val")):
        if isinstance(val, cls):
            return {"kind": cls.__name__.lower(), "value": getattr(val, key)}
    return {"kind": "none"}


def bpte_view(bundled: B.BundledProgram, *, name: str) -> dict:
    """The test suites (inputs and expected outputs of each case), the embedded program's summary and the
    tolerance *Verify* checks with unless the user changes it."""
    from etlab.devtools import DEFAULT_ATOL, DEFAULT_RTOL

    pte = deserialize_pte(bytes(bundled.program or b""), what=f"{name} (embedded program)")
    return {
        "version": bundled.version,
        "program_bytes": len(bundled.program or b""),
        "methods": [method_summary(pte, p) for p in pte.program.execution_plan or ()],
        "suites": [{"method": str(s.method_name),
                    "cases": [{"index": i, "inputs": [_value_summary(v) for v in c.inputs or ()],
                               "expected": [_value_summary(v) for v in c.expected_outputs or ()]}
                              for i, c in enumerate(s.test_cases or ())]}
                   for s in bundled.method_test_suites or ()],
        "signature": signature_hash(signature(pte)),
        "tolerance": {"rtol": DEFAULT_RTOL, "atol": DEFAULT_ATOL},
    }


def warm_up_readers() -> None:
    """Builds the .etrecord viewer's data once for a tiny program (exported here, saved and read back as
    a record would be): the first view in a process pays for torch's lazy set-up (fake tensors, operator
    lookups, code generation) — over a second of CPU — so the Lab server's reader processes pay it once,
    before they fork, not on the first file the user opens."""
    import tempfile

    import torch

    from etlab.etrecord import ETRecord, parse_etrecord

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn, self.fc = torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Linear(4, 2)

        def forward(self, x):
            y = torch.nn.functional.relu6(self.bn(self.conv(x))) + x[:, :1, 1:-1, 1:-1]
            return self.fc(torch.nn.functional.adaptive_avg_pool2d(y, 1).flatten(1))

    ep = torch.export.export(Tiny().eval(), (torch.randn(1, 3, 8, 8),))
    record = ETRecord(exported_program=ep, edge_dialect_program=ep, _debug_handle_map={"forward": {}},
                      _delegate_map={"forward": {}})
    with tempfile.TemporaryDirectory(prefix="etlab-warm-") as tmp:
        record.save(f"{tmp}/tiny.etrecord")
        etrecord_view(parse_etrecord(f"{tmp}/tiny.etrecord"))
