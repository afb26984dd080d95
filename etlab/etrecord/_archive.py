"""The ETRecord zip: writing it atomically and reading it defensively.

etlab's own layout has two entries: `etrecord.json` (maps, programs, tensor index) and
`tensors.bin` (raw tensor bytes). Upstream ExecuTorch's (marked by an empty `ETRECORD_V0` entry)
has one entry per program part and map; `_upstream` names the ones it accepts.
Reading checks, before decompressing anything: entry names (no absolute paths, no `..`, only the
names the layout has, at most a few levels deep), no duplicates or encryption, and that the
declared uncompressed sizes stay under a bound relative to the file's size and under a hard cap
(zip bombs). Python's zipfile never inflates an entry past its declared size and checks every
entry's CRC, so a corrupt or lying entry fails here with a FormatError naming the file and the entry.
"""

from __future__ import annotations

import io
import json
import os
import re
import zipfile

from etlab.errors import FormatError
from etlab.schema import write_atomic

MANIFEST = "etrecord.json"  # everything but the tensor bytes: maps, programs, tensor index
FORMAT = "etlab.etrecord"  # the manifest's "format" and "version": what etlab writes and reads
VERSION = 1
TENSOR_BLOB = "tensors.bin"
UPSTREAM_IDENTIFIER = "ETRECORD_V0"

# Uncompressed bytes allowed: this many times the file size (our JSON shrinks ~50x with LZMA, the
# tensor bytes not at all), at least the floor, never more than the hard cap.
MAX_EXPANSION = 100
EXPANSION_FLOOR = 64 << 20
HARD_CAP = 8 << 30
_PICKLE_MAGIC = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")


