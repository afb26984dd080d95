"""The adapter keeps its conversions by file content and starts them while Model Explorer's server starts:
an unchanged file is answered from what was kept, a changed one (even rewritten to the same size and
mtime) is converted again, never served a stale graph; through the real server as through the class."""

from __future__ import annotations

import json
import os
import threading
import urllib.parse
import urllib.request

import pytest
import torch

from etlab.model_explorer import main, me_graphs
from etlab.model_explorer._cache import ConversionCache, command_line_models


def record(path, relus: int):
    from etlab.compiler import to_edge

    model = torch.nn.Sequential(*[torch.nn.ReLU() for _ in range(relus)])
    et = to_edge(torch.export.export(model, (torch.randn(2, 3),)), generate_etrecord=True).to_executorch()
    et.get_etrecord().save(path)
    return path.read_bytes()


@pytest.fixture(scope="module")
def two_records(tmp_path_factory):
    d = tmp_path_factory.mktemp("me-cache")
    return record(d / "a.etrecord", 2), record(d / "b.etrecord", 3)


def rewrite_keeping_stat(path, data: bytes) -> None:
    """`data` into `path` in place (same inode), its mtime put back: only the content tells the change."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.write(data)
        f.truncate()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def labels(answer) -> list[str]:
    return [n["label"] for g in answer["graphs"] for n in (g.nodes if hasattr(g, "nodes") else g["nodes"])]


def test_a_changed_file_is_converted_again_not_served_stale(two_records, tmp_path):
    a, b = two_records
    path = tmp_path / "model.etrecord"
    path.write_bytes(a)
    first = main.EtlabAdapter().convert(str(path), {})
    assert labels(first) == labels(me_graphs(path))
    again = main.EtlabAdapter().convert(str(path), {})
    assert again["graphs"][0].nodes is first["graphs"][0].nodes  # kept: the same JSON, new classes around it
    assert again["graphs"][0] is not first["graphs"][0]
    rewrite_keeping_stat(path, b)
    changed = main.EtlabAdapter().convert(str(path), {})
    assert labels(changed) == labels(me_graphs(path)) != labels(first)
    assert labels(changed).count("relu") == 2 * 3  # ATen and Edge graphs of the 3-ReLU chain
    from model_explorer.utils import convert_adapter_response

    assert main.checked_graph_classes(json.loads(json.dumps(convert_adapter_response(changed)))) == \
        main.checked_graph_classes(me_graphs(path))


def counting(results: dict | None = None):
    calls: list[str] = []

    def convert(path: str):
        calls.append(path)
        data = open(path, "rb").read()
        if data == b"bad":
            raise ValueError(f"{path}: bad")
        return {"content": data, **(results or {})}

    return calls, convert


def test_kept_by_content_bounded_and_errors_not_kept(tmp_path):
    calls, convert = counting()
    cache = ConversionCache(convert, max_entries=2)
    p, q = tmp_path / "p.pte", tmp_path / "q.pte"
    p.write_bytes(b"one")
    q.write_bytes(b"one")
    assert cache.get(str(p)) is cache.get(str(p)) is cache.get(str(q))  # same kind and bytes: one conversion
    assert len(calls) == 1
    r = tmp_path / "r.etrecord"
    r.write_bytes(b"one")
    cache.get(str(r))
    assert len(calls) == 2  # another kind of file with the same bytes is converted as that kind
    st = os.stat(p)
    p.write_bytes(b"two")  # same size, its mtime put back: only the content differs
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert cache.get(str(p))["content"] == b"two"
    p.write_bytes(b"three")
    assert cache.get(str(p))["content"] == b"three"
    assert len(calls) == 4 and len(cache) == 2  # the oldest answers dropped
    q.write_bytes(b"one")
    cache.get(str(q))
    assert len(calls) == 5
    p.write_bytes(b"bad")
    for _ in range(2):
        with pytest.raises(ValueError, match="bad"):
            cache.get(str(p))
    assert len(calls) == 7  # an error is not kept: the next open tries again
    cache.clear()
    assert len(cache) == 0
    heavy = ConversionCache(convert, weigh=lambda answer: len(answer["content"]), max_weight=10)
    for name, content in (("a.pte", b"123456"), ("b.pte", b"7890"), ("c.pte", b"abcdefghijklmnop")):
        (tmp_path / name).write_bytes(content)
        heavy.get(str(tmp_path / name))
        assert len(heavy) == {"a.pte": 1, "b.pte": 2, "c.pte": 1}[name]  # the newest is kept even alone too heavy


def test_a_file_changed_during_its_conversion_is_not_kept(tmp_path):
    p = tmp_path / "m.pte"
    p.write_bytes(b"before")

    def convert(path: str):
        data = open(path, "rb").read()
        p.write_bytes(b"after!")  # written while converting
        return data

    cache = ConversionCache(convert)
    assert cache.get(str(p)) == b"before"
    assert len(cache) == 0


def test_preloading_converts_once_and_an_open_waits_for_it(tmp_path):
    p = tmp_path / "m.etrecord"
    p.write_bytes(b"model")
    started, release = threading.Event(), threading.Event()
    calls: list[str] = []

    def slow(path: str):
        calls.append(path)
        started.set()
        assert release.wait(60)
        return {"of": path}

    cache = ConversionCache(slow)
    thread = cache.preload([str(p)])
    assert started.wait(60)
    answers: list = []
    opener = threading.Thread(target=lambda: answers.append(cache.get(str(p))))
    opener.start()
    release.set()
    opener.join(60)
    thread.join(60)
    assert answers == [{"of": str(p)}] and calls == [str(p)]  # the open waited for the preload's conversion
    bad = tmp_path / "bad.pte"
    bad.write_bytes(b"bad")
    _, convert = counting()
    failing = ConversionCache(convert)
    failing.preload([str(bad)]).join(60)  # a preload's error is left for the open, which reports it
    with pytest.raises(ValueError, match="bad"):
        failing.get(str(bad))


def test_cache_off_converts_every_open(tmp_path, monkeypatch):
    monkeypatch.setenv("ETLAB_ME_CACHE", "0")
    calls, convert = counting()
    cache = ConversionCache(convert)
    p = tmp_path / "m.pte"
    p.write_bytes(b"x")
    cache.get(str(p))
    cache.get(str(p))
    assert len(calls) == 2 and len(cache) == 0
    assert cache.preload([str(p)]) is None


def test_command_line_models_are_the_named_pte_and_etrecord_files(tmp_path, monkeypatch):
    for name in ("a.pte", "b.etrecord", "c.json", "d.PTE"):
        (tmp_path / name).write_bytes(b"x")
    monkeypatch.setenv("HOME", str(tmp_path))
    argv = [f"{tmp_path}/a.pte,{tmp_path}/c.json", "~/b.etrecord", "--host", "127.0.0.1", "--port", "8080",
            f"--node_data_paths={tmp_path}/a.pte", str(tmp_path / "d.PTE"), str(tmp_path / "missing.pte")]
    assert command_line_models(argv) == [f"{tmp_path}/a.pte", f"{tmp_path}/b.etrecord", str(tmp_path / "d.PTE")]


def send_convert(url: str, path) -> dict:
    """What the page asks Model Explorer's server for a model, and its answer."""
    cmd = {"extensionId": "etlab_executorch", "cmdId": "convert", "modelPath": str(path), "settings": {},
           "deleteAfterConversion": False}
    base = url.split("?")[0].rstrip("/")
    q = urllib.parse.urlencode({"json": json.dumps(cmd)})
    with urllib.request.urlopen(f"{base}/api/v1/send_command?{q}", timeout=300) as r:
        return json.loads(r.read())


def test_model_explorers_server_answers_the_named_file_and_its_changes(two_records, tmp_path):
    from etlab.model_explorer._show import start

    a, b = two_records
    path = tmp_path / "model.etrecord"
    path.write_bytes(a)
    session = start([str(path)], timeout=300)  # as users start it: the adapter converts the file meanwhile
    try:
        first = send_convert(session.url, path)
        assert "error" not in first, first
        assert main.checked_graph_classes(first) == main.checked_graph_classes(me_graphs(path))
        rewrite_keeping_stat(path, b)  # then the page is reloaded
        changed = send_convert(session.url, path)
        assert main.checked_graph_classes(changed) == main.checked_graph_classes(me_graphs(path))
        assert labels(changed) != labels(first)
    finally:
        session.stop()
