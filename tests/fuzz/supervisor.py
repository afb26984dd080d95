"""The parent side: starts workers, watches them, turns deaths and hangs into saved reproducers.

Each worker runs inputs in-process (no process per input) and writes the input it is about to
run into its in-flight record. The supervisor polls every worker: a worker that exits on a
signal or with an unexpected code has crashed, one whose record shows the same input running
for longer than `hang_seconds` is hung (asked for a traceback with SIGUSR1, then killed). Either
way the in-flight input is saved as a reproducer and the worker is restarted for the rest of
its time. Findings are deduplicated by signature: target, outcome, error type and the innermost
etlab frame (file and function, not line, so that signatures survive unrelated edits).
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import re
import shutil
import signal
import struct
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tests.fuzz.worker import HEADER, INFLIGHT_SIZE, MAGIC, RUNNING, decode_case, entry

REPRODUCERS = Path(__file__).resolve().parent / "reproducers"
HANG_SECONDS = 5.0
FINDING_FILE = "FINDING.txt"
# Innermost-frame paths whose defects belong to the engineer doing issue 9 items 1-4 (runtime,
# mmap'd files, ETRecord graph checks and replay); the rest of etlab is the loaders' (this campaign's).
OTHER_OWNER = "issue 9 items 1-4 (runtime / mmap / ETRecord graph check and replay)"
_OTHER_PATHS = ("etlab/runtime/", "etlab/schema/_files.py", "etlab/etrecord/_graph_check.py",
                "etlab/etrecord/_info.py", "etlab/compiler/")
_FRAME = re.compile(r'File "([^"]+)", line (\d+),? in (\S+)')


def innermost_etlab_frame(trace: str, most_recent_first: bool) -> str:
    """'etlab/x/y.py:function' of the innermost etlab frame of a Python or faulthandler traceback."""
    frames = [(f, fn) for f, _line, fn in _FRAME.findall(trace) if "/etlab/" in f and "/tests/" not in f]
    if not frames:
        return "?"
    f, fn = frames[0] if most_recent_first else frames[-1]
    return f"etlab/{f.rsplit('/etlab/', 1)[1]}:{fn}"


_RUNTIME_TARGETS = ("execute", "execute_ptd")


def owner_of(frame: str, target: str = "") -> str:
    """Who fixes a finding: by its innermost etlab frame; without one (a memory blow-up that raised
    nothing, a crash outside etlab), load+execute findings are the runtime's."""
    if frame.startswith(_OTHER_PATHS) or (frame == "?" and target in _RUNTIME_TARGETS):
        return OTHER_OWNER
    return "loaders (issue 9 item 5)"


@dataclass
class Finding:
    target: str
    outcome: str      # exception | unnamed | memory | crash | hang
    error: str        # exception type, signal name, or what the memory watch saw
    frame: str
    trace: str
    count: int = 1
    reproducer: str = ""

    @property
    def signature(self) -> str:
        return f"{self.target}|{self.outcome}|{self.error.split(' ')[0]}|{self.frame}"

    @property
    def key(self) -> str:
        return hashlib.sha1(self.signature.encode()).hexdigest()[:12]


@dataclass
class Totals:
    """Everything a campaign counted; `per_target[t]` maps 'outcome:error' -> inputs."""

    per_target: dict[str, Counter] = field(default_factory=dict)
    busy: Counter = field(default_factory=Counter)  # worker-seconds spent on each target
    findings: dict[str, Finding] = field(default_factory=dict)
    restarts: int = 0
    seconds: float = 0.0
    workers: int = 0

    def add(self, target: str, key: str, n: int = 1) -> None:
        self.per_target.setdefault(target, Counter())[key] += n

    def inputs(self, target: str | None = None) -> int:
        return sum(sum(c.values()) for t, c in self.per_target.items() if target in (None, t))


