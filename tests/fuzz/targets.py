"""What the campaign fuzzes: one `Target` per loader, plus load+execute and Inspector+report.

A target names the seed kind it starts from, which member files it mutates (and how: by format)
and `run(case)`, which feeds one input to etlab through its public API the way a user's code
would. `run` returns normally or raises; `classify` turns what it raised into an outcome:

- "ok": the input was accepted (and, for execute, ran);
- "clean": FormatError / LoadError / ExecutionError / ValueError whose message names the input
  (the file, or `<N bytes>` for bytes handed over without a name, or the method that ran);
- "unnamed": one of those types, but the message does not say which input is at fault;
- "exception": any other exception type: a defect (with its traceback);
- set by the parent, never here: "crash" (the worker died), "hang" (> 5 s), "memory".
"""

from __future__ import annotations

import dataclasses
import io
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from tests.fuzz import mutate
from tests.fuzz.seeds import Case

CLEAN_NAMES = ("FormatError", "LoadError", "ExecutionError", "ValueError")
_PLACEHOLDER = re.compile(r"<[^<>]*bytes>|method '[^']*'")


@dataclass
class Target:
    """One fuzz target: seeds of kind `seed_kind`, mutate `members` (name -> weight), run `run`."""

    name: str
    seed_kind: str
    members: dict[str, float]
    run: Callable[[Case], object]
    about: str
    model_share: float = 0.15  # inputs made by changing the decoded model (well-formed, hostile meaning)
    mutators: dict[str, object] = field(default_factory=dict)  # per (seed index, member), built lazily


# -- running one input ------------------------------------------------------------------------------


def _named(name: str, data: bytes) -> io.BytesIO:
    """A binary file object with a name, so loaders that take files say which file is bad."""
    f = io.BytesIO(data)
    f.name = name
    return f


def run_pte(case: Case) -> None:
    from etlab.schema import deserialize_pte

    pte = deserialize_pte(case["model.pte"], what="model.pte")
    for i in range(len(pte.segments)):
        pte.segment_bytes(i)


def run_ptd(case: Case) -> None:
    from etlab.schema import deserialize_ptd

    for _key, (_layout, data) in deserialize_ptd(case["model.ptd"], what="model.ptd").named().items():
        len(data)


def run_bpte(case: Case) -> None:
    from etlab.devtools import method_test_suites_from_schema
    from etlab.schema import deserialize_bundled_program, deserialize_pte

    bundled = deserialize_bundled_program(case["model.bpte"], what="model.bpte")
    deserialize_pte(bundled.program or b"", what="model.bpte (embedded program)")
    for suite in method_test_suites_from_schema(bundled, what="model.bpte"):
        for tc in suite.test_cases:
            for v in [*tc.inputs, *tc.expected_outputs]:
                if hasattr(v, "clone"):
                    v.clone()  # read every element (any dtype): a view past its bytes would fault here


class ReadersDisagree(AssertionError):
    """The two ETDump readers gave different answers for one file: one of them is wrong.

    `where` (what differs: which reader rejected, or the first differing field) goes into the
    finding's signature, so that different disagreements are saved separately."""

    def __init__(self, message: str, where: str):
        super().__init__(message)
        self.where = where


def _first_difference(a, b, path: str = "") -> str | None:
    """The path of the first field where two decoded models differ (list indices as []).
    Byte fields compare by content (one reader gives views, the other bytes)."""
    bytes_like = (bytes, bytearray, memoryview)
    if isinstance(a, bytes_like) and isinstance(b, bytes_like):
        return None if bytes(a) == bytes(b) else path
    if type(a) is not type(b):
        return f"{path} ({type(a).__name__} vs {type(b).__name__})"
    if dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            d = _first_difference(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
            if d:
                return d
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path} (length)"
        return next((d for x, y in zip(a, b) if (d := _first_difference(x, y, f"{path}[]"))), None)
    same = a == b or (isinstance(a, float) and a != a and b != b)
    return None if same else path


