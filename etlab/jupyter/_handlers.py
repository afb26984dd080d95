"""HTTP endpoints of the server extension (under /etlab/): JSON for the JupyterLab viewers, and the
shared view modules of etlab/visualizer/static. Token-authenticated like every Jupyter endpoint.
Files are read in worker processes with a time and memory budget (`_pool`): the server keeps
answering while a big or hostile file is read, one file never holds up another's viewer, and every
failure is a JSON error with the reader's message (the server stays up)."""

from __future__ import annotations

import json
import re
import threading
from functools import cache
from importlib import resources

import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

from etlab.errors import FormatError
from etlab.jupyter._pool import Budget, WorkerPool
from etlab.jupyter._service import VERIFY_TIMEOUT_S, Service
from etlab.jupyter._store import PathError

_pools: list[WorkerPool] = []  # the server's (setup_handlers), for warm_up


@cache
def view_module(name: str) -> str:
    """A file of etlab/visualizer/static as it is: an ES view module (graph_view.js imports its parts,
    graph_pane.js, ..., by relative URL, which this same endpoint answers; the browser loads each
    once per page) or theme.css, the color variables the views use (they follow JupyterLab's).
    plotly.js: the library the notebook's charts load once per page."""
    if name == "plotly.js":  # the notebook charts load it from here once per page, not from a busy kernel
        from plotly.offline import get_plotlyjs

        return get_plotlyjs()
    static = resources.files("etlab.visualizer").joinpath("static")
    if not re.fullmatch(r"[a-z_]+\.(js|css)", name) or not static.joinpath(name).is_file():
        raise KeyError(name)
    return static.joinpath(name).read_text(encoding="utf-8")


class _Base(APIHandler):
    @property
    def service(self) -> Service:
        return self.settings["etlab_service"]

    @property
    def pool(self) -> WorkerPool:
        return self.settings["etlab_pool"]

    async def run_json(self, method: str, name: str | None, *args, seconds: float | None = None):
        """Answers Service.<method>(*args), run by a worker, as JSON; a bad file or path, or a read
        past the budget, answers {"error": message}. `name`: the file the request is about."""
        try:
            ok, text = await self.pool.call(method, *args, name=name or ".", seconds=seconds)
        except FormatError as e:
            return self._error(422, str(e))
        except Exception as e:  # no reader process: report it, the server stays up
            self.log.exception("etlab: %s failed", self.request.path)
            return self._error(500, f"{type(e).__name__}: {e}")
        if ok:
            self.set_header("Content-Type", "application/json")
            return self.finish(text)
        reply = json.loads(text)
        if reply["kind"] == "bug":
            self.log.error("etlab: %s failed: %s", self.request.path, reply["message"])
        status = reply.get("status", 400) if reply["kind"] == "path" else 422 if reply["kind"] == "format" else 500
        self._error(status, reply["message"])

    def _error(self, status: int, message: str):
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error": message}))

    def arg(self, name: str, default: str | None = None) -> str | None:
        return self.get_query_argument(name, default)


class ViewHandler(_Base):
    """GET /etlab/api/view/{pte|etdp|etrecord|bpte}?path=...[&program=...&method=...]"""

    @tornado.web.authenticated
    async def get(self, kind: str):
        """Answers one viewer's JSON (pte, etdp, etrecord or bpte) for `path`, built in a worker process; a 400 names
        a missing argument."""
        path = self.arg("path")
        if path is None:
            return self._error(400, "path: missing query argument")
        if kind == "pte":
            await self.run_json("pte", path, path, self.arg("method"))
        elif kind == "etdp":
            await self.run_json("etdp", path, path, self.arg("program") or None, self.arg("method", "forward"),
                                "graphs" if self.arg("part") == "graphs" else "main")
        elif kind == "etrecord":
            await self.run_json("etrecord", path, path, self.arg("method", "forward"))
        elif kind == "bpte":
            await self.run_json("bpte", path, path)
        else:
            self._error(404, f"{kind}: no viewer for this kind")


