"""Who produced an ETDump: program identity, method, device, build and labels.

Tags come from three places, later ones winning: defaults given to the ingest (`--tag k=v`), a
path pattern matched against the file's path under the ingest root (`{build}/{device}/*.etdp`),
and a sidecar JSON next to the file (`run.etdp.json` or `run.json`). Every source is untrusted:
a sidecar is size-capped and type-checked, and the values that become directory names in the
store (program, build) are restricted to a safe alphabet so no tag can steer a write elsewhere.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from etlab.errors import FormatError

TAG_FIELDS = ("program", "method", "device", "device_class", "build")
UNKNOWN_BUILD = "unknown"  # the build of a file no tag names one for
SIDECAR_MAX_BYTES = 1 << 20
# Values used as Hive partition directory names: no separators, no leading dot, no '=' or '%'.
_PARTITION_SAFE = re.compile(r"[A-Za-z0-9_+-][A-Za-z0-9._+-]{0,127}")
_TAG_VALUE_MAX = 256
_LABEL_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")


@dataclass(frozen=True)
class FileTags:
    """The identity of one ETDump: which program (hash of the .pte) and method ran, where, on which build."""

    program: str | None = None
    method: str = "forward"
    device: str = "unknown"
    device_class: str | None = None   # defaults to the device when unset
    build: str | None = None
    labels: dict[str, str] = field(default_factory=dict)

    def merged(self, other: dict) -> FileTags:
        """These tags overridden by the set keys of `other` (already validated); labels are merged."""
        labels = {**self.labels, **other.get("labels", {})}
        fields = {k: v for k, v in other.items() if k != "labels" and v is not None}
        return replace(self, **fields, labels=labels)

    def finished(self, where: str, *, program_later: bool = False) -> FileTags:
        """Checks that program and build are safe as directory names; fills device_class, and build
        (UNKNOWN_BUILD when none was given). `program_later`: the program may still be unset (the
        ingest worker fingerprints the run, etlab.fleet._identity)."""
        tags = self if self.build is not None else replace(self, build=UNKNOWN_BUILD)
        for key in ("program", "build"):
            value = getattr(tags, key)
            if value is None and key == "program" and program_later:
                continue
            if value is None:
                raise FormatError(f"{where}: no {key!r} tag (give a sidecar JSON, a path pattern or --tag {key}=...)")
            if not _PARTITION_SAFE.fullmatch(value):
                raise FormatError(f"{where}: {key} tag {value!r} must match {_PARTITION_SAFE.pattern}")
        return replace(tags, device_class=tags.device_class or tags.device)

    def labels_json(self) -> str:
        """The labels as the store keeps them: compact JSON with sorted keys (equal labels, equal text)."""
        return json.dumps(self.labels, sort_keys=True, separators=(",", ":"))


def _check_value(key: str, value, where: str) -> str:
    if not isinstance(value, str) or not value or len(value) > _TAG_VALUE_MAX or "\x00" in value:
        raise FormatError(f"{where}: tag {key!r} must be a non-empty string of at most {_TAG_VALUE_MAX} characters")
    return value


def validate_tags(raw: dict, where: str) -> dict:
    """Untrusted mapping -> {field: str, labels: {str: str}}; unknown keys and wrong types are errors."""
    if not isinstance(raw, dict):
        raise FormatError(f"{where}: tags must be a JSON object, got {type(raw).__name__}")
    out: dict = {}
    for key, value in raw.items():
        if key in TAG_FIELDS:
            out[key] = _check_value(key, value, where)
        elif key == "labels":
            if not isinstance(value, dict) or len(value) > 64:
                raise FormatError(f"{where}: 'labels' must be an object of at most 64 entries")
            out["labels"] = {_check_label_key(k, where): _check_value(f"labels.{k}", v, where)
                             for k, v in value.items()}
        elif isinstance(key, str) and key.startswith("label."):
            out.setdefault("labels", {})[_check_label_key(key[6:], where)] = _check_value(key, value, where)
        else:
            raise FormatError(f"{where}: unknown tag {key!r} (known: {', '.join(TAG_FIELDS)}, labels, label.<name>)")
    return out


def _check_label_key(key, where: str) -> str:
    if not isinstance(key, str) or not _LABEL_KEY.fullmatch(key):
        raise FormatError(f"{where}: label name {key!r} must match {_LABEL_KEY.pattern}")
    return key


def parse_tag_args(pairs: list[str] | None) -> dict:
    """`["build=A", "label.os=14"]` (the CLI's --tag) -> validated tags."""
    raw = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep:
            raise FormatError(f"--tag {pair!r}: expected KEY=VALUE")
        raw[key.strip()] = value
    return validate_tags(raw, "--tag")


def sidecar_path(etdump: Path) -> Path | None:
    """The sidecar of `run.etdp`: `run.etdp.json` if present, else `run.json`, else None."""
    for cand in (etdump.with_name(etdump.name + ".json"), etdump.with_suffix(".json")):
        if cand.is_file():
            return cand
    return None


def read_sidecar(path: Path) -> dict:
    """A sidecar JSON's tags, validated; a huge, non-UTF-8 or malformed sidecar is a FormatError."""
    with open(path, "rb") as f:
        data = f.read(SIDECAR_MAX_BYTES + 1)
    if len(data) > SIDECAR_MAX_BYTES:
        raise FormatError(f"{path}: sidecar is larger than {SIDECAR_MAX_BYTES} bytes")
    try:
        raw = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise FormatError(f"{path}: sidecar is not valid JSON ({e})") from None
    return validate_tags(raw, str(path))


@dataclass(frozen=True)
class PathPattern:
    """A relative path pattern with `{tag}` fields: `{build}/{device_class}/{device}/*.etdp`.

    `{name}` matches part of one path segment, `*` any characters within a segment, `**` any
    number of whole segments. Field names are the tag fields or `label.<name>`.

    >>> pattern = PathPattern.compile("{build}/{device_class}/{device}/*.etdp")
    >>> pattern.match("v2/mid/pixel7/run1.etdp")
    {'build': 'v2', 'device_class': 'mid', 'device': 'pixel7'}
    >>> pattern.match("v2/run1.etdp") is None
    True
    """

    text: str
    regex: re.Pattern

    @staticmethod
    def compile(text: str) -> PathPattern:
        """Parses the pattern once; unknown fields and unbalanced braces are errors naming it."""
        parts, pos, names = [], 0, set()
        for m in re.finditer(r"\{([^{}]*)\}|\*\*/?|\*|[{}]", text):
            parts.append(re.escape(text[pos : m.start()]))
            tok = m.group(0)
            if tok in ("{", "}"):
                raise FormatError(f"--pattern {text!r}: unbalanced brace at character {m.start()}")
            if tok.startswith("**"):
                parts.append("(?:.*/)?" if tok.endswith("/") else ".*")
            elif tok == "*":
                parts.append("[^/]*")
            else:
                name = m.group(1)
                validate_tags({name: "x"}, f"--pattern {text!r}")
                if name in names:
                    raise FormatError(f"--pattern {text!r}: field {{{name}}} appears twice")
                names.add(name)
                parts.append(f"(?P<{_group_name(name)}>[^/]+?)")
            pos = m.end()
        parts.append(re.escape(text[pos:]))
        return PathPattern(text, re.compile("".join(parts)))

    def match(self, relative: str) -> dict | None:
        """Tags captured from a '/'-separated relative path, or None if it does not match."""
        m = self.regex.fullmatch(relative)
        if m is None:
            return None
        raw = {_field_name(k): v for k, v in m.groupdict().items()}
        return validate_tags(raw, f"{relative} (pattern {self.text!r})")


def _group_name(field_name: str) -> str:
    return "g_" + field_name.replace(".", "__dot__").replace("-", "__dash__")


def _field_name(group: str) -> str:
    return group[2:].replace("__dot__", ".").replace("__dash__", "-")


def program_hash(pte_path) -> str:
    """The program identity used by the fleet store: the SHA-256 of the .pte file's bytes (hex)."""
    h = hashlib.sha256()
    with open(pte_path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
