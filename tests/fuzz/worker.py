"""A fuzz worker: makes inputs, runs them in-process, records each one before it runs.

Workers are forked from a warmed-up fork server (`tests.fuzz.preload`: torch and etlab imported,
seeds decoded, every target run once on its seeds), so starting one, or restarting one after a
crash, costs a fork and not an interpreter start. `entry(argv, conn, log)` is the child's main:

    --targets pte,etdp --seconds 30 --seed 7 --findings DIR     fuzz for a time budget
    --replay DIR [DIR ...]                                       run saved reproducers once each

The parent (`tests.fuzz.supervisor`) reads the in-flight record when the worker dies or stops
answering, so a native crash, a hang or the memory limit loses nothing: the input that did it
is in the record. The record is a shared file mapping: writing it costs a copy, not a syscall.

Messages to the parent are JSON texts on a pipe: "ready", "stats" (outcome counts and seconds
per target since the last message), "finding" (an exception or memory blow-up, with the input
saved under --findings), "replayed" (one outcome per replayed case) and "done".
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import mmap
import os
import random
import resource
import signal
import struct
import sys
import time
import traceback
from pathlib import Path

HEADER = struct.Struct("<IIQII")  # magic, state, seq, target index, body length
MAGIC = 0x5A5A4631
IDLE, RUNNING = 0, 1
INFLIGHT_SIZE = 32 << 20
MEMORY_FACTOR = 50            # an input may make the worker's peak memory grow by 50x its size ...
MEMORY_SLACK = 32 << 20       # ... plus this much for the interpreter's own growth (caches, lazy imports)
# The HTML report inlines plotly.js (~4.7 MB of text) and builds the page from several copies of
# them: a fixed cost of any report, whatever the input's size.
REPORT_SLACK = 128 << 20


def memory_limit(target, size: int) -> int:
    """How much one input of `size` bytes may grow the worker's peak memory before it is a finding."""
    return MEMORY_FACTOR * size + (REPORT_SLACK if target.name in ("inspector", "server") else MEMORY_SLACK)
ADDRESS_SPACE_HEADROOM = 3 << 30  # hard backstop (RLIMIT_AS) above the warmed-up worker's address space
STATS_EVERY = 0.5


def encode_case(case: dict[str, bytes]) -> bytes:
    """name/bytes pairs, length-prefixed (never pickle: the parent reads this after a crash)."""
    parts = []
    for name, data in case.items():
        raw = name.encode()
        parts += [struct.pack("<H", len(raw)), raw, struct.pack("<I", len(data)), data]
    return b"".join(parts)


def decode_case(body: bytes) -> dict[str, bytes]:
    out, pos = {}, 0
    while pos + 2 <= len(body):
        (n,) = struct.unpack_from("<H", body, pos)
        name = body[pos + 2 : pos + 2 + n].decode()
        (size,) = struct.unpack_from("<I", body, pos + 2 + n)
        start = pos + 6 + n
        out[name] = bytes(body[start : start + size])
        pos = start + size
    return out


class Inflight:
    """The worker's side of the in-flight record."""

    def __init__(self, path: str):
        fd = os.open(path, os.O_RDWR)
        try:
            self.mm = mmap.mmap(fd, INFLIGHT_SIZE)
        finally:
            os.close(fd)
        self.seq = 0

    def begin(self, target_index: int, body: bytes) -> bool:
        if HEADER.size + len(body) > INFLIGHT_SIZE:
            return False
        self.mm[HEADER.size : HEADER.size + len(body)] = body
        self.seq += 1
        HEADER.pack_into(self.mm, 0, MAGIC, RUNNING, self.seq, target_index, len(body))
        return True

    def end(self) -> None:
        struct.pack_into("<I", self.mm, 4, IDLE)


_CONN = None  # the pipe to the parent, set by entry()


def _emit(msg: dict) -> None:
    _CONN.send_bytes(json.dumps(msg).encode())


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _address_space() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _is_memory_error(exc: BaseException) -> bool:
    return isinstance(exc, MemoryError) or "can't allocate memory" in str(exc) or "not enough memory" in str(exc)


