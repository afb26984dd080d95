"""The Lab server's readers run in worker processes with a time and a memory budget, so no file can
stall the server.

A crafted file may make a reader spin or allocate (issue 24: a 30 KB ETRecord kept a reader thread
busy forever, and two such requests took the server's whole thread pool, so every viewer hung).
A thread cannot be stopped; a process can. So the server's `Service` runs in workers:

- a worker is `python -m etlab.jupyter._pool ROOT MEMORY_MB`: it imports the readers once, caps its
  address space at its size after the imports plus the memory budget (RLIMIT_AS), then answers one
  request at a time as JSON lines (no pickle crosses the pipe), keeping its own cache of parsed files;
- a request that does not answer within the time budget has its worker killed, and answers a
  FormatError naming the file; a worker that runs out of memory or dies answers the same way and is
  replaced;
- one file occupies at most one worker: requests about the same file wait for each other (they go
  to the worker that read it last, whose cache holds it), and the pool grows up to `max_workers`
  with a spare kept ready, so a hostile file never holds up another file's viewer.

Budgets come from the server's environment: ETLAB_LAB_TIMEOUT_S (seconds per request, default 120),
ETLAB_LAB_MEMORY_MB (MiB per worker above its size after import, default 4096), ETLAB_LAB_WORKERS
(workers kept ready, default 2), ETLAB_LAB_MAX_WORKERS (default 6).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from etlab.errors import FormatError

log = logging.getLogger("etlab.jupyter")

METHODS = frozenset({"pte", "etdp", "etrecord", "bpte", "verify", "artifacts", "compare"})
STARTUP_S = 180.0  # importing torch and the readers on a loaded machine
IDLE_S = 120.0  # a worker beyond the ready ones exits after this long unused
_OK, _ERR = b"O", b"E"


@dataclass(frozen=True)
class Budget:
    """What the Lab server's workers may spend: seconds per request, memory per worker, and how many workers stay
    warm and may run at once."""

    seconds: float = 120.0
    memory_mb: int = 4096
    workers: int = 2
    max_workers: int = 6

    @classmethod
    def from_env(cls, env=os.environ) -> Budget:
        """The budgets set in the environment (ETLAB_LAB_*), defaults otherwise; a bad value is refused."""
        def number(name: str, default, kind):
            text = env.get(name)
            if text is None or not text.strip():
                return default
            try:
                value = kind(text)
            except ValueError:
                raise ValueError(f"{name}={text!r}: not a number") from None
            if not value > 0:
                raise ValueError(f"{name}={text!r}: must be positive")
            return value

        workers = number("ETLAB_LAB_WORKERS", cls.workers, int)
        return cls(number("ETLAB_LAB_TIMEOUT_S", cls.seconds, float), number("ETLAB_LAB_MEMORY_MB", cls.memory_mb, int),
                   workers, max(workers + 1, number("ETLAB_LAB_MAX_WORKERS", cls.max_workers, int)))


class WorkerLost(Exception):
    """The worker died or was stopped; the message says how."""


def _read_line(sock: socket.socket, buf: bytearray, timeout: float | None) -> bytes:
    """One line from `sock` (the rest stays in `buf`); TimeoutError (None: waits as long as it takes),
    or WorkerLost at end of stream."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while b"\n" not in buf:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and (left <= 0 or not select.select([sock], [], [], left)[0]):
            raise TimeoutError
        try:
            chunk = sock.recv(1 << 20)
        except OSError as e:
            raise WorkerLost(f"its reader process is gone ({e})") from None
        if not chunk:
            raise WorkerLost("its reader process ended (killed: out of memory, or crashed)")
        buf += chunk
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    return line


class _Worker:
    """One worker process (forked by the zygote) and its socket. Blocking; one thread at a time."""

    def __init__(self, sock: socket.socket, pid: int):
        self.sock, self.pid = sock, pid
        self.last: str | None = None  # the file it read last (its cache holds it)
        self.idle_since = time.monotonic()
        self._buf = bytearray()
        try:
            _read_line(self.sock, self._buf, STARTUP_S)  # its memory cap is set
        except (WorkerLost, TimeoutError):
            self.kill()
            raise WorkerLost("a reader process did not start") from None

    def call(self, request: dict, timeout: float) -> tuple[bool, bytes]:
        """(ok, JSON text) of a request; WorkerLost when the worker dies, TimeoutError past `timeout`."""
        try:
            self.sock.sendall(json.dumps(request).encode() + b"\n")
        except OSError as e:
            raise WorkerLost(f"its reader process is gone ({e})") from None
        line = _read_line(self.sock, self._buf, timeout)
        return line[:1] == _OK, line[1:]

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)  # the zygote reaps it
        except ProcessLookupError:
            pass
        self.sock.close()