def write_archive(path, manifest: bytes, blob: bytes) -> None:
    """Writes the two entries; a path is written atomically, a binary file as is.

    The JSON is deflated at level 6. LZMA made it half as small (its programs repeat each other at
    distances beyond deflate's 32 KiB window: 79 KB instead of 151 KB for a Swin-T's 5.7 MB), but at
    zipfile's fixed LZMA preset that took 0.5 s of CPU, a quarter of the whole save, for 70 KB next to
    113 MB of weights; deflate takes 0.05 s. Level 9 over 6 saved 6% of the JSON's compressed size for
    1.7x its time (MobileViT's 5.2 MB: 127 KB in 42 ms vs 134 KB in 25 ms; a BERT's 0.9 MB: 7.5 vs
    4.8 ms, a tenth of its whole save). Readers take any method and level (files written before are
    LZMA or level 9). The tensor bytes are stored as they are: weights do not compress."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data, method in ((MANIFEST, manifest, zipfile.ZIP_DEFLATED), (TENSOR_BLOB, blob, zipfile.ZIP_STORED)):
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = method
            zf.writestr(info, data, compresslevel=6 if method == zipfile.ZIP_DEFLATED else None)
    write_file(path, buf.getvalue())


def write_file(path, data: bytes) -> None:
    """`data` to a path (atomically: a reader never sees half a file) or to a binary file."""
    if isinstance(path, (str, os.PathLike)):
        write_atomic(path, data)
    elif hasattr(path, "write"):
        path.write(data)
    else:
        raise TypeError(f"ETRecord.save: expected a path or a binary file, got {type(path).__name__}")


def _check_name(name: str, where: str, allowed) -> None:
    if name.startswith(("/", "\\")) or re.match(r"[A-Za-z]:", name) or "\\" in name or \
            any(part in ("..", ".") for part in name.split("/")):
        raise FormatError(f"{where}: entry {name!r} has an absolute or parent-relative path")
    if not allowed(name):
        raise FormatError(f"{where}: unexpected entry {name[:120]!r} (an etlab ETRecord holds {MANIFEST} and "
                          f"{TENSOR_BLOB}; an upstream one, marked by {UPSTREAM_IDENTIFIER}, its programs and maps)")


def _is_etlab_name(name: str) -> bool:
    return name in (MANIFEST, TENSOR_BLOB)


def read_archive(source) -> tuple[dict[str, bytes], str]:
    """All entries of an etlab ETRecord zip, checked. `source`: a path, bytes or a binary file."""
    entries, where, _ = read_any_archive(source)
    return entries, where


def read_any_archive(source, upstream_name=None) -> tuple[dict[str, bytes], str, bool]:
    """All entries of an ETRecord zip, checked, its name and whether it is upstream's layout.

    `source`: a path, bytes or a binary file; `upstream_name(name) -> bool` says which entry names
    an upstream ETRecord may have (without it, upstream files are refused)."""
    if isinstance(source, (str, os.PathLike)):
        where = os.fspath(source)
        with open(source, "rb") as f:  # a missing file is a FileNotFoundError, not a FormatError
            data = f.read()
    elif isinstance(source, (bytes, bytearray, memoryview)):
        where, data = "<ETRecord bytes>", bytes(source)
    elif hasattr(source, "read"):
        where, data = getattr(source, "name", "<ETRecord file>"), source.read()
    else:
        raise TypeError(f"parse_etrecord: expected a path, bytes or a binary file, got {type(source).__name__}")
    if not data.startswith(b"PK"):
        hint = " (it is a pickle, which etlab never loads)" if data[:2] in _PICKLE_MAGIC else ""
        raise FormatError(f"{where}: not an ETRecord: not a zip file{hint}")
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
        infos = zf.infolist()
    except Exception as e:  # zipfile raises many kinds on a damaged central directory
        raise FormatError(f"{where}: not a readable zip file ({type(e).__name__}: {e})") from None
    upstream = any(info.filename == UPSTREAM_IDENTIFIER for info in infos)
    if upstream and upstream_name is None:
        raise FormatError(f"{where}: an upstream ExecuTorch ETRecord, which this reader does not accept")
    allowed = upstream_name if upstream else _is_etlab_name
    budget = min(HARD_CAP, max(EXPANSION_FLOOR, MAX_EXPANSION * len(data)))
    total, seen = 0, set()
    for info in infos:
        _check_name(info.filename, where, allowed)
        if info.filename in seen:
            raise FormatError(f"{where}: entry {info.filename!r} appears twice")
        seen.add(info.filename)
        if info.flag_bits & 0x1:
            raise FormatError(f"{where}: entry {info.filename!r} is encrypted")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_LZMA):
            raise FormatError(f"{where}: entry {info.filename!r} uses unsupported compression {info.compress_type}")
        total += info.file_size
        if total > budget:
            raise FormatError(f"{where}: entries expand to more than {budget} bytes ({info.filename!r} declares "
                              f"{info.file_size}); refusing a possible zip bomb")
    if not upstream and MANIFEST not in seen:
        raise FormatError(f"{where}: not an etlab ETRecord: {MANIFEST} is missing")
    out = {}
    for info in infos:
        try:
            out[info.filename] = zf.read(info)
        except Exception as e:
            raise FormatError(f"{where}: entry {info.filename!r} is corrupt ({type(e).__name__}: {e})") from None
        if len(out[info.filename]) != info.file_size:
            raise FormatError(f"{where}: entry {info.filename!r} is shorter than it declares")
    return out, where, upstream


def load_json(entries: dict[str, bytes], name: str, where: str):
    """An entry parsed as JSON; a pickle or anything else that is not JSON is a FormatError."""
    data = entries[name]
    if data[:2] in _PICKLE_MAGIC:
        raise FormatError(f"{where}: entry {name!r} is a pickle, not JSON; etlab never loads pickles")
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise FormatError(f"{where}: entry {name!r} is not valid JSON ({e})") from None


def dump_json(obj) -> bytes:
    """Compact UTF-8 JSON of an archive member; NaN and infinities are refused (a ValueError), since readers of the
    format reject them."""
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode("utf-8")


def etlab_manifest(entries: dict[str, bytes], where: str) -> dict:
    """The manifest of an etlab ETRecord, checked to be of etlab's format and of the version read here."""
    manifest = load_json(entries, MANIFEST, where)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise FormatError(f"{where}: not an etlab ETRecord ({MANIFEST} does not say format {FORMAT!r})")
    if manifest.get("version") != VERSION:
        raise FormatError(f"{where}: ETRecord version {manifest.get('version')!r} is not supported "
                          f"(this etlab reads version {VERSION})")
    return manifest