def warm() -> None:
    """Runs in the fork server, once: imports, seeds, mutators, and every target on its seeds.

    Why: lazy imports and first-call caches would otherwise count against the first inputs' time
    and memory in every forked worker, and a restart after a crash would cost seconds.
    """
    import torch

    from tests.fuzz.seeds import load_seeds
    from tests.fuzz.targets import TARGETS, MemberMutators

    torch.set_num_threads(1)  # the campaign runs one worker per core
    seeds = load_seeds()
    for t in TARGETS.values():
        _run_one(t.run, min(seeds[t.seed_kind], key=lambda c: sum(map(len, c.values()))))  # first-call costs
        for i, case in enumerate(seeds[t.seed_kind]):
            for name in t.members:
                if name in case and (i, name) not in t.mutators:
                    t.mutators[(i, name)] = MemberMutators.build(name, case[name])


def _setup_child(log: str) -> None:
    """stderr to the worker's log, tracebacks on fatal signals (and on SIGUSR1: "where are you")."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 2)
    os.close(fd)
    faulthandler.enable(file=sys.stderr, all_threads=False)
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=False)


def _run_one(run, case):
    try:
        run(case)
    except Exception as e:  # the worker's job is to classify what any input raises
        return e
    return None


def frame_of(exc: BaseException) -> str:
    """'etlab/x/y.py:function' of the innermost etlab frame that raised `exc` ('?' if none), or
    the exception's own `where` (a differential check says what differs)."""
    if isinstance(getattr(exc, "where", None), str):
        return exc.where
    for fs in reversed(traceback.extract_tb(exc.__traceback__)):
        f = fs.filename.replace(os.sep, "/")
        if "/etlab/" in f and "/tests/" not in f:
            return f"etlab/{f.rsplit('/etlab/', 1)[1]}:{fs.name}"
    return "?"


def _save_finding(folder: Path, case: dict[str, bytes], info: dict) -> str:
    d = Path(folder) / f"{os.getpid()}-{info['seq']}"
    d.mkdir(parents=True, exist_ok=True)
    for name, data in case.items():
        (d / name).write_bytes(data)
    return str(d)


