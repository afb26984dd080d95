"""Fixtures for the upstream-interop tests (marker ``interop``).

Upstream ExecuTorch 1.5.1 is an oracle only: it lives in its own virtualenv, created by
``<repo>/../shared/reference/setup.sh``, and is only ever run in subprocesses with that
venv's python.  etlab never imports it.

Fixtures (session scope):

* ``ref_python`` -> ``str``: path of the reference python.  Any failure of setup.sh is a
  test failure (``pytest.fail`` with setup.sh's stderr tail), never a skip.
* ``upstream_artifacts`` -> ``dict[str, Path]``: ``{"mlp": dir, "cnn": dir,
  "transformer": dir}``.  Each dir holds upstream-made

    model.pte, model.etrecord, model.bpte (2 bundled test cases), inputs.pt,
    eager_outputs.pt, upstream_outputs.pt, run.etdp, run.bin (debug buffer; 2 iterations)

  plus upstream's canonical dumps (``ref_tools.py dump``) of them: model.pte.json,
  model.bpte.json, run.etdp.json.  ``dir/"external"`` (mlp only) holds an
  ``external_constants=True`` export: model.pte, ``_default_external_constant.ptd``
  (upstream's file name; use ``external_ptd(dir)``), inputs.pt, eager_outputs.pt,
  upstream_outputs.pt (run with the .ptd), model.pte.json and <ptd>.json.
  ``manifest.json`` sits in the parent directory of the model dirs.

Helper: ``run_ref(ref_python, script, *args, timeout=...)`` runs a script with the
reference python and raises ``RefToolError`` (with stdout/stderr) on failure.

Artifacts are cached in ``~/.cache/etlab/interop/<key>`` (override the root with
ETLAB_INTEROP_CACHE), key = sha256 of zoo.py, et_ref.py, ref_tools.py, setup.sh and the
generation recipe below; built in a temp dir and renamed into place, under a file lock
so that pytest-xdist workers build once.  The 4 most recently used keys are kept.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
REFERENCE_DIR = REPO.parent / "shared" / "reference"
SETUP_SH = REFERENCE_DIR / "setup.sh"
ET_REF = REFERENCE_DIR / "et_ref.py"
REF_TOOLS = HERE / "ref_tools.py"
ZOO = REPO / "etlab" / "models" / "zoo.py"

MODELS = ("mlp", "cnn", "transformer")
EXTERNAL_MODEL = "mlp"
MODEL_FILES = (
    "model.pte",
    "model.etrecord",
    "model.bpte",
    "inputs.pt",
    "eager_outputs.pt",
    "upstream_outputs.pt",
    "run.etdp",
    "run.bin",
    "model.pte.json",
    "model.bpte.json",
    "run.etdp.json",
)
EXTERNAL_FILES = ("model.pte", "inputs.pt", "eager_outputs.pt", "upstream_outputs.pt", "model.pte.json")
MAX_PARALLEL = 2  # CI has 2 cores
ITERS = 2
BUNDLED_CASES = 2
# et_ref's default debug buffer is 64 MiB and the whole buffer is written to run.bin;
# the zoo models use < 1 MiB for 2 iterations.
DEBUG_BUFFER_SIZE = 16 << 20
STEP_TIMEOUT = 600
KEEP_KEYS = 4  # artifact dirs (~50 MB each) kept in the cache root
SETUP_TIMEOUT = 1800
# Bump when the generation steps below change in a way the hashed files don't show.
RECIPE = f"v1 iters={ITERS} bundled={BUNDLED_CASES} dbg={DEBUG_BUFFER_SIZE} models={','.join(MODELS)}"


def cache_root() -> Path:
    env = os.environ.get("ETLAB_INTEROP_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "etlab" / "interop"


# --------------------------------------------------------------------------------------
# pytest hooks / progress
# --------------------------------------------------------------------------------------

_CONFIG: pytest.Config | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _CONFIG
    _CONFIG = config
    config.addinivalue_line(
        "markers",
        "interop: compares with upstream ExecuTorch 1.5.1 run from ../shared/reference",
    )


def _progress(msg: str) -> None:
    """Print to the real stderr even while pytest captures output (main thread only)."""
    line = f"[interop] {msg}"
    capman = _CONFIG.pluginmanager.getplugin("capturemanager") if _CONFIG else None
    ctx = capman.global_and_fixture_disabled() if capman else contextlib.nullcontext()
    with ctx:
        print(line, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------
# Reference python
# --------------------------------------------------------------------------------------


class RefToolError(RuntimeError):
    """A reference-python subprocess failed."""


def _tail(text: str, n: int = 4000) -> str:
    text = text or ""
    return text if len(text) <= n else "...\n" + text[-n:]


def _child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    # The reference venv must not see etlab's import paths.
    for k in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV"):
        env.pop(k, None)
    if extra:
        env.update(extra)
    return env


@functools.cache  # once per process: setup.sh imports upstream's runtime and devtools (~7 s of CPU) to check the venv
def setup_reference() -> str:
    """Run setup.sh; return the reference python.  Raises RuntimeError on any failure (not cached: a later call
    tries again)."""
    if not SETUP_SH.is_file():
        raise RuntimeError(f"reference setup script not found: {SETUP_SH}")
    try:
        p = subprocess.run(
            ["bash", str(SETUP_SH)],
            capture_output=True,
            text=True,
            timeout=SETUP_TIMEOUT,
            env=_child_env(),
        )
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        raise RuntimeError(f"{SETUP_SH} timed out after {SETUP_TIMEOUT}s\n--- stderr tail ---\n{_tail(err)}") from e
    except OSError as e:
        raise RuntimeError(f"could not run {SETUP_SH}: {e}") from e
    lines = [ln.strip() for ln in (p.stdout or "").splitlines() if ln.strip()]
    py = lines[-1] if lines else ""
    if p.returncode != 0 or not py or not os.access(py, os.X_OK):
        raise RuntimeError(
            f"{SETUP_SH} failed (exit {p.returncode}, printed python {py!r})\n"
            f"--- stdout tail ---\n{_tail(p.stdout)}\n--- stderr tail ---\n{_tail(p.stderr)}"
        )
    return py


@pytest.fixture(scope="session")
def ref_python() -> str:
    try:
        return setup_reference()
    except Exception as e:
        pytest.fail(f"upstream ExecuTorch reference environment unavailable:\n{e}", pytrace=False)


def run_ref(
    ref_python: str,
    *args: str | os.PathLike[str],
    timeout: float = STEP_TIMEOUT,
    cwd: str | os.PathLike[str] | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``ref_python *args`` (typically a script path then its arguments).

    Returns the CompletedProcess (text).  Raises RefToolError with the command, exit
    code and stdout/stderr tails on a non-zero exit or a timeout.
    """
    cmd = [str(ref_python), *map(str, args)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=_child_env(env))
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        raise RefToolError(
            f"timed out after {timeout}s: {' '.join(cmd)}\n--- stdout ---\n{_tail(out)}\n--- stderr ---\n{_tail(err)}"
        ) from e
    if p.returncode != 0:
        raise RefToolError(
            f"exit {p.returncode}: {' '.join(cmd)}\n"
            f"--- stdout ---\n{_tail(p.stdout)}\n--- stderr ---\n{_tail(p.stderr)}"
        )
    return p


