"""Conversions kept per file content, and started before the page asks for them.

Model Explorer's server calls the adapter's `convert` on every open of a model: each page load, each
reload, each tab. Converting a 5,000-node record is ~0.5 s of CPU, spent again each time on the same
bytes. So a finished conversion is kept, keyed by the file's kind (suffix) and the SHA-256 of its
bytes: an unchanged file is answered at once, a changed one (rewritten in place, even to the same
size and mtime) hashes differently and is converted anew: a stale graph is never served. A
conversion during which the file changed (its size, mtime or inode moved) is returned but not kept.

Model Explorer's command (`model-explorer FILE --extensions=etlab.model_explorer`) names its files
before any page exists; the adapter's module is imported while the server starts, so it converts
them then, on a background thread (`preload`): by the time the browser has loaded the page and asks,
the answer is waiting. A request for a file still being converted waits for that conversion instead
of starting a second one.

The kept answers are shared between requests: Model Explorer's server only copies them
(`dataclasses.asdict`); a caller must not change them. `ETLAB_ME_CACHE=0` turns keeping and
preloading off (every open converts, as before).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from pathlib import Path

MAX_ENTRIES = 4  # files whose answers are kept (least recently used out first): a session opens one or two
MAX_WEIGHT = 200_000  # graph nodes kept in all (~3 KB of Python objects each); the newest answer is kept anyway
SUFFIXES = (".pte", ".etrecord")
_CHUNK = 1 << 20


def enabled() -> bool:
    """Whether conversions are kept and preloaded (`ETLAB_ME_CACHE=0` turns both off)."""
    return os.environ.get("ETLAB_ME_CACHE", "1") != "0"


def _signature(path: str) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns, st.st_ino


def _unchanged(path: str, before: tuple[int, int, int]) -> bool:
    try:
        return _signature(path) == before
    except OSError:  # removed or replaced meanwhile: the answer is the caller's, not kept
        return False


def content_key(path: str) -> tuple[str, str]:
    """(the file's suffix, lower case; the SHA-256 of its bytes): what its conversion depends on."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return Path(path).suffix.lower(), digest.hexdigest()


class ConversionCache:
    """`convert(path)`'s answers kept by file content (see the module doc); thread-safe."""

    def __init__(self, convert: Callable[[str], object], max_entries: int = MAX_ENTRIES,
                 weigh: Callable[[object], int] = lambda _answer: 0, max_weight: int = MAX_WEIGHT):
        self._convert = convert
        self._max, self._weigh, self._max_weight = max_entries, weigh, max_weight
        self._done: OrderedDict[tuple[str, str], object] = OrderedDict()
        self._weights: dict[tuple[str, str], int] = {}
        self._running: dict[tuple[str, str], Future] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._done)

    def clear(self) -> None:
        """Forgets every kept answer (conversions under way finish for their callers)."""
        with self._lock:
            self._done.clear()
            self._weights.clear()

    def get(self, path: str):
        """The answer for the file at `path` as it is now: kept, being converted (waited for), or converted
        here. A conversion's error is raised to every caller waiting for it and nothing is kept."""
        if not enabled():
            return self._convert(path)
        before = _signature(path)
        key = content_key(path)
        with self._lock:
            if key in self._done:
                self._done.move_to_end(key)
                return self._done[key]
            future = self._running.get(key)
            owner = future is None
            if owner:
                future = self._running[key] = Future()
        if not owner:
            return future.result()
        try:
            answer = self._convert(path)
            unchanged = _unchanged(path, before)
        except BaseException as e:
            with self._lock:
                del self._running[key]
            future.set_exception(e)
            raise
        with self._lock:
            del self._running[key]
            if unchanged:
                self._done[key] = answer
                self._weights[key] = self._weigh(answer)
                while len(self._done) > 1 and (len(self._done) > self._max or
                                               sum(self._weights.values()) > self._max_weight):
                    old, _ = self._done.popitem(last=False)
                    del self._weights[old]
        future.set_result(answer)
        return answer

    def preload(self, paths: Iterable[str]) -> threading.Thread | None:
        """Converts `paths` on a daemon thread (errors are left for the page's own request to report);
        returns the thread, or None when there is nothing to do or caching is off."""
        paths = list(paths)
        if not paths or not enabled():
            return None

        def run() -> None:
            for p in paths:
                try:
                    self.get(p)
                except Exception:  # the page's own open converts again and shows the error
                    pass

        thread = threading.Thread(target=run, name="etlab-model-explorer-preload", daemon=True)
        thread.start()
        return thread


def command_line_models(argv: list[str]) -> list[str]:
    """The `.pte` / `.etrecord` files Model Explorer's command line names (its positional model paths,
    space- or comma-separated, `~` expanded as its server expands them); options are skipped."""
    out = []
    for arg in argv:
        if arg.startswith("-"):
            continue
        for part in arg.split(","):
            path = os.path.expanduser(part.strip())
            if Path(path).suffix.lower() in SUFFIXES and os.path.isfile(path) and path not in out:
                out.append(path)
    return out
