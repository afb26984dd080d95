"""Upstream ExecuTorch's results for corpus models, cached by content (used by bench/corpus.py and
tests/corpus).

Three kinds of cached artifacts under `cache_root()` (~/.cache/etlab/corpus, or ETLAB_CORPUS_CACHE),
each keyed by what made it (artifact_key / run_key):

- `portable/<key>/`: upstream's portable compile of one model (upstream.pte, upstream.json with its
  time or error), made by the long-lived timer worker (bench/_ref_corpus_timer.py, UpstreamCompiler)
  in the harness's foreground, so that its time is a sample interleaved with etlab's;
- `xnnpack/<key>/`: the same programs lowered with upstream's XnnpackPartitioner (xnnpack.pte), a
  background job of bench/_ref_corpus.py;
- `run/<sha256 of the .pte and inputs>/`: upstream's runtime outputs for one etlab-written `.pte`
  (re-done whenever etlab's compiler writes different bytes), a background job too.

A compile's key hashes the exported programs (program_digest: graph code, signature, weights), the
memory-planning option, the script that does the work, setup.sh, the torch version, the upstream
release and RECIPE; not the model's name, inputs or defining file, which the compile does not read.
Jobs are built in a temporary directory and renamed into place under a file lock, so concurrent
harnesses (pytest-xdist workers) do each one once.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
REF_SCRIPT = HERE / "_ref_corpus.py"
TIMER_SCRIPT = HERE / "_ref_corpus_timer.py"
SETUP_SH = REPO.parent / "shared" / "reference" / "setup.sh"
ENTRY_SOURCE = REPO / "etlab" / "models" / "corpus" / "_entry.py"
RECIPE = "corpus-v2"
JOB_TIMEOUT_S = 3600


def cache_root() -> Path:
    env = os.environ.get("ETLAB_CORPUS_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "etlab" / "corpus"


def _transformers_version() -> str:
    try:
        from importlib.metadata import version

        return version("transformers")
    except Exception:  # not installed: the torch.nn entries do not need it
        return "none"


def compile_key(name: str, source: Path) -> str:
    """Content key of upstream's compile of corpus model `name`, defined in file `source` (see module
    docstring). torch.export.save output is not byte-stable (control-flow subgraph names), so the
    key hashes the sources that define the model rather than the saved program."""
    h = hashlib.sha256(f"{RECIPE}\0{name}\0{torch.__version__}\0{_transformers_version()}".encode())
    for p in [Path(source), ENTRY_SOURCE, REF_SCRIPT, SETUP_SH]:
        data = p.read_bytes() if p.is_file() else b""
        h.update(f"\0{p.name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def upstream_version() -> str:
    """The upstream release the reference venv holds ('executorch 1.5.1'), read from its dist-info
    without starting its python; 'unknown' when no venv is found."""
    venv = Path(os.environ.get("ETREF_VENV", Path.home() / ".cache" / "etref" / "venv"))
    infos = sorted(venv.glob("lib/python*/site-packages/executorch-*.dist-info"))
    return f"executorch {infos[-1].name[len('executorch-'):-len('.dist-info')]}" if infos else "unknown"


def _hash_tensor(h, name: str, t) -> None:
    t = t.detach().contiguous().cpu()
    h.update(f"\0{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
    if t.numel():
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())


def _hash_value(h, name: str, value) -> None:
    if isinstance(value, torch.Tensor):
        _hash_tensor(h, name, value)
    else:  # a script object or a python constant: its type and repr
        h.update(f"\0{name}\0{type(value).__qualname__}\0{value!r}".encode())


def program_digest(h, ep) -> None:
    """Feeds what upstream's compile of ExportedProgram `ep` depends on into hash `h`: the graph code
    of every (sub)module without its comment lines (those carry source file paths and line numbers,
    which move when an unrelated line of the defining file is edited), the graph signature, the
    range constraints, and the bytes of every parameter, buffer and constant."""
    for mod_name, mod in sorted(ep.graph_module.named_modules(), key=lambda kv: kv[0]):
        code = getattr(mod, "code", None)
        if code is None:
            continue
        lines = [ln.rstrip() for ln in code.splitlines() if ln.strip() and not ln.strip().startswith("#")]
        h.update(f"\0module {mod_name}\0".encode() + "\n".join(lines).encode())
    h.update(f"\0{ep.graph_signature}\0{sorted(map(str, ep.range_constraints.items()))}".encode())
    for name, value in sorted(ep.state_dict.items()):
        _hash_value(h, f"state {name}", value)
    for name, value in sorted(ep.constants.items()):
        _hash_value(h, f"const {name}", value)


def program_key(name: str, programs: dict, inputs: dict[str, tuple], share_mutable_buffers: bool) -> str:
    """Content key of upstream's compile of corpus model `name` from what that compile reads: the
    exported programs (program_digest), the example inputs, the memory-planning option, the upstream
    release, the reference script and setup.sh, torch's version and RECIPE. Unlike compile_key (which
    hashes whole source files), an edit to a docstring or to another model in the same file keeps
    the key."""
    from torch.utils._pytree import tree_flatten

    h = hashlib.sha256(f"{RECIPE}\0{name}\0{torch.__version__}\0{upstream_version()}\0{share_mutable_buffers}".encode())
    for p in [REF_SCRIPT, SETUP_SH]:
        data = p.read_bytes() if p.is_file() else b""
        h.update(f"\0{p.name}\0{len(data)}\0".encode() + data)
    for method in sorted(programs):
        h.update(f"\0method {method}\0".encode())
        program_digest(h, programs[method])
        for i, value in enumerate(tree_flatten(list(inputs[method]))[0]):
            _hash_value(h, f"input {i}", value)
    return h.hexdigest()


SCRIPTS = {"portable": TIMER_SCRIPT, "xnnpack": REF_SCRIPT}


def artifact_key(kind: str, programs: dict, share_mutable_buffers: bool) -> str:
    """Content key of upstream's `kind` ('portable' or 'xnnpack') compile of `programs` ({method:
    ExportedProgram}): only what that compile reads (see the module docstring)."""
    h = hashlib.sha256(f"{RECIPE}\0{kind}\0{torch.__version__}\0{upstream_version()}\0{share_mutable_buffers}".encode())
    for p in [SCRIPTS[kind], SETUP_SH]:
        data = p.read_bytes() if p.is_file() else b""
        h.update(f"\0{p.name}\0{len(data)}\0".encode() + data)
    for method in sorted(programs):
        h.update(f"\0method {method}\0".encode())
        program_digest(h, programs[method])
    return h.hexdigest()


def run_key(pte: bytes, inputs: dict[str, Path]) -> str:
    """Content key of an upstream run of `pte` on the saved inputs of each method."""
    h = hashlib.sha256(RECIPE.encode() + pte)
    for method, path in sorted(inputs.items()):
        h.update(method.encode() + b"\0" + Path(path).read_bytes())
    return h.hexdigest()


def ref_env() -> dict[str, str]:
    """The reference python's environment: none of etlab's import paths, one thread per process."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return env


