"""One JupyterLab server for tests/jupyter (package scope), started as `make lab` starts it, over a temp
folder of artifacts made by etlab's compiler and runtime, and one Chromium page on it (per module)
(Debian's /usr/bin/chromium driven by playwright; playwright never downloads a browser here).

The folder: a delegated MLP (mlp.pte, mlp.etrecord, two runs run.etdp (its intermediates in run.bin) /
run2.etdp, a bundled
program mlp.bpte with one deliberately wrong case), a run of another program (other_run.etdp: the
same MLP, not delegated), and corrupt.pte (an ET12 header over garbage).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from etlab.compiler import to_edge_transform_and_lower
from etlab.compiler.backends import DemoPartitioner
from etlab.devtools import BundledProgram, MethodTestCase, MethodTestSuite, serialize_from_bundled_program_to_flatbuffer
from etlab.jupyter._launch import MakeLab, built_labextension
from etlab.models import make_mlp
from etlab.runtime import Runtime

CHROMIUM = os.environ.get("ETLAB_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--disable-sync"]
REPO = Path(__file__).resolve().parents[2]
VENV_BIN = REPO / ".venv" / "bin"  # the Makefile's venv, where `make lab` runs JupyterLab
ARTIFACTS = REPO / "test-artifacts" / "jupyter"


@dataclass
class LabFiles:
    root: Path
    runs: int


def _compile(model, inputs, partition: bool):
    ep = torch.export.export(model, inputs)
    return to_edge_transform_and_lower(ep, partitioner=[DemoPartitioner()] if partition else None,
                                       generate_etrecord=True).to_executorch()


def _run(pte: Path, etdp: Path, inputs, runs: int, intermediates: bool = False) -> None:
    """Runs `pte` `runs` times into `etdp`; with `intermediates`, also their outputs into <etdp>.bin and its
    allocation events (the dashboard's observed memory)."""
    program = Runtime.get().load_program(pte, enable_etdump=True, debug_buffer_size=1 << 20 if intermediates else None,
                                         trace_allocations=intermediates)
    method = program.load_method("forward")
    for _ in range(runs):
        method.execute(list(inputs))
    program.write_etdump_result_to_file(etdp, etdp.with_suffix(".bin") if intermediates else None)


def make_lab_files(root: Path, runs: int = 3) -> LabFiles:
    model, inputs = make_mlp()
    et = _compile(model, inputs, partition=True)
    et.write_to_file(root / "mlp.pte")
    record = et.get_etrecord()
    record.update_representative_inputs(list(inputs))
    record.save(root / "mlp.etrecord")
    _run(root / "mlp.pte", root / "run.etdp", inputs, runs, intermediates=True)
    _run(root / "mlp.pte", root / "run2.etdp", inputs, runs)
    cases = []
    with torch.no_grad():
        for seed in (0, 1):
            x = torch.randn(inputs[0].shape, generator=torch.Generator().manual_seed(seed))
            cases.append(MethodTestCase([x], model(x)))
        cases.append(MethodTestCase([inputs[0]], model(inputs[0]) + 1.0))  # wrong on purpose
    (root / "mlp.bpte").write_bytes(serialize_from_bundled_program_to_flatbuffer(
        BundledProgram(et, [MethodTestSuite("forward", cases)])))
    other = root / "other"
    other.mkdir()
    _compile(model, inputs, partition=False).write_to_file(other / "plain.pte")
    _run(other / "plain.pte", root / "other_run.etdp", inputs, runs)
    shutil.rmtree(other)
    (root / "corrupt.pte").write_bytes(b"\x00\x00\x00\x00ET12" + b"\xff" * 200)
    return LabFiles(root, runs)


# Package scope: the server lives while tests/jupyter runs, not for the rest of the session.
@pytest.fixture(scope="package")
def lab_files(tmp_path_factory) -> LabFiles:
    return make_lab_files(tmp_path_factory.mktemp("labroot"))


@pytest.fixture(scope="package")
def lab(lab_files, tmp_path_factory):
    try:
        built_labextension()
    except FileNotFoundError as e:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(e))
    if not VENV_BIN.joinpath("python").exists():
        pytest.fail(f"{VENV_BIN}/python is missing: `make setup` creates the venv the Makefile's lab starts")
    with MakeLab(repo=REPO, root=lab_files.root, base=tmp_path_factory.mktemp("labbase"), lifetime_s=900) as server:
        yield server
        assert server.alive(), "the server went down during the tests"


