"""The fast columnar ETDump reader and debug-buffer decoding."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from etlab.errors import FormatError
from etlab.etdump import load_debug_buffer, read_etdump, tensor_from_debug_buffer
from etlab.schema import deserialize_etdump, serialize_etdump
from etlab.schema import etdump as s
from etlab.schema.scalar_type import ScalarType


def test_matches_generic_decoder_on_synthetic_dump(synthetic_files):
    data = synthetic_files[0].read_bytes()
    cols = read_etdump(data)
    assert cols.to_model() == deserialize_etdump(data)
    assert int(cols.has_allocation.sum()) == 3 and int(cols.has_debug.sum()) > 0
    # columns hold the values the model says
    ev = deserialize_etdump(data).run_data[1].events
    first = cols.runs[1].first_event
    prof = next(i for i, e in enumerate(ev) if e.profile_event)
    assert cols.string(int(cols.name_code[first + prof])) == ev[prof].profile_event.name
    assert int(cols.end_time[first + prof]) == ev[prof].profile_event.end_time


def _value(**kw) -> s.Event:
    return s.Event(debug_event=s.DebugEvent(chain_index=1, instruction_id=2, debug_entry=s.Value(**kw), name="dbg"))


def test_matches_generic_decoder_on_edge_cases():
    t = s.Tensor(scalar_type=ScalarType.HALF, sizes=[2, 3], strides=[1, 2], offset=8)
    dump = s.ETDump(version=7, run_data=[
        s.RunData(name=None, events=None, allocators=None),
        s.RunData(name="", bundled_input_index=3, allocators=[s.Allocator(None), s.Allocator("ä")], events=[]),
        s.RunData(name="Execute", events=[
            _value(val=s.ValueType.Int, int_value=s.Int(-5)),
            _value(val=s.ValueType.Float, float_value=s.Float(1.5)),
            _value(val=s.ValueType.Double, double_value=s.Double(2.25)),
            _value(val=s.ValueType.Bool, bool_value=s.Bool(True), output=s.Bool(False)),
            _value(val=s.ValueType.TensorList, tensor_list=s.TensorList([t, t])),
            _value(val=s.ValueType.TensorList, tensor_list=s.TensorList(None)),
            _value(val=s.ValueType.Tensor, tensor=s.Tensor(sizes=None, strides=[], offset=-1)),
            _value(val=s.ValueType.Null),
            s.Event(debug_event=s.DebugEvent(debug_entry=None, delegate_debug_id_str="d\u00e9l")),
            s.Event(),
            s.Event(profile_event=s.ProfileEvent(name="", delegate_debug_metadata=b"", start_time=1 << 63,
                                                 end_time=(1 << 64) - 1)),
        ]),
    ])
    data = serialize_etdump(dump)
    assert read_etdump(data).to_model() == deserialize_etdump(data) == dump


def test_strings_with_nul_and_invalid_utf8():
    names = ["x\x00y", "", "é", "zz"]
    data = serialize_etdump(s.ETDump(run_data=[s.RunData(name="a\x00b", events=[
        s.Event(profile_event=s.ProfileEvent(name=n)) for n in names])]))
    cols = read_etdump(data)
    assert [cols.string(int(c)) for c in cols.name_code] == names and cols.runs[0].name == "a\x00b"
    bad = bytearray(data)
    bad[bad.find(b"zz")] = 0xFF
    with pytest.raises(FormatError, match="not UTF-8"):
        read_etdump(bytes(bad), what="bad.etdp")


@pytest.mark.parametrize("data, msg", [
    (b"\x00" * 8, "too short"),
    (b"\xff\xff\x00\x00" + b"\x00" * 16, "size prefix"),
    (b"\x10\x00\x00\x00" + b"\x00" * 16, "file identifier"),
])
def test_bad_headers(data, msg):
    with pytest.raises(FormatError, match=msg):
        read_etdump(data, what="bad.etdp")


def test_corrupt_files_raise_format_error_like_the_generic_decoder(synthetic_files):
    """Random byte corruptions: the fast reader either reads exactly what the verified decoder
    reads, or raises FormatError naming the file -- never an IndexError or a wrong read."""
    good = synthetic_files[0].read_bytes()[:6000]  # a prefix is itself a (truncated) test case
    good = bytes(good[:4]) + good[4:]
    rng = random.Random(5)
    base = serialize_etdump(s.ETDump(run_data=[s.RunData(name="Execute", events=[
        s.Event(profile_event=s.ProfileEvent(name=f"op{i}", instruction_id=i, start_time=i, end_time=i + 5,
                                             delegate_debug_metadata=b"ab"))
        for i in range(6)] + [_value(val=s.ValueType.Tensor, tensor=s.Tensor(sizes=[2], strides=[1]))])]))
    outcomes = {"same": 0, "error": 0}
    for trial in range(300):
        buf = bytearray(base if trial % 2 else good)
        for _ in range(rng.randint(1, 3)):
            buf[rng.randrange(4, len(buf))] = rng.randrange(256)
        try:
            expected = deserialize_etdump(bytes(buf))
        except FormatError:
            expected = None
        try:
            got = read_etdump(bytes(buf), what="fuzz.etdp").to_model()
        except FormatError as e:
            assert str(e).startswith("fuzz.etdp: ")
            outcomes["error"] += 1
            continue
        assert expected is not None and got == expected
        outcomes["same"] += 1
    assert outcomes["same"] > 0 and outcomes["error"] > 0


def test_aliasing_budget():
    """Many tensors sharing one long sizes vector would decode far more than the file holds:
    rejected (strings are decoded once per position, so they cannot blow up)."""
    from etlab.etdump._flat import FlatBuffer

    vec = np.concatenate([np.zeros(4, np.uint8), np.array([1000], "<u4").view(np.uint8),
                          np.arange(1000, dtype="<i8").view(np.uint8)])
    fb = FlatBuffer(vec, "alias.etdp")
    values, _ = fb.scalar_vectors(np.full(1, 4, dtype=np.int64), "<i8", "Tensor.sizes")
    assert values.tolist() == list(range(1000))
    with pytest.raises(FormatError, match="offsets alias"):
        FlatBuffer(vec, "alias.etdp").scalar_vectors(np.full(100, 4, dtype=np.int64), "<i8", "Tensor.sizes")


# -- debug buffer ---------------------------------------------------------------------------------


def test_tensors_are_zero_copy_views_with_strides(tmp_path):
    vals = np.arange(12, dtype="<f4")
    path = tmp_path / "dbg.bin"
    path.write_bytes(b"\0" * 16 + vals.tobytes())
    buf = load_debug_buffer(path)
    t = tensor_from_debug_buffer(buf, ScalarType.FLOAT, [3, 4], [4, 1], 16, "t")
    assert torch.equal(t, torch.arange(12, dtype=torch.float32).view(3, 4))
    tt = tensor_from_debug_buffer(buf, ScalarType.FLOAT, [4, 3], [1, 4], 16, "t")  # a transposed layout
    assert torch.equal(tt, t.T)
    t2 = tensor_from_debug_buffer(buf, ScalarType.FLOAT, [12], [1], 16, "t")
    t2[0] = 99.0  # copy-on-write map: the tensor changes, the file does not
    assert t[0, 0] == 99.0
    assert path.read_bytes()[16:20] == vals[:1].tobytes()
    meta = tensor_from_debug_buffer(None, ScalarType.LONG, [2, 5], None, 0, "t")
    assert meta.device.type == "meta" and meta.shape == (2, 5) and meta.dtype == torch.int64
    assert tensor_from_debug_buffer(buf, ScalarType.FLOAT, [0, 3], None, -1, "t").shape == (0, 3)


@pytest.mark.parametrize("sizes, strides, offset", [([4], [1], 60), ([3, 4], [8, 1], 16), ([2], [1], -8)])
def test_out_of_range_tensors_name_the_buffer(tmp_path, sizes, strides, offset):
    path = tmp_path / "short.bin"
    path.write_bytes(b"\0" * 64)
    with pytest.raises(FormatError, match=r"short\.bin"):
        tensor_from_debug_buffer(load_debug_buffer(path), ScalarType.FLOAT, sizes, strides, offset, "tensor")


def test_missing_debug_buffer_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope\.bin"):
        load_debug_buffer(tmp_path / "nope.bin")


# -- low-level fast paths -------------------------------------------------------------------------


@pytest.mark.parametrize("base", [0, 1, 3, 4])
def test_flat_reads_aligned_unaligned_and_out_of_bounds(base):
    """Aligned reads go through a typed view, unaligned ones gather bytes: both give the bytes at
    each position; one position outside the buffer (either end) raises FormatError naming it."""
    from etlab.etdump._flat import FlatBuffer

    rng = np.random.default_rng(base)
    n = 61
    whole = rng.integers(0, 256, base + n, dtype=np.uint8)
    data = whole[base:]
    fb = FlatBuffer(data, "rd.etdp", file=whole, base=base)
    for dt in ("<u1", "<i1", "<u2", "<i4", "<u4", "<i8", "<u8", "<f4", "<f8"):
        w = np.dtype(dt).itemsize
        aligned = [p for p in range(n - w + 1) if (p + base) % w == 0]
        for pos in (aligned, list(range(n - w + 1)), [n - w, 0, n - w]):
            pos = np.array(pos, dtype=np.int64)
            want = np.array([data[p : p + w].tobytes() for p in pos.tolist()], dtype=f"V{w}")
            assert fb.read(pos, dt, "x").tobytes() == want.tobytes()
        for bad in ([-1], [0, n - w + 1], [3, -8]):
            with pytest.raises(FormatError, match=r"^rd\.etdp: x at offset -?\d+ lies outside"):
                fb.read(np.array(bad, dtype=np.int64), dt, "x")


def test_batched_field_reads_match_single_reads(synthetic_files):
    """Tables.read (several fields, one gather per dtype) equals reading each field alone."""
    from etlab.etdump._flat import FlatBuffer

    data = np.frombuffer(synthetic_files[0].read_bytes(), dtype=np.uint8)
    fb = FlatBuffer(data[4:], "b.etdp", file=data, base=4)
    root = fb.tables(fb.read(np.zeros(1, np.int64), "<u4", "root").astype(np.int64), "etdump", "ETDump")
    runs, _ = fb.offset_vectors(root.ref("run_data"), "run_data")
    ev, _ = fb.offset_vectors(fb.tables(runs, "etdump", "RunData").ref("events"), "events")
    prof = fb.tables(ev, "etdump", "Event").ref("profile_event")
    p = fb.tables(prof[prof >= 0], "etdump", "ProfileEvent")
    specs = [("name", None, None), ("chain_index", "<i4", 0), ("start_time", "<u8", 0),
             ("instruction_id", "<i4", -1), ("delegate_debug_id_str", None, None), ("end_time", "<u8", 7)]
    batched = p.read(*specs)
    for (name, dt, default), got in zip(specs, batched):
        single = p.ref(name) if dt is None else p.scalar(name, dt, default)
        assert got.dtype == single.dtype and np.array_equal(got, single)
    assert len(p) > 0 and (batched[0] >= 0).any()


def test_percentiles_match_numpy():
    """The dataframe's p10/p50/p90 reproduce np.percentile bit for bit, NaN and inf included."""
    from etlab.inspector._frames import perf_stats

    rng = np.random.default_rng(0)
    for trial in range(400):
        d = rng.random((int(rng.integers(1, 30)), int(rng.integers(1, 5)))) * 10.0 ** int(rng.integers(-6, 9))
        if trial % 3 == 0:
            mask = rng.random(d.shape)
            d[mask < 0.1], d[(mask > 0.1) & (mask < 0.2)], d[(mask > 0.2) & (mask < 0.25)] = np.nan, np.inf, 0.0
        with np.errstate(invalid="ignore"):
            want = np.vstack([np.percentile(d, [10, 50, 90], axis=0), d.mean(axis=0), d.min(axis=0), d.max(axis=0)])
        assert np.array_equal(perf_stats(d), want, equal_nan=True)