@dataclass
class PendingJob:
    """A job for the reference python, built in `tmp`, renamed to `final` when it has finished."""

    kind: str  # "portable", "xnnpack" or "run"
    tmp: Path
    final: Path
    spec: dict = field(default_factory=dict)


def _complete(d: Path, marker: str) -> bool:
    return (d / marker).is_file()


def _marker(kind: str) -> str:
    return "status.json" if kind == "run" else "upstream.json"


def cached(kind: str, key: str) -> Path | None:
    """The finished artifact directory of (kind, key), or None."""
    d = cache_root() / kind / key
    if _complete(d, _marker(kind)):
        with contextlib.suppress(OSError):
            os.utime(d / _marker(kind))
        return d
    return None


def new_job(kind: str, key: str) -> PendingJob:
    """A fresh temporary directory for a job whose result will live at cache/<kind>/<key>."""
    root = cache_root() / kind
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key[:12]}-", dir=root))
    return PendingJob(kind, tmp, root / key)


def publish(job: PendingJob) -> Path:
    """Renames a finished job into place (another process may have got there first)."""
    if _complete(job.final, _marker(job.kind)):
        shutil.rmtree(job.tmp, ignore_errors=True)
        return job.final
    if job.final.exists():
        shutil.rmtree(job.final, ignore_errors=True)
    os.rename(job.tmp, job.final)
    return job.final