# Module scope: playwright's sync API allows one running instance per process, and another browser
# module (tests/visualizer) may run in this worker after this one.
@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} not installed (apt-get install chromium)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield b
        b.close()


# anywidget's front end logs this when a widget model takes over 2 s to set up (a fixed AbortSignal.timeout(2000)
# in its labextension; the model still initializes and the view renders: the tests assert the views drawn). On a
# busy 2-core CI worker the views notebook's models sometimes take longer; that is the machine, not a failure.
ANYWIDGET_SLOW_START = "[anywidget] Failed to initialize model."


class LabPage:
    """JupyterLab in a page: open files from the file browser, find the active etlab viewer, save
    screenshots; records console errors and uncaught exceptions."""

    def __init__(self, browser, lab):
        self.lab = lab
        self.page = browser.new_page(viewport={"width": 1500, "height": 1000})
        self.errors: list[str] = []
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(
            f"{m.text} ({m.location.get('url', '')})"))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.goto(lab.url("lab?reset"))  # a fresh workspace, not the last session's tabs
        self.page.wait_for_selector(".jp-DirListing-item", timeout=90_000)
        # the user's own Lab settings are read (no overrides): its "Jupyter news?" toast is hidden from the
        # screenshots, not answered (that would write the user's settings)
        self.page.add_style_tag(content=".Toastify__toast-container { display: none !important; }")

    def take_errors(self, expected: str = "") -> list[str]:
        """The console errors so far (cleared), without the HTTP errors the etlab API answered on
        purpose for `expected` (a bad file's 422 is a console line in Chromium, not a bug)."""
        errors, self.errors = self.errors, []
        return [e for e in errors if not (expected and "/etlab/api/" in e and expected in e
                                          and "Failed to load resource" in e)
                and e != ANYWIDGET_SLOW_START]

    def command(self, name: str, args: dict | None = None):
        return self.page.evaluate("([n, a]) => window.jupyterapp.commands.execute(n, a)", [name, args or {}])

    def theme(self, dark: bool) -> None:
        """Switches Lab's theme and waits until the page shows it. The switch is a settings write to the
        server and a stylesheet load; on a busy CI worker either can take long, and a write Lab dropped is
        asked for again once, so a slow machine is waited out and a theme that never comes still fails."""
        name, light = ("JupyterLab Dark", "false") if dark else ("JupyterLab Light", "true")
        shown = f"document.body.dataset.jpThemeLight === '{light}'"
        for attempt in (1, 2):
            self.command("apputils:change-theme", {"theme": name})
            try:
                self.page.wait_for_function(shown, timeout=60_000 * attempt)
                break
            except Exception as e:  # playwright's TimeoutError; playwright is imported only where installed
                if attempt == 2 or type(e).__name__ != "TimeoutError":
                    raise
        self.page.wait_for_timeout(300)  # the theme's colors reach the views' computed styles

    def close_all(self) -> None:
        self.command("application:close-all")
        self.page.wait_for_timeout(200)

    def open(self, name: str, *, state: str = "ready"):
        """Double-clicks a file in the file browser; the viewer's locator once it is `state`."""
        self.close_all()
        self.page.evaluate("window.jupyterapp.shell.activateById('filebrowser')")
        self.page.locator(f".jp-DirListing-item[title^='Name: {name}']").dblclick()
        return self.viewer(state)

    def viewer(self, state: str = "ready"):
        v = self.page.locator(f".jp-MainAreaWidget:not(.lm-mod-hidden) .jp-etlab[data-state={state}]")
        v.wait_for(timeout=60_000)
        return v

    def wait_graph(self, viewer, timeout: int = 60_000):
        viewer.locator("[data-etlab-view=graph][data-state=ready]").first.wait_for(state="attached", timeout=timeout)

    def shot(self, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        self.page.screenshot(path=str(path))
        return path


@pytest.fixture(scope="module")
def lab_page(browser, lab):
    page = LabPage(browser, lab)
    yield page
    page.page.close()
