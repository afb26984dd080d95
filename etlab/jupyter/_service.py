"""The server extension's work, one method per endpoint: read the files under the root with etlab's
public readers and return JSON-ready data for the viewers. Blocking; the handlers run it in a
worker process with a time and memory budget (`_pool`). A file that cannot be read raises
FormatError / PathError with a message naming the file by its path relative to the root (never the
server's absolute path)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Literal, cast, overload

from etlab.errors import FormatError
from etlab.inspector import run_mismatch
from etlab.jupyter._contract import (
    ArtifactFile,
    Artifacts,
    BpteView,
    CompareView,
    Delegation,
    EtdpGraphs,
    EtdpView,
    EtrecordView,
    PteView,
    Stat,
    VerifyReport,
)
from etlab.jupyter._delegation import delegation_view
from etlab.jupyter._program import memory_plan_view, pte_view, signature, signature_hash
from etlab.jupyter._records import bpte_view, etrecord_view, record_signature
from etlab.jupyter._runs import compare_view, etdp_graphs, etdp_view
from etlab.jupyter._store import (
    Artifact,
    Cache,
    PathError,
    artifact_kind,
    clean_json,
    confine,
    debug_buffer_beside,
    describe_error,
    file_version,
    find_artifacts,
)
from etlab.jupyter._verify import tolerance_arg

if TYPE_CHECKING:
    from etlab.etdump import ETDumpColumns
    from etlab.etrecord import ETRecord
    from etlab.schema.bundled_program import BundledProgram
    from etlab.schema.program import PteFile

VERIFY_TIMEOUT_S = 120


class Service:
    """Reads artifacts under `root` (cached per file version) and builds the viewers' data."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(os.path.realpath(root))
        self.cache = Cache(64)

    # -- reading, named relative to the root ------------------------------------------------------------

    def rel(self, path: Path) -> str:
        """A path under the root as the viewers name it (relative, with forward slashes)."""
        return path.relative_to(self.root).as_posix()

    def _named(self, path: Path, fn):
        """Runs fn(); its error messages name the file relative to the root."""
        try:
            return fn()
        except FormatError as e:
            raise FormatError(str(e).replace(str(path), self.rel(path))) from None
        except (ValueError, KeyError, IndexError, TypeError, OSError) as e:
            if isinstance(e, PathError):
                raise
            raise FormatError(f"{self.rel(path)}: {type(e).__name__}: {e}".replace(str(path), self.rel(path))) from None

    @overload
    def _load(self, path: Path, what: Literal["pte"]) -> PteFile: ...
    @overload
    def _load(self, path: Path, what: Literal["etdp"]) -> ETDumpColumns: ...
    @overload
    def _load(self, path: Path, what: Literal["bpte"]) -> BundledProgram: ...
    @overload
    def _load(self, path: Path, what: Literal["etrecord"]) -> ETRecord: ...

    def _load(self, path: Path, what: str):
        """The parsed file (pte / etdump / bundled program / ETRecord), cached by version."""
        key = ("load", what, str(path), file_version(path))

        def compute():
            from etlab.schema import load_file

            if what == "etrecord":
                from etlab.etrecord import parse_etrecord

                return parse_etrecord(str(path))
            if what == "etdp":
                from etlab.etdump import read_etdump

                return read_etdump(str(path), what=self.rel(path))
            return load_file(str(path), what=self.rel(path))

        obj = self.cache.get(key, lambda: self._named(path, compute))
        want = {"pte": "PteFile", "etdp": "ETDumpColumns", "bpte": "BundledProgram", "etrecord": "ETRecord"}[what]
        if type(obj).__name__ != want:
            raise FormatError(f"{self.rel(path)}: is a {type(obj).__name__}, not the {want} its name (.{what}) says")
        return obj

    def program_signature(self, path: Path) -> dict:
        """The signature of a .pte, .etrecord or .bpte (see _program.signature)."""
        kind = artifact_kind(path)
        if kind == "pte":
            return signature(self._load(path, "pte"))
        if kind == "etrecord":
            return self._named(path, lambda: record_signature(self._load(path, "etrecord")))
        if kind == "bpte":
            from etlab.schema import deserialize_pte

            bundled = self._load(path, "bpte")
            return signature(self._named(path, lambda: deserialize_pte(bytes(bundled.program or b""),
                                                                       what=self.rel(path))))
        raise PathError(f"{self.rel(path)}: not a program (.pte, .etrecord or .bpte)")

    # -- endpoints ----------------------------------------------------------------------------------------

    def stat(self, rel: str) -> Stat:
        """The file's size and version (mtime in ns as text), confined to the root: what the viewers poll to offer a
        reload."""
        path = confine(self.root, rel)
        size, mtime = file_version(path)
        return {"path": self.rel(path), "size": size, "mtime_ns": str(mtime)}

    def pte(self, rel: str, method: str | None = None) -> PteView:
        """The .pte viewer's data for one method, with the delegation facts of an ETRecord of the same program beside
        it (a .pte holds no graph)."""
        path = confine(self.root, rel, kinds=("pte",))
        view = self._versioned(path, ("pte", method),
                               lambda: self._named(path, lambda: pte_view(self._load(path, "pte"), method=method)))
        record = self._same_program_beside(path, "*.etrecord")  # a .pte has no graph: its ETRecord explains it
        return cast(PteView, {**view, "delegation": self._delegation(record, view.get("method")) if record else None})

    def etrecord(self, rel: str, method: str = "forward") -> EtrecordView:
        """The ETRecord viewer's data for one method (graphs, module tree, delegates), with its delegation facts."""
        path = confine(self.root, rel, kinds=("etrecord",))
        view = self._versioned(path, ("etrecord", method), lambda: self._named(
            path, lambda: etrecord_view(self._load(path, "etrecord"), method=method)))
        return cast(EtrecordView, {**view, "delegation": self._delegation(path, view.get("method"))})

    def _delegation(self, record: Path, method: str | None) -> Delegation | None:
        """What each backend took and why nodes were left out (`_delegation.delegation_view`), cached by
        the ETRecord's version; `source` names the ETRecord."""
        key = ("delegation", str(record), file_version(record), method)
        view: dict | None = self.cache.get(key, lambda: clean_json(self._named(
            record, lambda: delegation_view(self._load(record, "etrecord"), method))))
        return cast(Delegation, {**view, "source": self.rel(record)}) if view else None

    def bpte(self, rel: str) -> BpteView:
        """The bundled-program viewer's data: each method's test cases (inputs and expected outputs summarized),
        cached by the file's version."""
        path = confine(self.root, rel, kinds=("bpte",))
        return cast(BpteView, self._versioned(path, ("bpte",), lambda: self._named(
            path, lambda: bpte_view(self._load(path, "bpte"), name=self.rel(path)))))

    def verify(self, rel: str, rtol: str | None = None, atol: str | None = None) -> VerifyReport:
        """Runs the bundled test cases in a child process (time-limited) and returns its report; rtol /
        atol (text, as the request gave them; default etlab.devtools') are the tolerance it checks with."""
        path = confine(self.root, rel, kinds=("bpte",))
        try:
            tolerance = [(f"--{k}", str(tolerance_arg(k, v))) for k, v in (("rtol", rtol), ("atol", atol))
                         if tolerance_arg(k, v) is not None]
        except ValueError as e:
            raise PathError(str(e)) from None
        self._load(path, "bpte")  # a corrupt file fails here, with the reader's message
        env = dict(os.environ)
        try:
            p = subprocess.run([sys.executable, "-m", "etlab.jupyter._verify", str(path), self.rel(path),
                                *(x for pair in tolerance for x in pair)],
                               capture_output=True, text=True, timeout=VERIFY_TIMEOUT_S, env=env, cwd=self.root)
        except subprocess.TimeoutExpired:
            raise FormatError(f"{self.rel(path)}: verification did not finish in {VERIFY_TIMEOUT_S} s") from None
        if p.returncode != 0 or not p.stdout.strip():
            tail = (p.stderr or "").strip().splitlines()[-1:] or [f"exit code {p.returncode}"]
            raise FormatError(f"{self.rel(path)}: verification failed: {tail[0]}".replace(str(path), self.rel(path)))
        try:
            report = json.loads(p.stdout)
        except ValueError:
            raise FormatError(f"{self.rel(path)}: verification printed no report") from None
        if "error" in report:
            raise FormatError(report["error"])
        return cast(VerifyReport, report)

    def etdp(self, rel: str, program: str | None = None, method: str = "forward",
             part: str = "main") -> EtdpView | EtdpGraphs:
        """The run, joined with `program` (.etrecord or .pte) or with the first matching one beside it.
        part="graphs": only the ETRecord's graphs with the run's timings (the slow half, asked for second)."""
        path = confine(self.root, rel, kinds=("etdp",))
        etdump = self._load(path, "etdp")
        mismatch, candidates = None, []
        if program:
            chosen = confine(self.root, program, kinds=("etrecord", "pte"))
            mismatch = self._mismatch(path, etdump, chosen)
            pair = None if mismatch else chosen
        else:
            pair = None
            for cand in self._programs_beside(path):
                candidates.append(self.rel(cand))
                try:
                    if self._mismatch(path, etdump, cand) is None:
                        pair = cand
                        break
                except FormatError:
                    continue
        key = (part, self.rel(pair) if pair else None, file_version(pair) if pair else None, method)
        if part == "graphs":
            if pair is None or artifact_kind(pair) != "etrecord":
                return {"graphs": [], "program": self.rel(pair) if pair else None}
            return cast(EtdpGraphs, {**self._versioned(path, key, lambda: self._named(
                path, lambda: {"graphs": etdp_graphs(self._inspector(path, pair), self._load(pair, "etrecord"),
                                                     method=method)})), "program": self.rel(pair)})
        view = dict(self._versioned(path, key, lambda: self._named(path, lambda: self._etdp_view(path, etdump,
                                                                                                pair, method))))
        view.update(program=self.rel(pair) if pair else None, mismatch=mismatch, candidates=candidates,
                    programs=[self.rel(p) for p in self._programs_beside(path)])
        return cast(EtdpView, view)

    def _inspector(self, path: Path, pair: Path | None):
        """The Inspector of a run (with the ETRecord when paired with one), cached by both files' versions."""
        from etlab.inspector import Inspector

        record = self._load(pair, "etrecord") if pair is not None and artifact_kind(pair) == "etrecord" else None
        buffer = debug_buffer_beside(self.root, path)  # the run's intermediates: the numeric-gap overlay
        key = ("inspector", str(path), file_version(path), str(pair) if record is not None else None,
               file_version(pair) if pair is not None and record is not None else None,
               buffer and file_version(buffer))

        def make():
            if buffer is not None:
                try:
                    return Inspector(etdump_path=str(path), etrecord=record, debug_buffer_path=str(buffer))
                except FormatError:  # another run's buffer (the Inspector checks the pair): no gaps
                    pass
            return Inspector(etdump_path=str(path), etrecord=record)

        return self.cache.get(key, make)

    def _etdp_view(self, path: Path, etdump, pair: Path | None, method: str) -> dict:
        kind = artifact_kind(pair) if pair else None
        pte = self._load(pair, "pte") if pair is not None and kind == "pte" else None
        view = etdp_view(etdump, self._inspector(path, pair), program_kind=kind, pte=pte, method=method)
        planned = pair if kind == "pte" else self._pte_of(pair) if pair is not None and kind == "etrecord" else None
        if planned is not None:
            view.update(memory_plan_view(self._load(planned, "pte"), method), memory_source=self.rel(planned))
        return view

    def _pte_of(self, record: Path) -> Path | None:
        """The .pte beside an ETRecord that is of the same program (its memory plan joins the dashboard)."""
        return self._same_program_beside(record, "*.pte")

    def _same_program_beside(self, path: Path, pattern: str) -> Path | None:
        """The first file matching `pattern` in path's folder that is of the same program as `path`."""
        want = signature_hash(self.program_signature(path))
        for cand in sorted(path.parent.glob(pattern)):
            try:
                if signature_hash(self.program_signature(cand)) == want:
                    return cand
            except (FormatError, PathError, OSError):
                continue
        return None

    def _mismatch(self, run: Path, etdump, program: Path) -> str | None:
        kind = artifact_kind(program)
        pte = self._load(program, "pte") if kind == "pte" else None
        info = self._load(program, "etrecord").program_info() if kind == "etrecord" else None
        return run_mismatch(etdump, self.program_signature(program), run_name=self.rel(run),
                            program_name=self.rel(program), pte=pte, program=info)

    def _programs_beside(self, run: Path) -> list[Path]:
        """.etrecord files first (they carry the graphs), then .pte files, in the run's folder."""
        files = sorted(p for p in run.parent.iterdir() if p.is_file())
        return [p for p in files if artifact_kind(p) == "etrecord"] + [p for p in files if artifact_kind(p) == "pte"]

    def compare(self, a: str, b: str, program: str | None = None) -> CompareView:
        """Per-op p50 of run `b` against run `a` (same program), with the ratio drawn on the program's graph."""
        from etlab.inspector import Inspector

        pa, pb = confine(self.root, a, kinds=("etdp",)), confine(self.root, b, kinds=("etdp",))
        ea, eb = self._load(pa, "etdp"), self._load(pb, "etdp")
        pte = None
        prog = confine(self.root, program, kinds=("pte", "etrecord", "bpte")) if program else None
        if prog is not None:
            for run, e in ((pa, ea), (pb, eb)):
                msg = self._mismatch(run, e, prog)
                if msg:
                    raise FormatError(msg)
            if artifact_kind(prog) == "pte":
                pte = self._load(prog, "pte")
        else:
            from etlab.inspector import run_calls

            if {(c.block, c.instruction, c.kind) for c in run_calls(ea)} != \
                    {(c.block, c.instruction, c.kind) for c in run_calls(eb)}:
                raise FormatError(f"{self.rel(pa)} and {self.rel(pb)} are runs of different programs")

        def compute():
            ia = Inspector(etdump_path=str(pa))
            ib = Inspector(etdump_path=str(pb))
            return compare_view(ia, ib, name_a=self.rel(pa), name_b=self.rel(pb), pte=pte)

        key = ("compare", str(pa), file_version(pa), str(pb), file_version(pb),
               str(prog) if prog else None, file_version(prog) if prog else None)
        return cast(CompareView, clean_json(self.cache.get(key, lambda: self._named(pa, compute))))

    def artifacts(self, folder: str = "") -> Artifacts:
        """The artifacts under `folder` grouped by program hash; runs join the program they match."""
        base = confine(self.root, folder, directory=True)
        items: list[Artifact] = []
        for path, kind in find_artifacts(self.root, base):
            size, mtime = file_version(path)
            art = Artifact(self.rel(path), kind, size, mtime / 1e9)
            if kind != "etdp":
                try:
                    key = ("sig", str(path), (size, mtime))
                    art.program = self.cache.get(key, lambda p=path: signature_hash(self.program_signature(p)))
                except (FormatError, PathError, OSError) as e:
                    art.error = describe_error(e)
            items.append(art)
        programs = {}
        for art in items:
            if art.program and art.program not in programs:
                programs[art.program] = self.root / art.path
        for art in items:
            if art.kind != "etdp":
                continue
            try:
                etdump = self._load(self.root / art.path, "etdp")
                for h, prog in programs.items():
                    if self._mismatch(self.root / art.path, etdump, prog) is None:
                        art.program = h
                        break
            except (FormatError, PathError, OSError) as e:
                art.error = describe_error(e)
        groups: dict[str, list[ArtifactFile]] = {}
        for art in items:
            groups.setdefault(art.program or "", []).append(cast(ArtifactFile, vars(art)))
        return {"folder": self.rel(base) if base != self.root else "",
                "groups": [{"program": h or None, "files": files} for h, files in
                           sorted(groups.items(), key=lambda kv: (kv[0] == "", kv[0]))],
                "truncated": len(items) >= 500}

    def _versioned(self, path: Path, key: tuple, compute) -> dict:
        """compute() cached by the file's version, with that version attached (the viewer's reload check)."""
        size, mtime = file_version(path)
        view: dict = self.cache.get(("view", str(path), size, mtime, key), lambda: cast(dict, clean_json(compute())))
        return {**view, "path": self.rel(path), "size": size, "mtime_ns": str(mtime)}
