"""Seed files for the fuzz campaign: small valid files of every format, written by etlab itself.

A seed is a `Case`: named members (`{"model.pte": bytes, ...}`), because some targets read
several files at once (an ETDump with its debug buffer and ETRecord). Seeds come from the model
zoo (compiled, run with ETDump and a debug buffer, with an ETRecord) and from the hand-built
programs of the runtime tests (every instruction kind, delegates, mutable buffers, dynamic
shapes). Building them takes a few seconds, so they are cached under build/fuzz-seeds/,
keyed by a hash of the etlab sources that write them.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / "build" / "fuzz-seeds"
Case = dict[str, bytes]
# The writers whose output the seeds are: a change to any of them rebuilds the cache.
_WRITER_SOURCES = ("etlab/schema", "etlab/compiler", "etlab/etrecord", "etlab/runtime", "etlab/devtools",
                   "etlab/etdump", "etlab/models", "tests/fuzz/seeds.py", "tests/runtime/_programs.py")


def _sources_hash() -> str:
    """Why: seeds must be rebuilt whenever a writer changes, or the campaign fuzzes stale formats."""
    h = hashlib.sha1()
    for rel in _WRITER_SOURCES:
        root = REPO / rel
        files = sorted(root.rglob("*.py")) if root.is_dir() else [root]
        for f in files:
            h.update(str(f.relative_to(REPO)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _zoo_run(model, inputs, partitioner, work: Path) -> Case:
    """Compiles and runs one zoo model the way `etlab.devtools.profile` does; returns its files."""
    from etlab.devtools import profile

    profile(model, inputs, iterations=2, partitioner=partitioner, workdir=work, progress=False)
    return {name: (work / name).read_bytes() for name in ("model.pte", "model.etrecord", "run.etdp", "run.bin")}


def _bundled(pte: bytes, inputs, expected) -> bytes:
    from etlab.devtools import BundledProgram, MethodTestCase, MethodTestSuite
    from etlab.devtools import serialize_from_bundled_program_to_flatbuffer as serialize

    case = MethodTestCase(inputs=list(inputs), expected_outputs=list(expected))
    return serialize(
        BundledProgram(pte_file=pte, method_test_suites=[MethodTestSuite("forward", [case])]))


def _external_ptd(model, inputs) -> Case:
    """A program whose weights live in a .ptd (external constants)."""
    import torch

    from etlab.compiler import ExecutorchBackendConfig, to_edge

    et = to_edge(torch.export.export(model, inputs)).to_executorch(ExecutorchBackendConfig(external_constants=True))
    (ptd,) = et.data_files.values()
    return {"model.pte": bytes(et.buffer), "model.ptd": bytes(ptd)}


def _upstream_layout(etrecord: bytes) -> bytes:
    """The same ETRecord saved in upstream ExecuTorch's layout (its representative inputs, which
    `profile` records, are a torch.save member read at parse)."""
    import io

    from etlab.etrecord import parse_etrecord

    buf = io.BytesIO()
    parse_etrecord(etrecord).save(buf, format="upstream")
    return buf.getvalue()


def build_seeds() -> dict[str, list[Case]]:
    """Every seed, grouped by the kind of file it is a seed for ("pte", "ptd", "bpte", "run", ...)."""
    import torch

    from etlab.compiler.backends import DemoPartitioner
    from etlab.models import make_mlp
    from tests.runtime import _programs as hand

    torch.manual_seed(0)
    mlp, mlp_in = make_mlp()
    with tempfile.TemporaryDirectory(prefix="etlab-fuzz-seeds-") as tmp:
        delegated = _zoo_run(mlp, mlp_in, [DemoPartitioner()], Path(tmp) / "delegated")
        portable = _zoo_run(mlp, mlp_in, None, Path(tmp) / "portable")
    with torch.no_grad():
        expected = [mlp(*mlp_in)]
    x = torch.ones(2, 3)
    add3, _ = hand.add_chain(3)
    programs = {
        "add_chain": (add3, [x]),
        "branch": (hand.branch_program(), [torch.arange(3.0), torch.tensor(True)]),
        "accumulator": (hand.accumulator_program(torch.ones(3)), [torch.ones(3)]),
        "dynamic_view": (hand.dynamic_view_program(), [torch.ones(2, 4)]),
        "delegate": (hand.delegate_program(), [torch.ones(2, 2)]),
        "zoo_mlp_delegated": (delegated["model.pte"], list(mlp_in)),
        "zoo_mlp": (portable["model.pte"], list(mlp_in)),
    }
    ext = _external_ptd(mlp, mlp_in)
    seeds: dict[str, list[Case]] = {
        # A program with the inputs to run it on (as a tiny .bpte, the one format that carries inputs).
        "program": [{"model.pte": pte, "inputs.bpte": _bundled(pte, inputs, [])} for pte, inputs in programs.values()],
        "ptd": [{"model.ptd": ext["model.ptd"]}],
        "external": [{"model.pte": ext["model.pte"], "model.ptd": ext["model.ptd"],
                      "inputs.bpte": _bundled(ext["model.pte"], mlp_in, [])}],
        "bpte": [{"model.bpte": _bundled(add3, [x], [x + 1])},
                 {"model.bpte": _bundled(portable["model.pte"], mlp_in, expected)}],
        "run": [{k: v for k, v in run.items() if k != "model.pte"} for run in (delegated, portable)]
        # the delegated run with its ETRecord in upstream's layout (torch.save members: pickles)
        + [{"model.etrecord": _upstream_layout(delegated["model.etrecord"]), "run.etdp": delegated["run.etdp"],
            "run.bin": delegated["run.bin"]}],
    }
    return seeds


def _write(seeds: dict[str, list[Case]], root: Path) -> None:
    for kind, cases in seeds.items():
        for i, case in enumerate(cases):
            d = root / kind / f"{i:02d}"
            d.mkdir(parents=True, exist_ok=True)
            for name, data in case.items():
                (d / name).write_bytes(data)


def read_case(folder: Path) -> Case:
    """The member files of one case folder (a seed or a reproducer)."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and not p.name.endswith(".txt")}


def load_seeds(cache: Path = CACHE) -> dict[str, list[Case]]:
    """The seeds, built once per version of the writers and cached on disk."""
    root = cache / _sources_hash()
    if not (root / "complete").is_file():
        tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=_mkdir(cache)))
        _write(build_seeds(), tmp)
        (tmp / "complete").write_text("ok\n")
        try:
            os.replace(tmp, root)
        except OSError:  # another process finished first: use its copy
            pass
    return {kind.name: [read_case(d) for d in sorted(kind.iterdir()) if d.is_dir()]
            for kind in sorted(root.iterdir()) if kind.is_dir()}


def _mkdir(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p