def _read_inflight(path: Path, with_case: bool = True) -> tuple[int, int, int, dict[str, bytes] | None]:
    """(state, seq, target index, case) of a worker's record; case None when idle or not asked for.

    Only read the case of a worker that has stopped (dead or stuck): a running one may be
    rewriting it."""
    with open(path, "rb") as f:
        head = f.read(HEADER.size)
        magic, state, seq, tindex, length = HEADER.unpack(head) if len(head) == HEADER.size else (0, 0, 0, 0, 0)
        if magic != MAGIC or state != RUNNING or not with_case:
            return state, seq, tindex, None
        try:
            return state, seq, tindex, decode_case(f.read(length))
        except (UnicodeDecodeError, struct.error):
            return state, seq, tindex, None


_CONTEXT = None
WALL_FACTOR = 10  # a worker that neither finishes nor uses the CPU is hung after 10x the hang time
_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS
    except (OSError, IndexError, ValueError):
        return 0.0


def _context():
    """The fork-server context, its server preloaded with warmed-up targets (created once)."""
    global _CONTEXT
    if _CONTEXT is None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["tests.fuzz.preload"])
        p = ctx.Process(target=os.getpid)  # returns once the server has warmed up and forked it
        p.start()
        p.join()
        _CONTEXT = ctx
    return _CONTEXT


class WorkerProc:
    """One worker process (forked from the fork server), its in-flight record and its stderr log."""

    def __init__(self, workdir: Path, wid: int, args: list[str]):
        self.dir = workdir / f"w{wid}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.inflight = self.dir / "inflight"
        with open(self.inflight, "wb") as f:
            f.truncate(INFLIGHT_SIZE)
        self.stderr_path = self.dir / "stderr.log"
        self.stderr_path.write_bytes(b"")
        self.args = ["--inflight", str(self.inflight), *args]
        ctx = _context()
        self.conn, child = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=entry, args=(self.args, child, str(self.stderr_path)), daemon=True)
        self.proc.start()
        child.close()
        self.ready = False
        self.done = False
        self.seen_seq, self.seen_at, self.seen_cpu = -1, time.monotonic(), 0.0

    def messages(self) -> list[dict]:
        out = []
        try:
            while self.conn.poll():
                out.append(json.loads(self.conn.recv_bytes()))
        except (EOFError, OSError):
            pass
        return out

    def poll(self) -> int | None:
        """The exit code (negative: killed by that signal), or None while it runs."""
        return self.proc.exitcode

    def stuck_for(self) -> float:
        """Seconds the current input has been running (0 when idle or not yet ready): CPU seconds,
        or a tenth of the wall time if that is more (a worker blocked without using the CPU).

        Why CPU time: the machine is shared; with ten busy processes on two cores a one-second
        input takes five seconds of wall time, and that is not a hang."""
        state, seq, _t, _c = _read_inflight(self.inflight, with_case=False)
        now, cpu = time.monotonic(), _cpu_seconds(self.proc.pid)
        if not self.ready or state != RUNNING:
            self.seen_seq = -1
            return 0.0
        if seq != self.seen_seq:
            self.seen_seq, self.seen_at, self.seen_cpu = seq, now, cpu
        return max(cpu - self.seen_cpu, (now - self.seen_at) / WALL_FACTOR)

    def stderr_tail(self) -> str:
        """The last fatal-error report (faulthandler) of the log, without its list of extension modules."""
        text = self.stderr_path.read_bytes()[-200_000:].decode(errors="replace")
        start = max(text.rfind("Fatal Python error"), text.rfind("Current thread 0x"), text.rfind("Thread 0x"))
        text = text[start:] if start >= 0 else text
        return text.split("\nExtension modules:", 1)[0][-8000:]

    def kill(self) -> None:
        if self.proc.exitcode is None:
            self.proc.kill()
        self.proc.join()

    def close(self) -> None:
        self.kill()
        self.conn.close()
        self.proc.close()


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