_LIVE: set[subprocess.Popen] = set()  # reference processes of run_jobs calls still running


def memory_limit() -> int:
    """Bytes of address space each reference process may use (ETLAB_CORPUS_REF_MEMORY_GB, default 8):
    an upstream compile that would take the shared machine down (ta_wavernn's XNNPACK lowering grew to
    12.3 GB before the kernel killed it) fails inside its own process instead."""
    return int(float(os.environ.get("ETLAB_CORPUS_REF_MEMORY_GB", "8")) * 2**30)


def job_timeout() -> float:
    """Seconds one background job may take (ETLAB_CORPUS_JOB_TIMEOUT_S, default JOB_TIMEOUT_S)."""
    return float(os.environ.get("ETLAB_CORPUS_JOB_TIMEOUT_S", JOB_TIMEOUT_S))


def bounds_text(memory: int | None = None, timeout: float | None = None) -> str:
    """The bounds a reference process runs under, as the table names them."""
    memory = memory_limit() if memory is None else memory
    timeout = job_timeout() if timeout is None else timeout
    return f"{memory / 2**30:g} GB address space, {timeout:.0f} s"


def _bounded(memory: int):
    """A preexec_fn limiting the child's address space to `memory` bytes (RLIMIT_AS): a runaway
    allocation raises MemoryError there (or ends that process), never the machine's other work."""

    def limit() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    return limit


def named_error(error: str) -> str:
    """An upstream error as the table shows it: a MemoryError is the reference process's own bound."""
    if error.startswith("MemoryError"):
        return f"out of memory under its bound ({bounds_text()}): {error}"
    return error


def bound_out(job: PendingJob, reason: str) -> Path:
    """Publishes the result of a job its bounds stopped (killed after its timeout, or its process died,
    most likely of its memory bound): upstream cannot do it here, which the table names as n/a."""
    error = f"bounded out here: {reason} (bounds: {bounds_text()})"
    if job.kind == "run":
        status = {"ok": False, "error": error, "bounded": True}
        (job.tmp / "status.json").write_text(json.dumps(status))
    else:
        result = {"load": {"ok": True}, job.kind: {"ok": False, "error": error, "bounded": True}}
        (job.tmp / _marker(job.kind)).write_text(json.dumps(result))
    return publish(job)


def stop_jobs() -> None:
    """Kills the reference processes of run_jobs calls in flight (an interrupted harness); their
    finished jobs are already published."""
    for p in list(_LIVE):
        if p.poll() is None:
            p.kill()
            p.wait()
        _LIVE.discard(p)


@dataclass
class _Slot:
    """One reference process working through its share of the jobs in order; `started` is when its
    current job (pending[0]) became current."""

    index: int
    pending: list[PendingJob]
    proc: subprocess.Popen | None = None
    started: float = 0.0
    starts: int = 0

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            _LIVE.discard(self.proc)
            self.proc = None


def _start_slot(slot: _Slot, ref_python: str, logdir: Path, memory: int) -> None:
    spec = logdir / f"jobs-{slot.index}-{slot.starts}.json"
    spec.write_text(json.dumps([{**j.spec, "kind": j.kind} for j in slot.pending]))
    with open(logdir / f"ref-{slot.index}-{slot.starts}.log", "w") as log_file:
        slot.proc = subprocess.Popen([ref_python, str(REF_SCRIPT), str(spec)], stdout=log_file,
                                     stderr=subprocess.STDOUT, env=ref_env(), stdin=subprocess.DEVNULL,
                                     preexec_fn=_bounded(memory))
    _LIVE.add(slot.proc)
    slot.started, slot.starts = time.monotonic(), slot.starts + 1