def run_etdp(case: Case) -> None:
    """Both ETDump readers, and a differential check: they must accept and reject the same files,
    and agree field for field on what they accept."""
    from etlab import FormatError
    from etlab.etdump import read_etdump
    from etlab.schema import deserialize_etdump

    data = case["run.etdp"]
    results = []
    for read in (lambda: deserialize_etdump(data, what="run.etdp"), lambda: read_etdump(data).to_model()):
        try:
            results.append(read())
        except FormatError as e:
            results.append(e)
    schema, fast = results
    if isinstance(schema, FormatError) and isinstance(fast, FormatError):
        raise schema
    if isinstance(schema, FormatError) or isinstance(fast, FormatError):
        which = "read_etdump rejects" if isinstance(fast, FormatError) else "deserialize_etdump rejects"
        raise ReadersDisagree(f"deserialize_etdump: {schema!s:.200}; read_etdump: {fast!s:.200}", which)
    where = _first_difference(schema, fast)
    if where:
        raise ReadersDisagree(f"deserialize_etdump and read_etdump().to_model() differ at {where}",
                              f"differ at {where}")


def run_debug_buffer(case: Case) -> None:
    from etlab.etdump import debug_rows_of, debug_value, load_debug_buffer, read_etdump

    columns = read_etdump(case["run.etdp"])
    buffer = load_debug_buffer(case["run.bin"])
    rows = debug_rows_of(columns)
    for row in rows[rows >= 0].tolist():
        value = debug_value(columns, row, buffer)
        for t in value if isinstance(value, list) else [value]:
            if hasattr(t, "is_meta") and not t.is_meta:
                t.clone()  # read every element the view addresses


def _inputs(case: Case) -> list:
    from etlab.devtools import method_test_suites_from_schema
    from etlab.schema import deserialize_bundled_program

    suites = method_test_suites_from_schema(deserialize_bundled_program(case["inputs.bpte"], what="inputs.bpte"),
                                            what="inputs.bpte")
    return list(suites[0].test_cases[0].inputs) if suites and suites[0].test_cases else []


class ScaleBackend:
    """The backend the runtime tests' delegate seed names: multiplies by its processed byte.
    (Stateless, unlike the tests' recording one: a worker runs it millions of times.)"""

    def init(self, processed, compile_specs):
        if len(processed) < 1:
            raise ValueError("ScaleBackend: empty processed bytes")
        return int(processed[0])

    def execute(self, handle, args, context):
        import torch

        x, out = args
        torch.mul(x, handle, out=out)


_BACKENDS: list = []


def run_execute(case: Case) -> None:
    from etlab.runtime import Runtime, register_backend

    if not _BACKENDS:  # registered in fuzz workers only, never in a test process that imports this
        _BACKENDS.append(ScaleBackend())
        register_backend("ScaleBackend", _BACKENDS[0])
    inputs = _inputs(case)
    files = [_named("model.ptd", case["model.ptd"])] if "model.ptd" in case else []
    trace = len(case["model.pte"]) % 2 == 0  # half the inputs also record an ETDump
    program = Runtime.get().load_program(_named("model.pte", case["model.pte"]), data_files=files,
                                         enable_etdump=trace, debug_buffer_size=1 << 16 if trace else 0)
    for name in sorted(program.method_names):
        method = program.load_method(name)
        for out in method.execute([x.clone() if hasattr(x, "clone") else x for x in inputs]):
            if hasattr(out, "clone") and not getattr(out, "is_meta", False):
                out.clone()


def run_etrecord(case: Case) -> None:
    from etlab.etrecord import parse_etrecord

    record = parse_etrecord(_named("model.etrecord", case["model.etrecord"]))
    record.program_info()


def run_etrecord_graphs(case: Case) -> None:
    from etlab.etrecord import parse_etrecord

    record = parse_etrecord(_named("model.etrecord", case["model.etrecord"]))
    record.edge_dialect_program  # noqa: B018 (graphs are rebuilt on first access)
    record.exported_program  # noqa: B018
    record.graph_map  # noqa: B018


