"""Tags: sidecar JSON and path patterns are untrusted input, validated and merged in order."""

from __future__ import annotations

import json

import pytest

from etlab.errors import FormatError
from etlab.fleet import FileTags, PathPattern, program_hash
from etlab.fleet._tags import parse_tag_args, read_sidecar, sidecar_path, validate_tags


def test_pattern_captures_fields_and_labels():
    p = PathPattern.compile("{build}/**/{device}/run-{label.app-version}-*.etdp")
    assert p.match("B7/x/y/pixel-8/run-1.2.3-0042.etdp") == {
        "build": "B7", "device": "pixel-8", "labels": {"app-version": "1.2.3"}}
    assert p.match("B7/pixel-8/run-1-0.etdp")["device"] == "pixel-8"     # ** matches zero segments
    assert p.match("B7/pixel-8/other.etdp") is None


@pytest.mark.parametrize("pattern, message", [
    ("{build}/{nosuch}.etdp", "unknown tag 'nosuch'"),
    ("{build}/{build}.etdp", "appears twice"),
    ("{build/x.etdp", "unbalanced brace"),
])
def test_bad_patterns_are_named(pattern, message):
    with pytest.raises(FormatError, match=message):
        PathPattern.compile(pattern)


@pytest.mark.parametrize("raw, message", [
    ({"build": 3}, "must be a non-empty string"),
    ({"build": ""}, "must be a non-empty string"),
    ({"devise": "x"}, "unknown tag 'devise'"),
    ({"labels": {"bad key!": "x"}}, "label name"),
    ({"labels": ["x"]}, "must be an object"),
    ([1, 2], "must be a JSON object"),
])
def test_sidecar_values_are_checked(raw, message):
    with pytest.raises(FormatError, match=message):
        validate_tags(raw, "s.json")


def test_partition_values_must_be_safe_directory_names():
    for bad in ("../x", "a/b", ".hidden", "a=b", "x%2f"):
        with pytest.raises(FormatError, match="must match"):
            FileTags(program="p", build=bad).finished("f.etdp")
    ok = FileTags(program="0123abcd", build="v1.2+rc_3", device="pixel").finished("f.etdp")
    assert ok.device_class == "pixel"


def test_merge_order_and_labels():
    t = FileTags().merged(parse_tag_args(["build=A", "label.os=14"])).merged({"build": "B", "labels": {"app": "2"}})
    assert (t.build, t.labels) == ("B", {"os": "14", "app": "2"})
    assert t.labels_json() == '{"app":"2","os":"14"}'
    with pytest.raises(FormatError, match="KEY=VALUE"):
        parse_tag_args(["build"])


def test_sidecar_lookup_and_limits(tmp_path):
    e = tmp_path / "run.etdp"
    assert sidecar_path(e) is None
    (tmp_path / "run.json").write_text(json.dumps({"build": "A"}))
    assert sidecar_path(e) == tmp_path / "run.json"
    (tmp_path / "run.etdp.json").write_text(json.dumps({"build": "B"}))
    assert read_sidecar(sidecar_path(e)) == {"build": "B"}
    (tmp_path / "run.etdp.json").write_bytes(b"\xff\xfe{")
    with pytest.raises(FormatError, match="not valid JSON"):
        read_sidecar(tmp_path / "run.etdp.json")
    (tmp_path / "run.etdp.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(FormatError):
        read_sidecar(tmp_path / "run.etdp.json")


def test_program_hash_is_sha256_of_the_file(tmp_path):
    import hashlib

    (tmp_path / "m.pte").write_bytes(b"ET12" * 1000)
    assert program_hash(tmp_path / "m.pte") == hashlib.sha256(b"ET12" * 1000).hexdigest()
