"""A synthetic device fleet: real .etdp files (etlab's ETDump writer) with known ground truth.

Every device runs every build of one method. An op's duration on a run is

    base(op) * device speed * thermal(run) * noise * [regression factor] * [outlier factor]

- device speed: per device class (flagship, mid, low) times a per-device spread;
- thermal drift: runs get slower as the device heats up, saturating (1 + drift * (1 - e^(-k/tau)))
  over the runs of a session, the same in every build;
- noise: log-normal per op and run;
- outlier runs: a few runs interrupted by the OS, every op of the run slower;
- the planted regression: one op slower by a factor in one build, on every device.

Each file is written with a sidecar JSON (`<name>.etdp.json`) holding its tags, under
`<build>/<device_class>/<device>/session-<k>.etdp`, so the tree also works with the path
pattern `{build}/{device_class}/{device}/*.etdp`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from etlab.schema import etdump as E
from etlab.schema import serialize_etdump, write_atomic

# (op, base duration in ns): a small CNN-like method.
DEFAULT_OPS = (("convolution.out", 42_000), ("relu.out", 6_000), ("convolution.out", 55_000), ("relu.out", 6_500),
               ("max_pool2d_with_indices.out", 9_000), ("permute_copy.out", 4_000), ("addmm.out", 30_000),
               ("add.out", 3_000), ("_softmax.out", 5_000))
DEVICE_CLASSES = (("flagship", 1.0), ("mid", 1.7), ("low", 2.9))
PATH_PATTERN = "{build}/{device_class}/{device}/*.etdp"


@dataclass(frozen=True)
class Regression:
    """The planted change: `op` is `factor` times slower in `build`."""

    build: str = "B"
    op: str = "convolution.out"
    factor: float = 1.25


@dataclass(frozen=True)
class FleetSpec:
    """Everything that decides the fleet's files (same spec + seed -> same bytes)."""

    devices_per_class: int = 2
    builds: tuple[str, ...] = ("A", "B")
    sessions: int = 2                     # files per device and build
    runs: int = 8                         # Execute blocks per file
    ops: tuple[tuple[str, int], ...] = DEFAULT_OPS
    delegate_ops: int = 2                 # backend events inside one DELEGATE_CALL per run (0: no delegate)
    noise_sigma: float = 0.04
    thermal_drift: float = 0.15
    thermal_tau: float = 6.0
    outlier_rate: float = 0.01
    outlier_factor: float = 3.0
    regression: Regression | None = field(default_factory=Regression)
    method: str = "forward"
    seed: int = 0

    @property
    def program(self) -> str:
        """A stand-in .pte hash: the SHA-256 of the method's description."""
        return hashlib.sha256(json.dumps([self.method, self.ops, self.delegate_ops]).encode()).hexdigest()


@dataclass(frozen=True)
class Device:
    """A simulated device: its name, class, and the factor its latencies are multiplied by (its class's, with a
    per-device spread)."""

    name: str
    device_class: str
    speed: float


def fleet_devices(spec: FleetSpec) -> list[Device]:
    """The devices: `devices_per_class` per class, each with its own spread around the class speed."""
    rng = np.random.default_rng(spec.seed)
    return [Device(f"{cls}-{i:02d}", cls, float(speed * rng.uniform(0.9, 1.1)))
            for cls, speed in DEVICE_CLASSES for i in range(spec.devices_per_class)]


def _profile(name, chain, instr, start, end, did=-1, dids=None) -> E.Event:
    return E.Event(profile_event=E.ProfileEvent(
        name=name, chain_index=chain, instruction_id=instr, delegate_debug_id_int=did, delegate_debug_id_str=dids,
        delegate_debug_metadata=None, start_time=int(start), end_time=int(end)))


def session_durations(spec: FleetSpec, device: Device, build: str, session: int) -> tuple[np.ndarray, np.ndarray]:
    """(runs x ops durations in ns, which runs are outliers) of one file; deterministic per seed."""
    key = f"{spec.seed}/{device.name}/{build}/{session}".encode()
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(key).digest()[:8], "little"))
    base = np.array([d for _, d in spec.ops] + [20_000] * spec.delegate_ops, dtype=np.float64)
    k = np.arange(spec.runs, dtype=np.float64)[:, None]
    thermal = 1.0 + spec.thermal_drift * (1.0 - np.exp(-(k + session * spec.runs / 2) / spec.thermal_tau))
    noise = rng.lognormal(0.0, spec.noise_sigma, size=(spec.runs, len(base)))
    outliers = rng.random(spec.runs) < spec.outlier_rate
    dur = base * device.speed * thermal * noise * np.where(outliers, spec.outlier_factor, 1.0)[:, None]
    reg = spec.regression
    if reg is not None and build == reg.build:
        hit = [i for i, (op, _) in enumerate(spec.ops) if op == reg.op]
        dur[:, hit] *= reg.factor
    return np.maximum(dur, 1).astype(np.int64), outliers


