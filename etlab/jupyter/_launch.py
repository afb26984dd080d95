"""A JupyterLab server for the benchmark and the browser tests: 127.0.0.1, a free port, a random
token, its own root folder, a bounded lifetime (stopped on exit, killed if it does not stop).

`LabServer` runs this interpreter's JupyterLab with its own Jupyter dirs (nothing of the user's
config is read) and the etlab extension linked into them as an installed etlab puts it. Override
`command()` to start it another way: `MakeLab` starts it as `make lab` does, with no overrides (what
tests/jupyter and bench/lab.py use)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path


def free_port() -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def built_labextension() -> Path:
    """The prebuilt extension inside the package (`make labextension` builds it)."""
    path = Path(str(resources.files("etlab.jupyter").joinpath("labextension")))
    if not (path / "package.json").is_file():
        raise FileNotFoundError(f"{path}: the JupyterLab extension is not built; run `make labextension`")
    return path


def jupyter_dirs(base: Path) -> dict[str, str]:
    """Environment for a Jupyter process that sees only `base`: the extension under
    share/jupyter/labextensions and the server-extension config under etc/jupyter, as pip installs them."""
    share = base / "share" / "jupyter"
    (share / "labextensions").mkdir(parents=True, exist_ok=True)
    link = share / "labextensions" / "etlab-labextension"
    if not link.exists():
        link.symlink_to(built_labextension(), target_is_directory=True)
    conf = base / "etc" / "jupyter" / "jupyter_server_config.d"
    conf.mkdir(parents=True, exist_ok=True)
    src = resources.files("etlab.jupyter").joinpath("config", "etlab.json")
    (conf / "etlab.json").write_text(src.read_text(encoding="utf-8"), encoding="utf-8")
    settings = base / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True, exist_ok=True)
    # no news / update toasts over the views
    (settings / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false",
                                                                          "checkForUpdates": False}))
    return {"JUPYTER_PATH": str(share), "JUPYTER_CONFIG_PATH": str(base / "etc" / "jupyter"),
            "JUPYTER_CONFIG_DIR": str(base / "config"), "JUPYTER_DATA_DIR": str(base / "data"),
            "JUPYTER_RUNTIME_DIR": str(base / "runtime"), "JUPYTER_PLATFORM_DIRS": "1",
            "JUPYTERLAB_SETTINGS_DIR": str(base / "settings"),
            "JUPYTERLAB_WORKSPACES_DIR": str(base / "workspaces")}


@dataclass
class LabServer:
    """A running JupyterLab; `url(path)` carries the token. Use as a context manager."""

    root: Path
    base: Path
    lifetime_s: float = 900.0
    port: int = field(default_factory=free_port)
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    proc: subprocess.Popen | None = None
    log_path: Path | None = None

    def url(self, path: str = "lab") -> str:
        """The URL of `path` on this server, with the token, ready for a browser."""
        sep = "&" if "?" in path else "?"
        return f"http://127.0.0.1:{self.port}/{path}{sep}token={self.token}"

    def options(self) -> list[str]:
        """Server options of this instance: its port, token and lifetime, the app exposed to the page
        (the tests drive it), no update checks."""
        return [f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
                "--ServerApp.open_browser=False", "--LabApp.expose_app_in_browser=True",
                "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                f"--ServerApp.shutdown_no_activity_timeout={int(self.lifetime_s)}"]

    def command(self) -> tuple[list[str], dict[str, str]]:
        """The command line and environment: this interpreter's JupyterLab seeing only `base`'s Jupyter dirs."""
        cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
               f"--ServerApp.root_dir={self.root}", "--ServerApp.allow_root=True", *self.options()]
        return cmd, {**os.environ, **jupyter_dirs(self.base)}

    def start(self, timeout_s: float = 90.0) -> LabServer:
        """Starts the server (output to `server.log`) and waits until it answers, up to `timeout_s`; the log's tail
        is in the error when it does not come up."""
        cmd, env = self.command()
        self.log_path = self.base / "server.log"
        log = self._log = open(self.log_path, "wb")  # the server writes to it until stopped
        self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=self.root,
                                     start_new_session=True)
        self._deadline = time.monotonic() + self.lifetime_s
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            if self.alive():
                return self
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"JupyterLab did not answer within {timeout_s} s:\n{self.log()[-3000:]}")

    def alive(self) -> bool:
        """Whether the server answers its API (it stays up after a bad file)."""
        try:
            with urllib.request.urlopen(self.url("api/status"), timeout=5) as r:
                return r.status == 200
        except OSError:
            return False

    def get_json(self, path: str, method: str = "GET") -> tuple[int, dict]:
        """An etlab endpoint's status and JSON body."""
        req = urllib.request.Request(self.url(path), method=method, data=b"" if method == "POST" else None)
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def log(self) -> str:
        """What the server has written so far (empty before it starts): the first thing to read when a test against
        it fails."""
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def stop(self) -> None:
        """SIGTERM to the server's process group, SIGKILL after 10 s."""
        if self.proc is None or self.proc.poll() is not None:
            self._close_log()
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=10)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)
        self._close_log()

    def _close_log(self) -> None:
        log = getattr(self, "_log", None)
        if log is not None and not log.closed:
            log.close()

    def __enter__(self) -> LabServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@dataclass
class MakeLab(LabServer):
    """JupyterLab started exactly as `make lab` starts it (`make lab-server` in the checkout `repo`, the
    command `make lab` ends with) on the venv as `make setup` left it: no JUPYTER_PATH or other path
    overrides, so the extension and the "etlab" kernel are found only where the set-up put them. The
    folder, port, token and lifetime are passed as a user passes options (LAB_ROOT, LAB_ARGS)."""

    repo: Path = field(default_factory=lambda: Path(__file__).resolve().parents[2])

    def command(self) -> tuple[list[str], dict[str, str]]:
        """The `make lab-server` command line and environment (the outer make's jobserver variables removed); a
        FileNotFoundError when `repo` is not a checkout."""
        if not (self.repo / "Makefile").is_file():
            raise FileNotFoundError(f"{self.repo}: no Makefile (make lab-server runs in an etlab checkout)")
        cmd = ["make", "-C", str(self.repo), "--no-print-directory", "lab-server", f"LAB_ROOT={self.root}",
               "LAB_ARGS=" + " ".join(self.options())]
        # an outer make's jobserver is not this one's
        env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
        return cmd, env


def clean_base(base: Path) -> None:
    """Removes a LabServer's Jupyter dirs (not the root folder it served)."""
    shutil.rmtree(base, ignore_errors=True)