class _Zygote:
    """A process that has imported the readers and forks a worker on request, so a new worker (a spare,
    or one replacing a killed one) is ready in a fraction of a second, not after torch's import."""

    def __init__(self, root: str, memory_mb: int):
        self.sock, theirs = socket.socketpair()
        self.proc = subprocess.Popen([sys.executable, "-m", "etlab.jupyter._pool", root, str(memory_mb),
                                      str(theirs.fileno())], pass_fds=[theirs.fileno()], cwd=root)
        theirs.close()
        self.lock = threading.Lock()
        try:
            _read_line(self.sock, bytearray(), STARTUP_S)
        except (WorkerLost, TimeoutError):
            self.close()
            raise WorkerLost("the reader processes' zygote did not start (see the server log)") from None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def fork(self) -> _Worker:
        with self.lock:
            try:
                self.sock.sendall(b"F")
                if not select.select([self.sock], [], [], STARTUP_S)[0]:
                    raise WorkerLost("the zygote did not fork a reader process")
                data, fds, _, _ = socket.recv_fds(self.sock, 64, 1)
            except OSError as e:
                raise WorkerLost(f"the zygote is gone ({e})") from None
        if not fds:
            raise WorkerLost("the zygote is gone")
        return _Worker(socket.socket(fileno=fds[0]), int(data))

    def close(self) -> None:
        self.sock.close()  # the zygote exits at end of stream
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class WorkerPool:
    """Worker processes for the Service's endpoints; see the module docstring."""

    def __init__(self, root: str | os.PathLike, budget: Budget | None = None):
        self.root = os.path.realpath(root)
        self.budget = budget or Budget.from_env()
        self._cond = threading.Condition()
        self._idle: list[_Worker] = []
        self._count = 0  # alive or starting
        self._starting = 0
        self._waiting = 0
        self._start_error: str | None = None
        self._files: dict[str, asyncio.Lock] = {}
        self._zygote: _Zygote | None = None
        self._zygote_lock = threading.Lock()
        self._failed: dict[tuple, tuple] = {}  # request -> (file version, message) of a stopped or lost read

    # -- workers (threads) --------------------------------------------------------------------------------

    def warm(self) -> None:
        """Starts the workers kept ready (in the background)."""
        with self._cond:
            while self._count < self.budget.workers:
                self._start_locked()

    def _start_locked(self) -> None:
        self._count += 1
        self._starting += 1
        self._start_error = None
        threading.Thread(target=self._start, daemon=True, name="etlab-lab-start").start()

    def _fork(self) -> _Worker:
        with self._zygote_lock:
            if self._zygote is None or not self._zygote.alive():
                self._zygote = _Zygote(self.root, self.budget.memory_mb)
            zygote = self._zygote
        return zygote.fork()

    def _start(self) -> None:
        try:
            worker = self._fork()
        except (OSError, WorkerLost, TimeoutError) as e:
            log.error("etlab: a reader process did not start: %s", e or type(e).__name__)
            with self._cond:
                self._count -= 1
                self._starting -= 1
                self._start_error = f"a reader process did not start ({e or type(e).__name__})"
                self._cond.notify_all()
            return
        with self._cond:
            self._starting -= 1
            self._idle.append(worker)
            self._cond.notify_all()

    def acquire(self, name: str) -> _Worker:
        """An idle worker (the one that read `name` last, if idle), starting one if there is room."""
        with self._cond:
            self._waiting += 1
            try:
                while not self._idle:
                    if self._starting < self._waiting and self._count < self.budget.max_workers:
                        self._start_locked()
                    elif self._start_error and not self._starting:
                        raise RuntimeError(f"etlab: {self._start_error}")
                    self._cond.wait(STARTUP_S)
                worker = next((w for w in self._idle if w.last == name), self._idle[-1])
                self._idle.remove(worker)
                if not self._idle and self._count < self.budget.max_workers:
                    self._start_locked()  # a spare, so the next file does not wait for an import
                return worker
            finally:
                self._waiting -= 1

    def release(self, worker: _Worker, name: str) -> None:
        """Returns a worker after a request; workers beyond the warm count that have idled long enough are stopped."""
        worker.last, worker.idle_since = name, time.monotonic()
        stale = []
        with self._cond:
            self._idle.append(worker)
            now = time.monotonic()
            while len(self._idle) > self.budget.workers and now - self._idle[0].idle_since > IDLE_S:
                stale.append(self._idle.pop(0))
                self._count -= 1
            self._cond.notify_all()
        for w in stale:
            w.kill()

    def discard(self, worker: _Worker) -> None:
        """Kills a worker (stopped, broken or out of memory) and keeps the ready ones ready."""
        worker.kill()
        with self._cond:
            self._count -= 1
            if self._count < self.budget.workers:
                self._start_locked()
            self._cond.notify_all()

    def _version(self, name: str) -> tuple | None:
        """The file's (size, mtime) as a key only (the worker checks the path before reading it)."""
        try:
            st = os.stat(os.path.join(self.root, name))
        except (OSError, ValueError):
            return None
        return st.st_size, st.st_mtime_ns

    def run(self, method: str, args: list, name: str, seconds: float) -> tuple[bool, bytes]:
        """A request on a worker (blocking): (ok, JSON text); FormatError when it passes `seconds` or
        its worker dies. The same request about the same version of a file that failed that way
        fails again at once (a viewer reloading a hostile file does not take a worker each time)."""
        key = (method, json.dumps(args), name)
        failed = self._failed.get(key)
        if failed is not None and failed[0] == self._version(name) and failed[0] is not None:
            raise FormatError(failed[1])
        worker = self.acquire(name)
        try:
            ok, text = worker.call({"method": method, "args": args, "name": name}, seconds)
        except (TimeoutError, WorkerLost) as e:
            self.discard(worker)
            message = (f"{name}: reading it took more than {seconds:g} s; the server stopped it (the time budget "
                       "per request is ETLAB_LAB_TIMEOUT_S)") if isinstance(e, TimeoutError) else \
                f"{name}: reading it failed: {e}"
            if len(self._failed) > 256:
                self._failed.clear()
            self._failed[key] = (self._version(name), message)
            raise FormatError(message) from None
        if not ok and json.loads(text).get("restart"):
            self.discard(worker)
        else:
            self.release(worker, name)
        return ok, text

    # -- requests (the server's event loop) -----------------------------------------------------------------

    async def call(self, method: str, *args, name: str, seconds: float | None = None) -> tuple[bool, bytes]:
        """run() without blocking the event loop; requests about the same file (`name`) wait for each
        other here, as coroutines, so a hostile file holds one worker and one thread at most."""
        if method not in METHODS:
            raise ValueError(f"{method}: not an endpoint of the Service")
        lock = self._files.setdefault(name, asyncio.Lock())
        try:
            async with lock:
                return await _in_thread(self.run, method, list(args), name, seconds or self.budget.seconds)
        finally:
            if not lock.locked() and self._files.get(name) is lock:
                del self._files[name]

    def close(self) -> None:
        """Stops the idle workers and the zygote: the server's shutdown (a worker busy with a request is not
        stopped here)."""
        with self._cond:
            idle, self._idle = self._idle, []
            self._count -= len(idle)
        for w in idle:
            w.kill()
        with self._zygote_lock:
            if self._zygote is not None:
                self._zygote.close()
                self._zygote = None