class Campaign:
    """Runs targets for a time budget on `workers` workers; collects counts and findings."""

    def __init__(self, targets: list[str], *, seconds: float, workers: int = 2, seed: int = 0,
                 reproducers: Path | None = REPRODUCERS, hang_seconds: float = HANG_SECONDS,
                 progress=None, max_new_per_target: int = 20, slice_seconds: float = 0.0):
        self.targets, self.seconds, self.n_workers, self.seed = targets, seconds, workers, seed
        self.reproducers, self.hang_seconds, self.progress = reproducers, hang_seconds, progress
        self.max_new, self.slice = max_new_per_target, slice_seconds
        self.totals = Totals(workers=workers)
        self.known = known_signatures(reproducers) if reproducers else {}
        self.new_saved: Counter = Counter()
        self.sig_counts: Counter = Counter()  # inputs per finding signature, as the workers count them

    def _args(self, wid: int, restart: int, seconds: float, findings: Path) -> list[str]:
        order = self.targets[wid % len(self.targets):] + self.targets[: wid % len(self.targets)]
        return ["--targets", ",".join(order), "--seconds", f"{self.seconds:.2f}", "--epoch", str(self.epoch),
                "--slice", str(self.slice),
                "--seed", str(self.seed * 1000 + wid * 100 + restart), "--findings", str(findings)]

    def run(self) -> Totals:
        from tests.fuzz.seeds import load_seeds

        load_seeds()  # build the seed cache once, before the workers race to
        _context()  # warm the fork server first: the time budget is for fuzzing
        start = time.monotonic()
        self.epoch = time.time()
        deadline = start + self.seconds
        with tempfile.TemporaryDirectory(prefix="etlab-fuzz-") as tmp:
            work = Path(tmp)
            findings = work / "findings"
            workers = {wid: WorkerProc(work, wid, self._args(wid, 0, self.seconds, findings))
                       for wid in range(self.n_workers)}
            restarts = Counter()
            last_progress = time.monotonic()
            while workers:
                time.sleep(0.1)
                for wid, w in list(workers.items()):
                    self._drain(w)
                    died = w.poll()
                    stuck = w.stuck_for()
                    if died is None and stuck > self.hang_seconds:
                        os.kill(w.proc.pid, signal.SIGUSR1)  # faulthandler: where is it stuck
                        time.sleep(0.3)
                        self._record_death(w, "hang", f"timeout (one input ran {stuck:.1f} s)")
                        w.kill()
                        died = -9
                    elif died is not None and not w.done:
                        self._drain(w)
                        if died != 3:  # 3: the worker stopped itself after a memory finding
                            self._record_death(w, "crash", _signal_name(died) if died < 0 else f"exit {died}")
                    if died is None:
                        continue
                    w.close()
                    del workers[wid]
                    left = deadline - time.monotonic()
                    if not w.done and left > 2:
                        restarts[wid] += 1
                        self.totals.restarts += 1
                        workers[wid] = WorkerProc(work, wid, self._args(wid, restarts[wid], left, findings))
                if self.progress and time.monotonic() - last_progress > 5:
                    last_progress = time.monotonic()
                    self.progress(self._progress_line(time.monotonic() - start))
                if time.monotonic() > deadline + 60:  # a worker that ignores its own deadline
                    for w in workers.values():
                        w.close()
                    break
        self.totals.seconds = time.monotonic() - start
        for sig, f in self.totals.findings.items():
            f.count = max(f.count, self.sig_counts.get(sig, 0))
        return self.totals

    def _progress_line(self, elapsed: float) -> str:
        t = self.totals
        parts = [f"{name} {t.inputs(name)}" for name in self.targets]
        return (f"[fuzz {elapsed:5.0f}s] {t.inputs()} inputs ({t.inputs() / max(elapsed, 1e-9):.0f}/s), "
                f"{len(t.findings)} finding(s), {t.restarts} restart(s): " + ", ".join(parts))

    def _drain(self, w: WorkerProc) -> None:
        for msg in w.messages():
            kind = msg.get("t")
            if kind == "ready":
                w.ready = True
            elif kind == "done":
                w.done = True
            elif kind == "stats":
                for sig, n in msg.get("sigs", {}).items():
                    self.sig_counts[sig] += n
                for target, counts in msg["counts"].items():
                    self.totals.busy[target] += counts.pop("seconds", 0.0)
                    for key, n in counts.items():
                        self.totals.add(target, key, n)
            elif kind == "finding":
                frame = msg["frame"]
                case = {p.name: p.read_bytes() for p in Path(msg["path"]).iterdir()}
                self._finding(Finding(msg["target"], msg["outcome"], msg["error"], frame, msg["trace"]), case)
                shutil.rmtree(msg["path"], ignore_errors=True)

    def _record_death(self, w: WorkerProc, outcome: str, error: str) -> None:
        _state, _seq, tindex, case = _read_inflight(w.inflight)
        if case is None:
            return  # died between inputs (e.g. while starting): nothing to reproduce
        trace = w.stderr_tail()
        frame = innermost_etlab_frame(trace[trace.rfind("most recent call first"):], most_recent_first=True)
        target = self._target_of(w, tindex)
        self.totals.add(target, f"{outcome}:{error.split(' ')[0]}")
        self._finding(Finding(target, outcome, error, frame, trace[-6000:]), case)

    def _target_of(self, w: WorkerProc, tindex: int) -> str:
        return w.args[w.args.index("--targets") + 1].split(",")[tindex]

    def _finding(self, f: Finding, case: dict[str, bytes]) -> None:
        old = self.totals.findings.get(f.signature)
        if old is not None:
            if f.outcome in ("crash", "hang"):  # counted here; workers count the rest
                old.count += 1
            return
        self.totals.findings[f.signature] = f
        if f.signature in self.known:
            f.reproducer = str(self.known[f.signature])
            return
        if f.outcome == "unnamed" or self.reproducers is None or self.new_saved[f.target] >= self.max_new:
            return
        self.new_saved[f.target] += 1
        f.reproducer = str(save_reproducer(self.reproducers, f, case))
        if self.progress:
            self.progress(f"  finding: {f.signature} -> {f.reproducer}")