# --------------------------------------------------------------------------------------
# Artifact generation
# --------------------------------------------------------------------------------------


def cache_key(paths: Sequence[Path] = (ZOO, ET_REF, REF_TOOLS, SETUP_SH), recipe: str = RECIPE) -> str:
    h = hashlib.sha256()
    h.update(recipe.encode())
    for p in paths:
        data = Path(p).read_bytes()
        h.update(f"\0{Path(p).name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def cached_build(kind: str, key: str, build: Callable[[Path], object]) -> Path:
    """cache_root()/kind/key, made once by `build(tmp_dir)` under a file lock (xdist workers build once)
    and renamed into place when complete; older keys of `kind` (zoo or script edits) are dropped."""
    root = cache_root() / kind
    root.mkdir(parents=True, exist_ok=True)
    final = root / key
    if (final / "done").is_file():
        return final
    with open(root / f".{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / "done").is_file():
            return final
        shutil.rmtree(final, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
        try:
            build(tmp)
            (tmp / "done").write_text(key)
            tmp.rename(final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    for old in root.iterdir():
        if old.is_dir() and old.name != key and not old.name.startswith(".tmp-"):
            shutil.rmtree(old, ignore_errors=True)
            with contextlib.suppress(OSError):
                (root / f".{old.name}.lock").unlink()
    return final


def external_ptd(model_dir: Path) -> Path:
    """The single .ptd file of ``model_dir/"external"``."""
    ptds = sorted((Path(model_dir) / "external").glob("*.ptd"))
    if len(ptds) != 1:
        raise FileNotFoundError(f"expected exactly one .ptd in {model_dir}/external, found {ptds}")
    return ptds[0]


@dataclass
class _Chain:
    """Steps run one after another; each step returns argv (built lazily)."""

    name: str
    steps: list[tuple[str, Callable[[], list[str]]]]
    index: int = 0


def _run_chains(ref_python: str, chains: list[_Chain], logdir: Path, parallel: int) -> dict[str, float]:
    """Run chains with at most ``parallel`` subprocesses alive; steps in a chain are serial."""
    env = _child_env({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    pending = list(chains)
    running: list[tuple[_Chain, str, subprocess.Popen, float, Path, Path, list[str]]] = []
    timings: dict[str, float] = {}

    def start(chain: _Chain) -> None:
        label, argv_fn = chain.steps[chain.index]
        argv = [ref_python, *map(str, argv_fn())]
        out = logdir / f"{label}.stdout"
        err = logdir / f"{label}.stderr"
        with open(out, "w") as fo, open(err, "w") as fe:
            proc = subprocess.Popen(argv, stdout=fo, stderr=fe, env=env, stdin=subprocess.DEVNULL)
        running.append((chain, label, proc, time.perf_counter(), out, err, argv))

    try:
        while pending or running:
            while pending and len(running) < parallel:
                start(pending.pop(0))
            time.sleep(0.05)
            for item in list(running):
                chain, label, proc, t0, out, err, argv = item
                rc = proc.poll()
                elapsed = time.perf_counter() - t0
                if rc is None:
                    if elapsed > STEP_TIMEOUT:
                        proc.kill()
                        proc.wait()
                        raise RefToolError(
                            f"{label} timed out after {STEP_TIMEOUT}s: {' '.join(argv)}\n"
                            f"--- stderr ---\n{_tail(err.read_text(errors='replace'))}"
                        )
                    continue
                running.remove(item)
                if rc != 0:
                    raise RefToolError(
                        f"{label} failed (exit {rc}): {' '.join(argv)}\n"
                        f"--- stdout ---\n{_tail(out.read_text(errors='replace'))}\n"
                        f"--- stderr ---\n{_tail(err.read_text(errors='replace'))}"
                    )
                timings[label] = round(elapsed, 2)
                _progress(f"{label} done in {elapsed:.1f}s")
                chain.index += 1
                if chain.index < len(chain.steps):
                    start(chain)  # keep the slot: continue this chain now
    finally:
        for _, _, proc, *_ in running:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return timings


def _build(ref_python: str, out: Path) -> dict:
    zoo = str(ZOO)
    dirs = {m: out / m for m in MODELS}
    for d in dirs.values():
        d.mkdir(parents=True)
    ext = dirs[EXTERNAL_MODEL] / "external"
    logdir = out / "logs"
    logdir.mkdir()

    def model_chain(m: str) -> _Chain:
        d = dirs[m]
        return _Chain(
            m,
            [
                (
                    f"export-{m}",
                    lambda: [ET_REF, "export", f"{zoo}:make_{m}", "--out", d, "--bundled", str(BUNDLED_CASES)],
                ),
                (
                    f"run-{m}",
                    lambda: [
                        ET_REF, "run", d / "model.pte",
                        "--inputs", d / "inputs.pt", "--outputs", d / "upstream_outputs.pt",
                        "--etdump", d / "run.etdp", "--debug-buffer", d / "run.bin",
                        "--debug-buffer-size", str(DEBUG_BUFFER_SIZE), "--iters", str(ITERS),
                    ],
                ),
            ],
        )  # fmt: skip

    external = _Chain(
        "external",
        [
            (
                f"export-external-{EXTERNAL_MODEL}",
                lambda: [REF_TOOLS, "export-external", f"{zoo}:make_{EXTERNAL_MODEL}", "--out", ext],
            ),
            (
                f"run-with-data-{EXTERNAL_MODEL}",
                lambda: [
                    REF_TOOLS, "run-with-data", ext / "model.pte", external_ptd(dirs[EXTERNAL_MODEL]),
                    "--inputs", ext / "inputs.pt", "--outputs", ext / "upstream_outputs.pt",
                ],
            ),
        ],
    )  # fmt: skip

    def dump_all() -> list[str]:
        argv: list[str] = [REF_TOOLS, "dump-many"]
        for m in MODELS:
            d = dirs[m]
            for kind, name in (("pte", "model.pte"), ("bpte", "model.bpte"), ("etdp", "run.etdp")):
                argv += [kind, d / name, d / f"{name}.json"]
        ptd = external_ptd(dirs[EXTERNAL_MODEL])
        argv += ["pte", ext / "model.pte", ext / "model.pte.json", "ptd", ptd, ptd.with_name(ptd.name + ".json")]
        return argv

    # Longest chains first so the two slots finish together.
    order = ["transformer", "cnn", "mlp"]
    chains = [model_chain(m) for m in order if m in MODELS] + [model_chain(m) for m in MODELS if m not in order]
    chains.append(external)
    timings = _run_chains(ref_python, chains, logdir, MAX_PARALLEL)
    timings.update(_run_chains(ref_python, [_Chain("dumps", [("dump-upstream", dump_all)])], logdir, 1))

    missing = [
        str(p)
        for m in MODELS
        for p in [dirs[m] / f for f in MODEL_FILES] + ([ext / f for f in EXTERNAL_FILES] if m == EXTERNAL_MODEL else [])
        if not p.is_file() or p.stat().st_size == 0
    ]
    if missing:
        raise RefToolError(f"upstream generation left files missing/empty: {missing}")
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and "logs" not in p.parts)
    return {"files": files, "timings_s": timings, "ptd": external_ptd(dirs[EXTERNAL_MODEL]).name}


def _complete(d: Path) -> bool:
    try:
        manifest = json.loads((d / "manifest.json").read_text())
        return all((d / f).is_file() for f in manifest["files"])
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _prune_stale_tmp(root: Path, max_age_s: float = 3600) -> None:
    now = time.time()
    for p in root.glob(".tmp-*"):
        with contextlib.suppress(OSError):
            if now - p.stat().st_mtime > max_age_s:
                shutil.rmtree(p, ignore_errors=True)


def _prune_old_keys(root: Path, keep: int) -> None:
    """Drop all but the ``keep`` most recently used artifact dirs (zoo.py edits add keys)."""
    dirs = [p for p in root.iterdir() if p.is_dir() and len(p.name) == 64 and (p / "manifest.json").exists()]
    dirs.sort(key=lambda p: (p / "manifest.json").stat().st_mtime, reverse=True)
    for p in dirs[keep:]:
        shutil.rmtree(p, ignore_errors=True)
        with contextlib.suppress(OSError):
            (root / f".{p.name}.lock").unlink()


def _touch(final: Path) -> Path:
    with contextlib.suppress(OSError):
        os.utime(final / "manifest.json")  # recency for _prune_old_keys
    return final


def ensure_upstream_artifacts(ref_python: str) -> Path:
    """Return the cache directory for the current key, generating it if needed."""
    for p in (ZOO, ET_REF, REF_TOOLS):
        if not p.is_file():
            raise RuntimeError(f"interop artifacts need {p}, which does not exist")
    key = cache_key()
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    final = root / key
    if _complete(final):
        return _touch(final)
    with open(root / f".{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # xdist workers: one builds, the rest wait
        if _complete(final):
            return _touch(final)
        _prune_stale_tmp(root)
        if final.exists():
            shutil.rmtree(final)  # incomplete leftovers
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key[:12]}-", dir=root))
        try:
            t0 = time.perf_counter()
            _progress(f"generating upstream artifacts into {final} (cold cache; ~1 min on 2 cores)")
            info = _build(ref_python, tmp)
            total = time.perf_counter() - t0
            manifest = {"key": key, "recipe": RECIPE, "ref_python": ref_python, "total_s": round(total, 2), **info}
            (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
            os.rename(tmp, final)
            _progress(f"upstream artifacts ready in {total:.1f}s")
            _prune_old_keys(root, KEEP_KEYS)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


@pytest.fixture(scope="session")
def upstream_artifacts(ref_python: str) -> dict[str, Path]:
    try:
        root = ensure_upstream_artifacts(ref_python)
    except Exception as e:
        pytest.fail(f"could not generate upstream interop artifacts:\n{e}", pytrace=False)
    return {m: root / m for m in MODELS}