def _in_thread(fn, *args) -> asyncio.Future:
    """fn(*args) in a daemon thread (it only waits on a worker's pipe; a daemon thread never holds up
    the server's exit), as a future of the running loop."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(value, error) -> None:
        if not future.done():
            future.set_exception(error) if error is not None else future.set_result(value)

    def run() -> None:
        try:
            value = fn(*args)
        except BaseException as e:  # handed to the awaiting coroutine
            loop.call_soon_threadsafe(settle, None, e)
        else:
            loop.call_soon_threadsafe(settle, value, None)

    threading.Thread(target=run, daemon=True, name="etlab-lab-request").start()
    return future


# -- the worker process -----------------------------------------------------------------------------------


def _limit_memory(memory_mb: int) -> None:
    """RLIMIT_AS = this process's size now (the imports) + the budget: a reader asking for more gets
    MemoryError (or torch's allocation error) instead of taking the machine's memory."""
    import resource

    with open("/proc/self/status") as f:
        size_kb = next(int(line.split()[1]) for line in f if line.startswith("VmSize:"))
    limit = size_kb * 1024 + memory_mb * (1 << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _answer(service, request: dict, memory_mb: int) -> tuple[bytes, bool]:
    """The reply line to a request, and whether this worker must exit after it (out of memory)."""
    from etlab.jupyter._store import PathError, clean_json

    name = str(request.get("name"))
    try:
        method, args = request["method"], request["args"]
        if method not in METHODS:
            raise ValueError(f"{method}: not an endpoint")
        result = getattr(service, method)(*args)
        return _OK + json.dumps(clean_json(result), allow_nan=False, separators=(",", ":")).encode(), False
    except PathError as e:
        reply = {"kind": "path", "status": e.status, "message": str(e)}
    except FormatError as e:
        reply = {"kind": "format", "message": str(e)}
    except MemoryError:
        reply = {"kind": "format", "restart": True,
                 "message": f"{name}: reading it needs more than the server's memory budget ({memory_mb} MiB, "
                            "ETLAB_LAB_MEMORY_MB)"}
    except Exception as e:  # a reader bug: reported like a bad file, logged with its traceback
        log.exception("etlab: %s of %s failed", request.get("method"), name)
        text = str(e)
        if isinstance(e, RuntimeError) and "alloc" in text.lower():  # torch's allocator under RLIMIT_AS
            reply = {"kind": "format", "restart": True, "message": f"{name}: reading it needs more than the "
                     f"server's memory budget ({memory_mb} MiB, ETLAB_LAB_MEMORY_MB): {text[:200]}"}
        else:
            reply = {"kind": "bug", "message": f"{type(e).__name__}: {text}"}
    return _ERR + json.dumps(reply).encode(), bool(reply.get("restart"))


def _serve(sock: socket.socket, service, memory_mb: int) -> None:
    """A worker's loop (a forked child of the zygote): one JSON request per line, one reply per line."""
    _limit_memory(memory_mb)
    sock.sendall(_OK + b"{}\n")
    buf = bytearray()
    while True:
        try:
            request = json.loads(_read_line(sock, buf, None))
        except (WorkerLost, ValueError, TimeoutError):
            return
        reply, restart = _answer(service, request, memory_mb)
        sock.sendall(reply + b"\n")
        if restart:
            return


def zygote(root: str, memory_mb: int, fd: int) -> int:
    """Imports the readers, then forks a worker per b"F" read from the server's socket `fd`, handing
    the server the worker's end of a new socket pair (and its pid); exits when the server goes."""
    logging.basicConfig(level=logging.WARNING, format="[etlab reader %(process)d] %(message)s")
    import etlab.etdump
    import etlab.etrecord
    import etlab.inspector
    import etlab.visualizer  # noqa: F401  (before the fork: every worker needs them; torch.export's take seconds)
    from etlab.jupyter._records import warm_up_readers
    from etlab.jupyter._service import Service

    try:  # torch's first-use set-up, paid once here rather than in each worker's first view
        warm_up_readers()
    except Exception:  # a slower first view, not a server that does not start
        log.warning("etlab: warming up the readers failed", exc_info=True)
    import gc

    gc.freeze()  # the imports' objects: never collected again, never copied into a worker by a collection

    server = socket.socket(fileno=fd)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # workers are reaped as they end
    server.sendall(_OK + b"\n")
    while server.recv(1) == b"F":
        ours, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:  # the worker
            server.close()
            ours.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # its own children (verify) are waited for
            try:
                _serve(theirs, Service(root), memory_mb)
            finally:
                os._exit(0)
        theirs.close()
        socket.send_fds(server, [str(pid).encode()], [ours.fileno()])
        ours.close()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(zygote(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
    except KeyboardInterrupt:  # Ctrl-C at `make lab` reaches the whole process group
        sys.exit(0)