def run_inspector_etdump(case: Case) -> None:
    """The Inspector's reading paths without an ETRecord: blocks, events, table, trace, debug data."""
    from etlab.inspector import Inspector

    ins = Inspector(etdump_data=case["run.etdp"], debug_buffer_path=case["run.bin"])
    ins.to_dataframe(include_delegate_debug_data=True)
    for block in ins.event_blocks:
        for event in block.events:
            event.debug_data  # noqa: B018 (read from the debug buffer on access)
    ins.to_chrome_trace()
    ins.print_data_tabular(file=io.StringIO())


def run_inspector(case: Case) -> None:
    from etlab.etrecord import parse_etrecord
    from etlab.inspector import Inspector
    from etlab.visualizer import Dashboard

    record = parse_etrecord(_named("model.etrecord", case["model.etrecord"]))
    ins = Inspector(etdump_data=case["run.etdp"], etrecord=record, debug_buffer_path=case["run.bin"])
    ins.to_dataframe()
    Dashboard(ins, method="forward").page("fuzz")


# Request arguments a client of the Lab server could send: path tricks (traversal, absolute, NUL, a link
# name, a folder, the wrong kind) and odd method/part names. Each input sends the file requests with the
# honest names and one of these; a hostile path must be refused (PathError), never served.
_HOSTILE_PATHS = ("../run.etdp", "/etc/passwd", "..", "sub/../../run.etdp", "run.etdp\x00.pte", "C:/run.etdp",
                  "\\run.etdp", "link.etdp", ".", "run.bin", "model.etrecord/.", "x" * 5000, "%2e%2e/run.etdp")
_ODD_NAMES = ("forward", "", "../forward", "\x00", "f" * 5000, "graphs", "main", "__init__")


def run_server(case: Case) -> None:
    """The Lab server's work (`etlab.jupyter._service.Service`, what its worker processes run) on the
    files written into a fresh root: the .etrecord and .etdp viewers, the run's graphs, the artifact
    list, and one request with a hostile path or name chosen by the input."""
    import hashlib
    import os
    import tempfile

    from etlab.jupyter._service import Service
    from etlab.jupyter._store import PathError

    pick = int.from_bytes(hashlib.blake2b(b"".join(case.values()), digest_size=4).digest(), "little")
    with tempfile.TemporaryDirectory(prefix="etlab-fuzz-server-") as tmp:
        root = os.path.join(tmp, "root")
        os.mkdir(root)
        for name, data in case.items():
            with open(os.path.join(root, name), "wb") as f:
                f.write(data)
        os.symlink(os.path.join(tmp, "outside.etdp"), os.path.join(root, "link.etdp"))
        with open(os.path.join(tmp, "outside.etdp"), "wb") as f:
            f.write(case["run.etdp"])
        service = Service(root)
        bad_path = _HOSTILE_PATHS[pick % len(_HOSTILE_PATHS)]
        name = _ODD_NAMES[(pick >> 8) % len(_ODD_NAMES)]
        try:
            service.etdp(bad_path)
        except PathError:
            pass
        else:
            raise AssertionError(f"the server served the request path {bad_path!r}")
        service.artifacts("")
        service.etrecord("model.etrecord", method=name)
        service.etdp("run.etdp", method=name)
        service.etdp("run.etdp", program="model.etrecord", part="graphs")
        service.compare("run.etdp", "run.etdp")