def _step_slot(slot: _Slot, ref_python: str, logdir: Path, memory: int, timeout: float, log) -> bool:
    """Publishes the slot's finished jobs; bounds out its current job when it outlived `timeout` or its
    process died under it (the process is then restarted on the jobs after it). True when it bounded
    one out."""
    while slot.pending and _complete(slot.pending[0].tmp, _marker(slot.pending[0].kind)):
        publish(slot.pending.pop(0))
        slot.started = time.monotonic()
    if not slot.pending:
        return False
    if slot.proc is None:
        _start_slot(slot, ref_python, logdir, memory)
        return False
    rc = slot.proc.poll()
    current = slot.pending[0]
    if rc is not None and _complete(current.tmp, _marker(current.kind)):
        return False  # finished between the two looks: published on the next step
    if rc is None and time.monotonic() - slot.started <= timeout:
        return False
    reason = (f"its process exited with code {rc} (under its memory bound)" if rc is not None
              else f"still running after {timeout:.0f} s, killed")
    slot.stop()
    log(f"upstream {current.kind} job {current.spec}: {reason}; logs in {logdir}")
    bound_out(slot.pending.pop(0), reason)
    return True


def run_jobs(ref_python: str, jobs: Sequence[PendingJob], parallel: int = 1, log=print,
             timeout: float | None = None, memory: int | None = None) -> None:
    """Runs the jobs with the reference python in `parallel` processes, publishing each job as soon as
    it has finished (so an interrupted run keeps what it did). Cheap run jobs go first.

    Every job is bounded: its process has `memory` bytes of address space (memory_limit()) and the job
    `timeout` seconds (job_timeout()); a job that outlives them is published as bounded out
    (bound_out), and the process goes on with the next job. One lock per cache root keeps concurrent
    harnesses from running the same jobs twice; jobs that another process finished meanwhile are
    dropped before starting.
    """
    if not jobs:
        return
    timeout = job_timeout() if timeout is None else timeout
    memory = memory_limit() if memory is None else memory
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        todo = sorted((j for j in jobs if not _complete(j.final, _marker(j.kind))), key=lambda j: j.kind != "run")
        for j in jobs:
            if j not in todo:
                shutil.rmtree(j.tmp, ignore_errors=True)
        if not todo:
            return
        slots = [_Slot(i, todo[i::parallel]) for i in range(parallel) if todo[i::parallel]]
        logdir = Path(tempfile.mkdtemp(prefix=".logs-", dir=root))
        bounded = False
        try:
            while any(s.pending for s in slots):
                for slot in slots:
                    bounded |= _step_slot(slot, ref_python, logdir, memory, timeout, log)
                time.sleep(0.5)
        finally:
            for slot in slots:
                slot.stop()
                for j in slot.pending:  # interrupted: not a result
                    shutil.rmtree(j.tmp, ignore_errors=True)
        if not bounded:
            shutil.rmtree(logdir, ignore_errors=True)


