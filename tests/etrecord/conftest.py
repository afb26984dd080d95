"""Zoo models compiled with an ETRecord once per test session (export and compile dominate test time)."""

from __future__ import annotations

import functools
import io
import json
import zipfile
from dataclasses import dataclass

import torch

from etlab.compiler import to_edge, to_edge_transform_and_lower
from etlab.etrecord import ETRecord
from etlab.models import ZOO


@dataclass
class Compiled:
    model: torch.nn.Module
    inputs: tuple
    exported: torch.export.ExportedProgram
    edge: object  # EdgeProgramManager
    executorch: object  # ExecutorchProgramManager
    record: ETRecord
    data: bytes  # the record saved


@functools.cache
def compiled(name: str, delegated: bool = False) -> Compiled:
    model, inputs = ZOO[name]()
    ep = torch.export.export(model, inputs)
    if delegated:
        from etlab.compiler.backends import DemoPartitioner

        edge = to_edge_transform_and_lower(ep, partitioner=[DemoPartitioner()], generate_etrecord=True)
    else:
        edge = to_edge(ep, generate_etrecord=True)
    et = edge.to_executorch()
    record = ETRecord.from_sources(et.get_etrecord())
    buf = io.BytesIO()
    record.save(buf)
    return Compiled(model, inputs, ep, edge, et, record, buf.getvalue())


def read_entries(data: bytes) -> tuple[dict, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return json.loads(zf.read("etrecord.json")), zf.read("tensors.bin")


def write_entries(manifest: dict, blob: bytes, extra: dict[str, bytes] | None = None) -> bytes:
    """An ETRecord zip with the given (possibly tampered) contents."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("etrecord.json", json.dumps(manifest), compress_type=zipfile.ZIP_LZMA)
        zf.writestr("tensors.bin", blob)
        for name, data in (extra or {}).items():
            zf.writestr(name, data)
    return buf.getvalue()