TARGETS: dict[str, Target] = {t.name: t for t in (
    Target("pte", "program", {"model.pte": 1}, run_pte, ".pte loader (etlab.schema.deserialize_pte)"),
    Target("ptd", "ptd", {"model.ptd": 1}, run_ptd, ".ptd loader (deserialize_ptd + named data)"),
    Target("bpte", "bpte", {"model.bpte": 1}, run_bpte, ".bpte loader, embedded program and test-case tensors"),
    Target("etdp", "run", {"run.etdp": 1}, run_etdp, ".etdp loaders (deserialize_etdump and read_etdump)"),
    Target("etrecord", "run", {"model.etrecord": 1}, run_etrecord, ".etrecord loader (parse_etrecord, program_info)"),
    Target("etrecord_graphs", "run", {"model.etrecord": 1}, run_etrecord_graphs,
           ".etrecord graphs rebuilt (edge, ATen, graph_map ExportedPrograms)"),
    Target("debug_buffer", "run", {"run.etdp": 3, "run.bin": 1}, run_debug_buffer,
           "debug buffer tensors addressed by an ETDump (debug_value)", model_share=0.5),
    Target("execute", "program", {"model.pte": 8, "inputs.bpte": 1}, run_execute,
           "load+execute (etlab.runtime: load_program, load_method, execute)", model_share=0.5),
    Target("execute_ptd", "external", {"model.pte": 2, "model.ptd": 2}, run_execute,
           "load+execute of a program with external weights (.pte + .ptd)", model_share=0.5),
    Target("inspector_etdump", "run", {"run.etdp": 3, "run.bin": 1}, run_inspector_etdump,
           "Inspector on an ETDump and debug buffer (blocks, events, table, Chrome trace)", model_share=0.5),
    Target("inspector", "run", {"run.etdp": 2, "model.etrecord": 2, "run.bin": 1}, run_inspector,
           "Inspector + HTML report (Inspector, to_dataframe, Dashboard.page)", model_share=0.5),
    Target("server", "run", {"run.etdp": 2, "model.etrecord": 2, "run.bin": 1}, run_server,
           "Lab server requests (Service: viewers, graphs, compare, artifacts; hostile paths and names)",
           model_share=0.5),
)}


# Targets that misbehave on purpose, for the test of the supervisor itself (never in a campaign's
# default list): each input crashes the worker, spins for ever, or allocates 128 MiB.
def _selftest_crash(case: Case) -> None:
    import ctypes

    ctypes.string_at(0)  # SIGSEGV


def _selftest_hang(case: Case) -> None:
    while True:
        pass


def _selftest_memory(case: Case) -> None:
    block = bytearray(128 << 20)
    block[::4096] = b"x" * len(block[::4096])  # touch every page: resident, not just reserved


SELFTEST_TARGETS: dict[str, Target] = {t.name: t for t in (
    Target("selftest_crash", "ptd", {"model.ptd": 1}, _selftest_crash, "supervisor self-test: SIGSEGV"),
    Target("selftest_hang", "ptd", {"model.ptd": 1}, _selftest_hang, "supervisor self-test: endless loop"),
    Target("selftest_memory", "ptd", {"model.ptd": 1}, _selftest_memory, "supervisor self-test: 128 MiB"),
)}
WORKER_TARGETS = {**TARGETS, **SELFTEST_TARGETS}  # what a worker can be asked to run


def classify(exc: BaseException | None, case: Case) -> tuple[str, str]:
    """(outcome, error type name) of one run; see the module docstring."""
    if exc is None:
        return "ok", ""
    name = type(exc).__name__
    clean = [c for c in type(exc).__mro__ if c.__name__ in CLEAN_NAMES]
    if not clean or isinstance(exc, (KeyError, IndexError)):
        return "exception", name
    msg = str(exc)
    if any(member in msg for member in case) or _PLACEHOLDER.search(msg):
        return "clean", name
    return "unnamed", name


# -- making one input -------------------------------------------------------------------------------

_FLAT_NS = {".pte": "program", ".bpte": "bundled_program", ".ptd": "flat_tensor", ".etdp": "etdump"}


def _flat_base(name: str, data: bytes) -> int:
    """Where the FlatBuffer of a file starts (after the .ptd header, after the .etdp size prefix)."""
    if name.endswith(".ptd") and len(data) >= 24:
        return int.from_bytes(data[16:24], "little")
    return 4 if name.endswith(".etdp") else 0


def _model_codec(name: str):
    from etlab.schema import bundled_program, etdump, flat_tensor, program

    if name.endswith(".pte"):
        return (lambda d: program.deserialize_pte(d)), (lambda m: program.reserialize_pte(m, segment_alignment=16))
    if name.endswith(".ptd"):
        return flat_tensor.deserialize_ptd, (lambda m: flat_tensor.reserialize_ptd(m, segment_alignment=16))
    if name.endswith(".etdp"):
        return etdump.deserialize_etdump, etdump.serialize_etdump
    return bundled_program.deserialize_bundled_program, bundled_program.serialize_bundled_program