def session_etdump(spec: FleetSpec, device: Device, build: str, session: int) -> E.ETDump:
    """One file's ETDump: a load block, then per run the kernels (each inside an OPERATOR_CALL), a
    DELEGATE_CALL with backend events, and Method::execute, the way etlab's runtime writes them."""
    dur, _ = session_durations(spec, device, build, session)
    n_ops = len(spec.ops)
    blocks = [E.RunData(name="Default", events=[_profile(E.LOAD_METHOD, -1, 0, 1_000, 90_000),
                                                _profile(E.METHOD_INIT, -1, 0, 2_000, 50_000)])]
    t = 1_000_000
    for r in range(spec.runs):
        events, run_start = [], t
        for i, (op, _) in enumerate(spec.ops):
            d = int(dur[r, i])
            events.append(_profile(E.kernel_event_name(op), 0, i, t + 200, t + 200 + d))
            events.append(_profile(E.OPERATOR_CALL, 0, i, t, t + d + 400))
            t += d + 600
        if spec.delegate_ops:
            call_start = t
            for j in range(spec.delegate_ops):
                d = int(dur[r, n_ops + j])
                events.append(_profile(f"backend_op_{j}", 0, n_ops, t + 100, t + 100 + d, did=j))
                t += d + 150
            events.append(_profile(E.DELEGATE_CALL, 0, n_ops, call_start, t + 100))
            t += 300
        events.append(_profile(E.METHOD_EXECUTE, -1, 0, run_start, t))
        blocks.append(E.RunData(name="Execute", events=events))
        t += 5_000_000
    return E.ETDump(version=0, run_data=blocks)


def _write_one(out: str, spec: FleetSpec, device: Device, build: str, session: int) -> str:
    path = Path(out) / build / device.device_class / device.name / f"session-{session:03d}.etdp"
    write_atomic(path, serialize_etdump(session_etdump(spec, device, build, session)))
    tags = {"program": spec.program, "method": spec.method, "device": device.name,
            "device_class": device.device_class, "build": build, "labels": {"session": str(session)}}
    write_atomic(path.with_name(path.name + ".json"), json.dumps(tags).encode())
    return str(path)


def _write_many(args: tuple) -> list[str]:
    out, spec, jobs = args
    return [_write_one(out, spec, dev, build, s) for dev, build, s in jobs]


@dataclass
class SyntheticFleet:
    """What was written, and the truth a diff and an outlier query should find."""

    root: str
    spec: FleetSpec
    files: list[str]
    devices: list[Device]
    outlier_runs: list[tuple[str, int]]   # (file, run block index) of every planted outlier run

    def truth(self) -> dict:
        """What was planted (the regression, the outlier runs' count, the files), for checking a query's answer."""
        return {"regression": None if self.spec.regression is None else asdict(self.spec.regression),
                "outlier_runs": len(self.outlier_runs), "files": len(self.files)}


def generate_fleet(out, spec: FleetSpec | None = None, *, workers: int = 1) -> SyntheticFleet:
    """Writes the fleet under `out` (one .etdp + sidecar per device, build and session)."""
    spec = spec or FleetSpec()
    devices = fleet_devices(spec)
    jobs = [(d, b, s) for b in spec.builds for d in devices for s in range(spec.sessions)]
    if workers <= 1:
        files = _write_many((str(out), spec, jobs))
    else:
        size = math.ceil(len(jobs) / (workers * 8))
        parts = [(str(out), spec, jobs[i : i + size]) for i in range(0, len(jobs), size)]
        with ProcessPoolExecutor(max_workers=workers) as pool:
            files = [f for chunk in pool.map(_write_many, parts) for f in chunk]
    outliers = []
    for (dev, build, s), path in zip(jobs, files):
        _, out_runs = session_durations(spec, dev, build, s)
        outliers += [(path, int(r) + 1) for r in np.flatnonzero(out_runs)]  # +1: block 0 is the load
    return SyntheticFleet(root=os.fspath(out), spec=spec, files=files, devices=devices, outlier_runs=outliers)
