"""The JupyterLab extension's server side (the h5web pattern): a jupyter_server extension that reads
.pte, .etdp, .etrecord and .bpte files under the server's root with etlab's readers and answers
JSON; the browser never parses the files, and no kernel is started.

Installed with etlab: the prebuilt lab extension lands in share/jupyter/labextensions/etlab-labextension
and `etc/jupyter/jupyter_server_config.d/etlab.json` enables this server extension. Endpoints
(token-authenticated, paths relative to the root, anything outside it refused):

- GET  /etlab/api/view/pte|etdp|etrecord|bpte?path=P[&program=Q][&method=M]  what each viewer draws
- GET  /etlab/api/artifacts?folder=F      artifacts under F grouped by program hash
- GET  /etlab/api/compare?a=R1&b=R2[&program=P]   per-op p50 of two runs, ratio on the graph
- POST /etlab/api/verify?path=B.bpte      bundled test cases run by etlab's runtime (child process)
- GET  /etlab/api/stat?path=P             size / mtime (reload offers)
- GET  /etlab/modules/<name>.js, theme.css   the ES view modules of etlab.visualizer (as files)
"""

from __future__ import annotations

from etlab.jupyter._launch import free_port as free_port  # a port on 127.0.0.1 (also for other local servers)


def instruction_graph(plan):
    """A .pte method's instruction graph (an `etlab.visualizer.GraphModel`: instructions as nodes, values
    as edges with their planned shapes), as the .pte viewer draws it; for other front ends."""
    from etlab.jupyter._program import instruction_graph as build

    return build(plan)


def _jupyter_server_extension_points() -> list[dict]:
    return [{"module": "etlab.jupyter"}]


def _jupyter_labextension_paths() -> list[dict]:
    return [{"src": "labextension", "dest": "etlab-labextension"}]


def _load_jupyter_server_extension(server_app) -> None:
    """Adds the endpoints to the running server; the readers are imported in the background."""
    from etlab.jupyter._handlers import setup_handlers, warm_up

    setup_handlers(server_app.web_app, server_app.root_dir)
    warm_up()
    server_app.log.info("etlab: JupyterLab viewers for .pte/.etdp/.etrecord/.bpte under %s", server_app.root_dir)


load_jupyter_server_extension = _load_jupyter_server_extension