@dataclass
class MemberMutators:
    """The mutators of one seed member, built once per worker (maps, decoded models)."""

    data: bytes
    flat: mutate.FlatMap | None = None
    model: mutate.ModelMutator | None = None
    etrecord: mutate.EtrecordMutator | mutate.UpstreamEtrecordMutator | None = None
    pool: list[bytes] = field(default_factory=list)  # recent model-level variants

    @classmethod
    def build(cls, name: str, data: bytes) -> MemberMutators:
        ext = name[name.rfind("."):]
        m = cls(data)
        if ext in _FLAT_NS:
            m.flat = mutate.FlatMap(data, _FLAT_NS[ext], _flat_base(name, data))
            m.model = mutate.ModelMutator(*_model_codec(name), data)
        elif ext == ".etrecord":  # etlab's layout (etrecord.json) or upstream's (torch.save members)
            upstream = b"ETRECORD_V0" in data[:4096] or b"ETRECORD_V0" in data[-65536:]
            m.etrecord = mutate.UpstreamEtrecordMutator(data) if upstream else mutate.EtrecordMutator(data)
        return m

    def mutate(self, rng: random.Random, model_share: float) -> bytes:
        r = rng.random()
        if self.etrecord is not None and r < 0.85:
            return self.etrecord(rng)
        if self.model is not None and r < model_share:
            variant = self._variant(rng)
            if variant is not None:
                if rng.random() < 0.5:
                    return variant
                buf = bytearray(variant)  # a well-formed file with hostile meaning, then a little damage
                for _ in range(rng.choice((1, 1, 2, 4))):
                    mutate.mutate_bytes(rng, buf)
                return bytes(buf)
        buf = bytearray(self.data)
        for _ in range(rng.choice((1, 1, 1, 2, 2, 3, 4, 8))):
            if self.flat is not None and rng.random() < 0.7:
                mutate.mutate_field(rng, buf, self.flat)
            else:
                mutate.mutate_bytes(rng, buf)
        return bytes(buf)

    def _variant(self, rng: random.Random) -> bytes | None:
        """A model-level variant: freshly encoded one time in twenty, else one of the last 64 reused.

        Why a pool: encoding a model costs several times what loading it does; reusing recent
        variants (each then damaged differently) keeps the loader, not the encoder, the bottleneck.
        """
        if len(self.pool) < 64 or rng.random() < 0.05:
            out = self.model(rng)
            if out is not None:
                if len(self.pool) < 64:
                    self.pool.append(out)
                else:
                    self.pool[rng.randrange(64)] = out
            return out
        return rng.choice(self.pool)


def _seed_weights(target: Target, seeds: list[Case]) -> list[float]:
    """Seeds are picked with weight 1/sqrt(size of the members mutated): small seeds parse faster,
    so they give more inputs per second, while the large zoo seeds still come up often."""
    key = ("weights", len(seeds))
    if key not in target.mutators:
        target.mutators[key] = [1 / max(1, sum(len(c.get(n, b"")) for n in target.members)) ** 0.5 for c in seeds]
    return target.mutators[key]


def make_input(target: Target, seeds: list[Case], rng: random.Random) -> Case:
    """One input: a seed with one of its mutable members (occasionally two) mutated."""
    index = rng.choices(range(len(seeds)), _seed_weights(target, seeds))[0]
    case = dict(seeds[index])
    names = [n for n in target.members if n in case]
    weights = [target.members[n] for n in names]
    for name in {rng.choices(names, weights)[0] for _ in range(1 if rng.random() < 0.85 else 2)}:
        key = (index, name)
        if key not in target.mutators:
            target.mutators[key] = MemberMutators.build(name, case[name])
        case[name] = target.mutators[key].mutate(rng, target.model_share)
    return case
