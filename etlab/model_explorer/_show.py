"""Model Explorer for a notebook cell: its own server process on 127.0.0.1, shown in an iframe.

Model Explorer's Python API embeds itself only in Colab; elsewhere `visualize()` blocks the kernel
serving forever. So `show` runs the `model-explorer` command in a child process (bounded: it stops
with the returned session, or when the kernel exits), waits for the address it prints, and the
session renders as an iframe. The same launcher starts it in the browser test.
"""

from __future__ import annotations

import atexit
import html
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from etlab.jupyter import free_port
from etlab.model_explorer._node_data import OVERLAY_KEYS

INSTALL_HINT = "Model Explorer is not installed: pip install 'etlab[model-explorer]' (or `make setup`)"
ADAPTER_MODULE = "etlab.model_explorer"


def me_command() -> list[str]:
    """How to start Model Explorer: its console script beside this Python, else on PATH."""
    script = Path(sys.executable).with_name("model-explorer")
    if script.exists():
        return [str(script)]
    found = shutil.which("model-explorer")
    if found is None:
        raise RuntimeError(INSTALL_HINT)
    return [found]


@dataclass
class ModelExplorerSession:
    """A running Model Explorer server: its address (`url` opens the given files) and process."""

    url: str
    process: subprocess.Popen
    height: int = 720
    workdir: Path | None = None
    log: list[str] = field(default_factory=list)

    def stop(self) -> None:
        """Stops the server (terminate, then kill if it has not exited after 10 s) and removes its working folder."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _repr_html_(self) -> str:
        src = html.escape(self.url, quote=True)
        return (f'<iframe src="{src}" title="Model Explorer" style="width:100%;height:{int(self.height)}px;'
                f'border:0"></iframe><div><a href="{src}" target="_blank" rel="noopener">open Model Explorer in a '
                "new tab</a></div>")


def start(paths: list[str], node_data_paths: list[str] = (), *, port: int | None = None, timeout: float = 180,
          extensions: list[str] = (ADAPTER_MODULE,), env: dict[str, str] | None = None) -> ModelExplorerSession:
    """Starts `model-explorer` on 127.0.0.1 for `paths` with overlays (`env`: more environment variables
    for it); returns once it serves. Raises RuntimeError with its output if it exits or does not answer
    within `timeout` seconds."""
    port = port or free_port()
    cmd = [*me_command(), *map(str, paths), "--host", "127.0.0.1", "--port", str(port), "--no_open_in_browser"]
    if node_data_paths:
        cmd.append("--node_data_paths=" + ",".join(map(str, node_data_paths)))
    if extensions:
        cmd.append("--extensions=" + ",".join(extensions))
    env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    atexit.register(lambda: proc.poll() is None and proc.terminate())
    log: list[str] = []
    found: list[str] = []

    def read() -> None:
        for line in proc.stdout:
            log.append(line.rstrip())
            m = re.match(r"^(http://127\.0\.0\.1:\d+/\S*)", line.strip())
            if m and not found:
                found.append(m.group(1))

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + timeout
    while not found:
        if proc.poll() is not None:
            raise RuntimeError(f"model-explorer exited ({proc.returncode}):\n" + "\n".join(log[-30:]))
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"model-explorer did not start within {timeout:.0f} s:\n" + "\n".join(log[-30:]))
        time.sleep(0.1)
    return ModelExplorerSession(url=found[0], process=proc, log=log)


def show(source, *, overlay: str = "latency_p50", height: int = 720, port: int | None = None,
         kinds=None, method: str | None = None) -> ModelExplorerSession:
    """Model Explorer in the notebook: a `.pte`/`.etrecord` path opens through etlab's adapter; an
    Inspector (or ETRecord) is exported first (graphs + the `overlay`), into a folder removed with the
    session. Call `.stop()` on the result to end the server."""
    if overlay not in OVERLAY_KEYS:
        raise ValueError(f"overlay must be one of {', '.join(OVERLAY_KEYS)}, got {overlay!r}")
    if isinstance(source, (str, os.PathLike)):
        session = start([os.path.abspath(source)], port=port)
    else:
        from etlab.model_explorer._export import export

        workdir = Path(tempfile.mkdtemp(prefix="etlab-me-"))
        written = export(source, workdir, kinds=kinds, method=method)
        data = [str(written[overlay])] if overlay in written else []
        session = start([str(written["graphs"])], data, port=port)
        session.workdir = workdir
    session.height = height
    return session