def fuzz(args, inflight: Inflight) -> None:
    from tests.fuzz.seeds import load_seeds
    from tests.fuzz.targets import WORKER_TARGETS, classify, make_input

    seeds = load_seeds()
    names = args.targets.split(",")
    targets = [WORKER_TARGETS[n] for n in names]
    resource.setrlimit(resource.RLIMIT_AS, (_address_space() + ADDRESS_SPACE_HEADROOM, resource.RLIM_INFINITY))
    _emit({"t": "ready"})
    rng = random.Random(args.seed)
    # The schedule is on the wall clock from the campaign's start (--epoch), so a worker restarted
    # after a crash carries on with the target the schedule says, instead of starting over.
    epoch = args.epoch or time.time()
    deadline = epoch + args.seconds
    slice_s = max(0.5, args.seconds / len(targets)) if args.slice <= 0 else args.slice
    counts: dict[str, dict[str, int]] = {n: {} for n in names}
    sigs: dict[str, int] = {}  # finding signature -> inputs, since the last stats message
    reported: set[str] = set()  # signatures this worker has sent an input of
    last_flush = time.monotonic()
    peak = _peak_rss()
    while time.time() < deadline:
        k = int((time.time() - epoch) / slice_s)
        ti = k % len(targets)
        target = targets[ti]
        slice_end = time.monotonic() + max(0.0, min(deadline, epoch + (k + 1) * slice_s) - time.time())
        tcounts = counts[target.name]
        slice_start = time.monotonic()
        while (now := time.monotonic()) < slice_end:
            case = make_input(target, seeds[target.seed_kind], rng)
            size = sum(len(v) for v in case.values())
            if not inflight.begin(ti, encode_case(case)):
                continue
            exc = _run_one(target.run, case)
            inflight.end()
            outcome, err = classify(exc, case)
            now_peak = _peak_rss()
            grown, peak = now_peak - peak, now_peak  # what this input added to the peak
            if (exc is not None and _is_memory_error(exc)) or grown > memory_limit(target, size):
                outcome = "memory"
                err = "allocation-failed" if exc is not None and _is_memory_error(exc) else \
                    f"peak-rss (+{grown >> 20} MiB for a {size}-byte input)"
            key = f"{outcome}:{err}" if err else outcome
            tcounts[key] = tcounts.get(key, 0) + 1
            if outcome in ("exception", "memory", "unnamed"):
                frame = frame_of(exc) if exc is not None else "?"
                sig = f"{target.name}|{outcome}|{err.split(' ')[0]}|{frame}"
                sigs[sig] = sigs.get(sig, 0) + 1
                if sig not in reported or outcome == "memory":  # one input per signature is enough
                    reported.add(sig)
                    info = {"t": "finding", "target": target.name, "outcome": outcome, "error": err,
                            "seq": inflight.seq, "size": size, "frame": frame,
                            "trace": "".join(traceback.format_exception(exc))[-6000:] if exc is not None else err}
                    info["path"] = _save_finding(Path(args.findings), case, info)
                    _emit(info)
                if outcome == "memory":  # the peak only grows: a fresh worker measures the next input
                    tcounts["seconds"] = tcounts.get("seconds", 0) + time.monotonic() - slice_start
                    _emit({"t": "stats", "counts": counts, "sigs": sigs})
                    sys.exit(3)
            if now - last_flush > STATS_EVERY:
                tcounts["seconds"] = tcounts.get("seconds", 0) + now - slice_start
                slice_start = now
                _emit({"t": "stats", "counts": counts, "sigs": sigs})
                counts, sigs = {n: {} for n in names}, {}
                tcounts = counts[target.name]
                last_flush = now
        tcounts["seconds"] = tcounts.get("seconds", 0) + time.monotonic() - slice_start
    _emit({"t": "stats", "counts": counts, "sigs": sigs})
    _emit({"t": "done"})


def replay(args, inflight: Inflight) -> None:
    from tests.fuzz.seeds import read_case
    from tests.fuzz.targets import WORKER_TARGETS as TARGETS
    from tests.fuzz.targets import classify

    resource.setrlimit(resource.RLIMIT_AS, (_address_space() + ADDRESS_SPACE_HEADROOM, resource.RLIM_INFINITY))
    _emit({"t": "ready"})
    peak = _peak_rss()
    for folder in args.replay:
        folder = Path(folder)
        target = TARGETS[folder.parent.name]
        case = read_case(folder)
        inflight.begin(list(TARGETS).index(target.name), encode_case(case))
        exc = _run_one(target.run, case)
        inflight.end()
        outcome, err = classify(exc, case)
        now_peak = _peak_rss()
        grown, peak = now_peak - peak, now_peak
        if (exc is not None and _is_memory_error(exc)) or grown > memory_limit(target, len(encode_case(case))):
            outcome, err = "memory", f"peak +{grown >> 20} MiB" if exc is None else err
        _emit({"t": "replayed", "path": str(folder), "outcome": outcome, "error": err,
               "message": str(exc)[:500] if exc is not None else "",
               "trace": "".join(traceback.format_exception(exc))[-4000:] if exc is not None else ""})
    _emit({"t": "done"})


def entry(argv: list[str], conn, log: str) -> None:
    """The worker process's main (forked from the fork server)."""
    global _CONN
    _CONN = conn
    _setup_child(log)
    p = argparse.ArgumentParser()
    p.add_argument("--inflight", required=True)
    p.add_argument("--targets", default="")
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--slice", type=float, default=0, help="seconds per target before moving on (0: even split)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epoch", type=float, default=0, help="the campaign's start (time.time()); the schedule's zero")
    p.add_argument("--findings", default=".")
    p.add_argument("--replay", nargs="*")
    args = p.parse_args(argv)
    inflight = Inflight(args.inflight)
    if args.replay is not None:
        replay(args, inflight)
    else:
        fuzz(args, inflight)
    sys.stderr.flush()