class UpstreamCompiler:
    """The long-lived reference-python worker (bench/_ref_corpus_timer.py) that compiles a model with
    upstream's to_edge().to_executorch() on request and says how long it took (bench/corpus.py's
    side-by-side times and bench/corpus_speed.py's, ETRecord saves included): the harness asks it
    between etlab's own samples, so both sides are timed under the same load. Started warm (a tiny
    compile first, so imports are not in the first model's sample); a worker that dies (its address
    space is bounded to `memory` bytes, memory_limit()) or outlives `timeout` is killed and the next
    request starts a new one."""

    def __init__(self, ref_python: str, timeout: float = JOB_TIMEOUT_S, memory: int | None = None):
        self.ref_python, self.timeout = ref_python, timeout
        self.memory = memory_limit() if memory is None else memory
        self.proc: subprocess.Popen | None = None
        self.lines: queue.Queue[str | None] = queue.Queue()

    def _start(self) -> None:
        self.proc = subprocess.Popen([self.ref_python, str(TIMER_SCRIPT)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=ref_env(),
                                     preexec_fn=_bounded(self.memory))
        _LIVE.add(self.proc)
        self.lines = queue.Queue()
        threading.Thread(target=self._read, args=(self.proc, self.lines), daemon=True).start()
        self._ask({"warmup": True})

    @staticmethod
    def _read(proc: subprocess.Popen, lines: queue.Queue) -> None:
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    def _ask(self, request: dict) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + self.timeout
        while True:  # a library may print to stdout too: the answer is the next JSON object
            try:
                line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.1))
                ended = line is None
            except queue.Empty:
                line, ended = None, False
            if line is None:
                rc = None
                if ended:  # its output closed: it exited (or is about to)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        rc = self.proc.wait(timeout=10)
                self.close(kill=True)
                how = f"exit code {rc}" if rc is not None else "killed"
                raise WorkerDied(f"upstream's compile worker died or took over {self.timeout:.0f} s ({how}; "
                                 f"bounds: {bounds_text(self.memory, self.timeout)})")
            with contextlib.suppress(ValueError):
                answer = json.loads(line)
                if isinstance(answer, dict):
                    return answer

    def compile(self, directory: Path, methods: list[str], pte: Path | None = None,
                share_mutable_buffers: bool = False) -> dict:
        """Upstream's compile of directory/<method>.pt2 (its program written to `pte` if given): {"seconds",
        "cpu_seconds", "pte_bytes"} or {"error": "..."} (upstream cannot compile it)."""
        request = {"dir": str(directory), "methods": methods, "share_mutable_buffers": share_mutable_buffers}
        return self._request({**request, "pte": str(pte)} if pte is not None else request)

    def save_etrecord(self, directory: Path, methods: list[str], path: Path) -> dict:
        """Upstream's ETRecord of the same compile, its save alone timed: {"seconds", "cpu_seconds", "bytes"}
        or {"error": "..."} (bench/corpus_speed.py's ETRecord columns)."""
        return self._request({"dir": str(directory), "methods": methods, "etrecord": str(path)})

    def _request(self, request: dict) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        return self._ask(request)

    def close(self, kill: bool = False) -> None:
        """Ends the worker: at the end of its input (it exits by itself), or killed."""
        if self.proc is not None:
            if kill:
                self.proc.kill()
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            _LIVE.discard(self.proc)
            self.proc = None


class WorkerDied(RuntimeError):
    """Upstream's compile worker exited or hung: no result (not a verdict on the model)."""


def publish_portable(job: PendingJob, answer: dict) -> Path:
    """Publishes the timer's compile of one model (job.tmp/upstream.pte, written by the worker) with
    its time or error as upstream.json."""
    ok = "error" not in answer
    comp = {"ok": ok, **({"seconds": answer["seconds"], "cpu_seconds": answer["cpu_seconds"]} if ok
                         else {"error": str(answer["error"])})}
    (job.tmp / "upstream.json").write_text(json.dumps({"compile": comp}))
    return publish(job)


_OPERATORS_SNIPPET = ("import json; from executorch.runtime import Runtime; "
                      "print(json.dumps(sorted(Runtime.get().operator_registry.operator_names)))")


def upstream_operators(ref_python: str | None) -> set[str] | None:
    """Operator names upstream's runtime has kernels for ('aten::add.out'), cached per setup.sh;
    None when unknown (no reference python and nothing cached)."""
    key = hashlib.sha256(SETUP_SH.read_bytes() if SETUP_SH.is_file() else b"").hexdigest()[:16]
    path = cache_root() / f"operators-{key}.json"
    if path.is_file():
        return set(json.loads(path.read_text()))
    if ref_python is None:
        return None
    p = subprocess.run([ref_python, "-c", _OPERATORS_SNIPPET], capture_output=True, text=True, env=ref_env(),
                       timeout=600)
    if p.returncode != 0:
        return None
    names = json.loads(p.stdout.strip().splitlines()[-1])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(names))
    os.replace(tmp, path)
    return set(names)


def prune(kind: str, keep: int) -> None:
    """Drops all but the `keep` most recently used artifact directories of `kind`."""
    root = cache_root() / kind
    if not root.is_dir():
        return
    dirs = [p for p in root.iterdir() if p.is_dir() and len(p.name) == 64 and _complete(p, _marker(kind))]
    dirs.sort(key=lambda p: (p / _marker(kind)).stat().st_mtime, reverse=True)
    for p in dirs[keep:]:
        shutil.rmtree(p, ignore_errors=True)