def save_reproducer(root: Path, f: Finding, case: dict[str, bytes]) -> Path:
    """Writes the input's files and FINDING.txt under root/<target>/<key>/."""
    d = root / f.target / f.key
    d.mkdir(parents=True, exist_ok=True)
    for name, data in case.items():
        (d / name).write_bytes(data)
    (d / FINDING_FILE).write_text(
        f"signature: {f.signature}\noutcome: {f.outcome}\nerror: {f.error}\nframe: {f.frame}\n"
        f"owner: {owner_of(f.frame, f.target)}\nfound: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n\n"
        f"{f.trace}\n")
    return d


def read_finding(folder: Path) -> dict[str, str]:
    """The header fields of a reproducer's FINDING.txt."""
    out = {}
    for line in (folder / FINDING_FILE).read_text().splitlines():
        if not line.strip():
            break
        k, _, v = line.partition(": ")
        out[k] = v
    return out


def reproducer_dirs(root: Path = REPRODUCERS) -> list[Path]:
    return sorted(p.parent for p in root.glob(f"*/*/{FINDING_FILE}")) if root and root.is_dir() else []


def known_signatures(root: Path) -> dict[str, Path]:
    return {read_finding(d)["signature"]: d for d in reproducer_dirs(root)}


def replay(folders: list[Path], hang_seconds: float = 2.0) -> dict[Path, dict]:
    """Runs each reproducer once in a worker subprocess; returns its outcome (crashes and hangs too)."""
    results: dict[Path, dict] = {}
    todo = [Path(f) for f in folders]
    with tempfile.TemporaryDirectory(prefix="etlab-fuzz-replay-") as tmp:
        while todo:
            w = WorkerProc(Path(tmp), len(results), ["--replay", *map(str, todo)])
            try:
                while True:
                    time.sleep(0.05)
                    for msg in w.messages():
                        if msg.get("t") == "ready":
                            w.ready = True
                        elif msg.get("t") == "done":
                            w.done = True
                        elif msg.get("t") == "replayed":
                            results[Path(msg["path"])] = msg
                    died = w.poll()
                    if w.done:
                        break
                    stuck = w.stuck_for()
                    if died is None and stuck <= hang_seconds:
                        continue
                    outcome = "hang" if died is None else "crash"
                    if died is None:
                        os.kill(w.proc.pid, signal.SIGUSR1)
                        time.sleep(0.3)
                    pending = [f for f in todo if f not in results]
                    if pending:
                        trace = w.stderr_tail()
                        results[pending[0]] = {"outcome": outcome, "error": _signal_name(died) if died else "hang",
                                               "message": "", "trace": trace}
                    break
            finally:
                w.close()
            todo = [f for f in todo if f not in results]
    return results