class StatHandler(_Base):
    """GET /etlab/api/stat?path=...: size and mtime (the viewers poll it to offer a reload); answered by
    the server itself (no file is read)."""

    @tornado.web.authenticated
    def get(self):
        """Answers the file's size and version, or the path error's status and message."""
        try:
            result = self.service.stat(self.arg("path") or "")
        except PathError as e:
            return self._error(e.status, str(e))
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(result))


class VerifyHandler(_Base):
    """POST /etlab/api/verify?path=x.bpte[&rtol=1e-4&atol=1e-6]: runs the bundled test cases with etlab's
    runtime, checked with that tolerance (default etlab.devtools')."""

    @tornado.web.authenticated
    async def post(self):
        """Runs the bundle's test cases in a worker with a time limit above the verifier's own, and answers the
        verdicts."""
        path = self.arg("path", "")
        await self.run_json("verify", path, path, self.arg("rtol"), self.arg("atol"),
                            seconds=max(self.pool.budget.seconds, VERIFY_TIMEOUT_S + 30))


class ArtifactsHandler(_Base):
    """GET /etlab/api/artifacts?folder=...: the artifacts under a folder grouped by program."""

    @tornado.web.authenticated
    async def get(self):
        """Answers the folder's artifacts grouped by program."""
        folder = self.arg("folder", "")
        await self.run_json("artifacts", folder, folder)


class CompareHandler(_Base):
    """GET /etlab/api/compare?a=run1.etdp&b=run2.etdp[&program=model.pte]"""

    @tornado.web.authenticated
    async def get(self):
        """Answers the comparison of runs a and b (with the program when given); a 400 when either run is missing."""
        a, b = self.arg("a"), self.arg("b")
        if not a or not b:
            return self._error(400, "compare: give two runs, a= and b=")
        await self.run_json("compare", a, a, b, self.arg("program") or None)


class ModuleHandler(_Base):
    """GET /etlab/modules/<name>.js|css: the ES view modules of etlab/visualizer/static (graph_view.js,
    table_view.js and the modules they import) and theme.css, their colors; plotly.js: the library the
    notebook's charts load once per page (static/shared_lib.js)."""

    @tornado.web.authenticated
    def get(self, name: str):
        """Serves one view module or stylesheet with a JavaScript/CSS content type (a module script needs it), or a
        404 naming an unknown module."""
        try:
            source = view_module(name)
        except KeyError:
            return self._error(404, f"{name}: no such view module")
        kind = "text/css" if name.endswith(".css") else "text/javascript"  # a module script must say JavaScript
        self.finish(source, set_content_type=f"{kind}; charset=utf-8")  # APIHandler.finish would say JSON


def setup_handlers(web_app, root_dir: str) -> None:
    """Registers the endpoints on the server's web app, serving files under root_dir (read by worker
    processes with the budgets of the server's environment, `_pool.Budget.from_env`)."""
    web_app.settings["etlab_service"] = Service(root_dir)  # stat only: the workers read the files
    pool = web_app.settings["etlab_pool"] = WorkerPool(root_dir, Budget.from_env())
    _pools.append(pool)
    base = url_path_join(web_app.settings["base_url"], "etlab")
    web_app.add_handlers(".*$", [
        (url_path_join(base, "api/view/(pte|etdp|etrecord|bpte)"), ViewHandler),
        (url_path_join(base, "api/stat"), StatHandler),
        (url_path_join(base, "api/verify"), VerifyHandler),
        (url_path_join(base, "api/artifacts"), ArtifactsHandler),
        (url_path_join(base, "api/compare"), CompareHandler),
        (url_path_join(base, r"modules/([a-z_]+\.(?:js|css))"), ModuleHandler),
    ])


def warm_up() -> None:
    """Starts the reader processes and reads the view modules once, so the first file opened paints quickly."""
    for pool in _pools:
        pool.warm()
    threading.Thread(target=view_module, args=("graph_view.js",), daemon=True, name="etlab-warm-up").start()
