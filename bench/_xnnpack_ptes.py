"""The kept `.pte` pairs of bench/xnnpack_lowering.py: both sides' programs of each measured model, so
their latency can be timed again later (on a quiet machine) without lowering anything.

One folder per model under the pair store (default ~/.cache/etlab-bench/xnnpack, or ETLAB_BENCH_PTE_DIR):

    <model>/etlab.pte  <model>/upstream.pte  <model>/inputs.pt  <model>/manifest.json

The manifest names the etlab commit that lowered etlab's side, when, which run kept the pair (the bench or
--store-only), and each file's size and SHA-256: a pair is only timed when every file is still the one the
manifest describes, so a half-copied or replaced file is named instead of being timed.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from etlab.schema import write_atomic

FILES = ("etlab.pte", "upstream.pte", "inputs.pt")
MANIFEST = "manifest.json"


def default_dir() -> Path:
    """Where pairs are kept: ETLAB_BENCH_PTE_DIR, else ~/.cache/etlab-bench/xnnpack."""
    env = os.environ.get("ETLAB_BENCH_PTE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "etlab-bench" / "xnnpack"


def _digest(data: bytes) -> dict:
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


@dataclass
class Pair:
    """One kept pair: its folder and manifest (already checked against the files)."""

    model: str
    folder: Path
    commit: str
    date: str
    source: str

    def path(self, name: str) -> Path:
        return self.folder / name


def keep_pair(store: Path, model: str, scratch: Path, commit: str, source: str) -> Pair:
    """Copies scratch/{etlab.pte, upstream.pte, inputs.pt} into store/<model>/ (each file atomically, the
    manifest last, so a stopped copy leaves a pair the manifest does not describe: refused, not timed)."""
    missing = [n for n in FILES if not (scratch / n).is_file()]
    if missing:
        raise FileNotFoundError(f"{scratch}: no {', '.join(missing)} to keep")
    folder = store / model
    files = {}
    for name in FILES:
        data = (scratch / name).read_bytes()
        files[name] = _digest(data)
        write_atomic(folder / name, data)
    date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    manifest = {"model": model, "commit": commit, "date": date, "source": source, "files": files}
    write_atomic(folder / MANIFEST, (json.dumps(manifest, indent=1) + "\n").encode())
    return Pair(model, folder, commit, date, source)


def read_pair(store: Path, model: str, verify: bool = True) -> Pair:
    """The kept pair of `model`; ValueError naming the file and what is wrong when it is not one (no
    manifest, a field missing, a file missing or not the one the manifest describes)."""
    folder = store / model
    mpath = folder / MANIFEST
    if not mpath.is_file():
        raise ValueError(f"{mpath}: no manifest (no pair kept for {model})")
    try:
        m = json.loads(mpath.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{mpath}: not JSON ({e})") from None
    if not isinstance(m, dict) or m.get("model") != model or not isinstance(m.get("files"), dict):
        raise ValueError(f"{mpath}: not a manifest of {model!r}")
    for key in ("commit", "date", "source"):
        if not isinstance(m.get(key), str):
            raise ValueError(f"{mpath}: no {key!r}")
    for name in FILES:
        want, path = m["files"].get(name), folder / name
        if not isinstance(want, dict) or not path.is_file():
            raise ValueError(f"{path}: missing (or not in {mpath})")
        if path.stat().st_size != want.get("bytes"):
            raise ValueError(f"{path}: {path.stat().st_size} bytes, the manifest says {want.get('bytes')}")
        if verify and _digest(path.read_bytes())["sha256"] != want.get("sha256"):
            raise ValueError(f"{path}: SHA-256 differs from the manifest's (replaced or damaged)")
    return Pair(model, folder, m["commit"], m["date"], m["source"])


def kept_models(store: Path) -> list[str]:
    """Names of the folders that have a manifest (not yet verified)."""
    return sorted(p.parent.name for p in store.glob(f"*/{MANIFEST}")) if store.is_dir() else []
