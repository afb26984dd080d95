"""quantization_report(..., dataset=...): per-layer statistics over many inputs, the shipped program's output
metrics, calibration coverage; a defect planted on some inputs only is found across the dataset."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

pytest.importorskip("torchao")

from etlab.compiler import EtlabQuantizer
from etlab.devtools import DatasetQuantReport, quantization_report
from etlab.devtools._quant_dataset import make_plan
from etlab.devtools._quant_dataset_stats import Stream, sqnr_stream
from etlab.devtools._quant_debug import capture_values, float_graph_of
from etlab.devtools._quant_debug_fix import quantize_pt2e
from etlab.models import make_cnn, make_mlp

DIM = 0.3  # most inputs; the bright ones (every 8th, from input 3) are 1.0
BRIGHT = [i for i in range(24) if i % 8 == 3]


def _data(n: int = 24, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 3, 32, 32, generator=gen) * (1.0 if i in BRIGHT else DIM) for i in range(n)]


@pytest.fixture(scope="module")
def cnn():
    model, inputs = make_cnn()
    float_gm = float_graph_of(model, inputs)
    bright = [(torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(100 + i)),) for i in range(4)]
    return float_gm, quantize_pt2e(float_gm, EtlabQuantizer(), bright)  # calibrated on bright inputs


def _plant(float_gm, quantized, data) -> str:
    """Shrinks the output range of one layer (scale * f on its quantize and dequantize nodes) so that it clips
    on the bright inputs only: the layer and f chosen from the values that reach each quantizer (the factor
    each input would need), where the dim inputs' largest need and the bright inputs' smallest are furthest
    apart. A defect that shows only on some inputs."""
    plan = make_plan(float_gm, quantized)
    values = [capture_values(quantized, (x,)) for x in data]
    best = None
    for layer, qname in plan.quantizer_of.items():
        cov = plan.quantizers[qname]
        needs = []
        for captured in values:
            v = captured[plan.quant_inputs[qname]]
            need = float(v.max()) / cov.hi
            if cov.lo < 0:
                need = max(need, float(v.min()) / cov.lo)
            needs.append(need)
        dim = max(n for i, n in enumerate(needs) if i not in BRIGHT)
        bright = min(needs[i] for i in BRIGHT)
        if bright > 1.5 * dim and (best is None or bright / dim > best[0]):
            best = (bright / dim, layer, qname, math.sqrt(dim * bright))
    assert best is not None, "no layer separates the dim inputs from the bright ones"
    _, layer, qname, factor = best
    q = next(n for n in quantized.graph.nodes if n.name == qname)
    for node in [q, *q.users]:
        args = list(node.args)
        args[1] = args[1] * factor
        node.args = tuple(args)
    quantized.recompile()
    return layer


@pytest.fixture(scope="module")
def planted(cnn):
    import copy

    float_gm, quantized = cnn
    broken = copy.deepcopy(quantized)
    layer = _plant(float_gm, broken, _data())
    report = quantization_report(float_gm, broken, dataset=_data(), backend="portable", progress=False)
    return float_gm, broken, layer, report


def test_planted_defect_found_across_the_dataset_not_in_one_input(planted):
    float_gm, broken, layer, report = planted
    assert isinstance(report, DatasetQuantReport) and report.inputs == 24
    # over the dataset: the planted layer introduced the most error at p95, and clipped on exactly the bright inputs
    assert report.worst(1)["layer"].iloc[0] == layer
    row = report.layers.set_index("layer").loc[layer]
    assert row["local_worst_input"] in BRIGHT
    assert row["clipped_inputs"] == pytest.approx(len(BRIGHT) / 24)
    assert row["first_clipped_input"] == BRIGHT[0]
    assert row["local_sqnr_p95"] < row["local_sqnr_mean"] - 3  # a tail, not a shift
    assert layer in set(report.clipped()["layer"])  # (others clip too: calibration saw 4 inputs)
    # one (dim) input's report does not point at it: the defect is invisible there
    one = quantization_report(float_gm, broken, _data()[0])
    assert one.worst(1)["layer"].iloc[0] != layer
    single = one.layers.set_index("layer").loc[layer]
    assert single["local_sqnr"] > row["local_sqnr_p95"] + 5
    # the shipped (portable) program carries the defect: its outputs follow the converted graph's
    assert report.backend == "portable" and report.per_input["program_vs_torch"].max() < 0.05


def test_one_input_dataset_matches_the_single_input_report(cnn):
    float_gm, quantized = cnn
    x = _data(1)[0]
    one = quantization_report(float_gm, quantized, x)
    over = quantization_report(float_gm, quantized, dataset=[x], backend=None, progress=False)
    a = one.layers.set_index("layer")
    b = over.layers.set_index("layer")
    assert list(a.index) == list(b.index)
    pairs = (("local_sqnr", "local_sqnr_mean"), ("sqnr", "sqnr_mean"), ("input_sqnr", "input_sqnr_mean"),
             ("max_abs", "max_abs_max"), ("cosine", "cosine_mean"))
    for col_one, col_over in pairs:
        x1, x2 = a[col_one].to_numpy(float), b[col_over].to_numpy(float)
        finite = np.isfinite(x1)
        assert np.array_equal(finite, np.isfinite(x2)), col_one
        np.testing.assert_allclose(x2[finite], x1[finite], rtol=1e-3, atol=1e-4, err_msg=col_one)
    assert over.output["output_sqnr_mean"] == pytest.approx(one.output_sqnr, abs=1e-3)


@pytest.mark.slow  # two reports of several inputs (over 5 s of CPU): left out of make test-fast
def test_batched_and_one_at_a_time_agree(cnn):
    float_gm, quantized = cnn
    data = _data(6, seed=3)
    a = quantization_report(float_gm, quantized, dataset=data, backend=None, batch_size=1, progress=False)
    b = quantization_report(float_gm, quantized, dataset=data, backend=None, batch_size=4, progress=False)
    assert (a.batch_size, b.batch_size) == (1, 4) and not b.notes
    # a batch's (channels-last) convolutions round differently from one input's: an element of a small layer
    # flips across a quantization step here and there (one of a 10-wide output moves its SQNR by ~2 dB on that
    # input): equal within half a dB, where misjoined or misaligned inputs would be off by many
    np.testing.assert_allclose(b.layers["local_sqnr_mean"], a.layers["local_sqnr_mean"], atol=0.5)
    np.testing.assert_allclose(b.layers["clipped_inputs"].fillna(-1), a.layers["clipped_inputs"].fillna(-1))
    np.testing.assert_allclose(b.per_input["output_sqnr"], a.per_input["output_sqnr"], atol=0.5)


def test_streams_generators_batches_limit_and_user_metrics():
    model, inputs = make_mlp()
    float_gm = float_graph_of(model, inputs)
    quantized = quantize_pt2e(float_gm, EtlabQuantizer(), [inputs])
    shape = inputs[0].shape
    calls = []

    def margin(ref, out):
        calls.append((len(ref), tuple(ref[0].shape), tuple(out[0].shape)))
        return float((ref[0] - out[0]).abs().max())

    gen = (torch.randn(shape) for _ in range(7))  # no len(): streamed
    r = quantization_report(model, quantized, dataset=gen, backend="xnnpack", metrics=margin, progress=False)
    assert r.inputs == 7 and r.backend == "xnnpack" and len(calls) == 7
    assert calls[0] == (1, (4, 10), (4, 10))  # the float and the program's outputs of one input
    assert r.per_input["margin"].notna().all() and "margin" in r.output
    assert 0.0 <= r.output["top1_agreement"] <= 1.0 and r.batch_size == 1  # (4, 32) inputs: no batch of 1


def test_dataloader_batches_are_split_and_limit_stops_early(cnn):
    float_gm, quantized = cnn
    batched = [torch.randn(5, 3, 32, 32), torch.randn(5, 3, 32, 32)]
    r = quantization_report(float_gm, quantized, dataset=batched, backend=None, limit=8, progress=False)
    assert r.inputs == 8 and list(r.per_input["input"]) == list(range(8))


def test_not_batch_agnostic_graph_runs_one_input_at_a_time():
    class Flat(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(12, 16), torch.nn.Linear(16 * 2, 4)

        def forward(self, x):  # (1, 2, 12) -> view(1, 32): the batch of 1 is baked into the view
            return self.b(torch.relu(self.a(x)).reshape(1, 32))

    model = Flat().eval()
    example = (torch.randn(1, 2, 12),)
    float_gm = float_graph_of(model, example)
    quantized = quantize_pt2e(float_gm, EtlabQuantizer(), [example])
    data = [torch.randn(1, 2, 12) for _ in range(5)]
    r = quantization_report(float_gm, quantized, dataset=data, backend=None, batch_size=4, progress=False)
    assert r.inputs == 5 and r.batch_size == 1
    assert any("one input at a time" in n for n in r.notes)
    ref = quantization_report(float_gm, quantized, dataset=data, backend=None, batch_size=1, progress=False)
    np.testing.assert_allclose(r.per_input["output_sqnr"], ref.per_input["output_sqnr"])


def test_bad_datasets_and_options_are_clear_errors(cnn):
    float_gm, quantized = cnn
    with pytest.raises(ValueError, match="dataset is empty"):
        quantization_report(float_gm, quantized, dataset=[], progress=False)
    with pytest.raises(ValueError, match=r"dataset item 2: input 0 is torch.float32 \[1, 3, 16, 16\]"):
        quantization_report(float_gm, quantized, dataset=[*_data(2), torch.randn(1, 3, 16, 16)], backend=None,
                            batch_size=1, progress=False)
    with pytest.raises(TypeError, match="iterable of the model's inputs"):
        quantization_report(float_gm, quantized, dataset=torch.randn(1, 3, 32, 32), progress=False)
    with pytest.raises(ValueError, match="backend must be one of"):
        quantization_report(float_gm, quantized, dataset=_data(1), backend="cuda", progress=False)
    with pytest.raises(TypeError, match="metrics must be a callable"):
        quantization_report(float_gm, quantized, dataset=_data(1), metrics=3, progress=False)
    with pytest.raises(TypeError, match="apply to a report over a dataset"):
        quantization_report(float_gm, quantized, _data(1)[0], backend="portable")
    with pytest.raises(FileNotFoundError, match="no such file"):
        quantization_report(float_gm, quantized, dataset=_data(1), program="/nonexistent.pte", progress=False)


def test_stream_percentiles_against_numpy():
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.normal(35, 4, 990), rng.normal(8, 1, 10), [math.inf, -math.inf]])
    s = sqnr_stream()
    for k in range(0, len(values), 100):
        s.add(values[k:k + 100], np.arange(k, min(k + 100, len(values))))
    finite = values[np.isfinite(values)]
    assert s.n == len(values) and s.mean == pytest.approx(finite.mean())
    for q in (0.05, 0.25, 0.5, 0.95):
        assert abs(s.quantile(q) - np.quantile(values, q, method="lower")) <= 0.1 + 1e-9
    assert (s.low, s.low_input, s.high, s.high_input) == (-math.inf, 1001, math.inf, 1000)
    assert s.quantile(0.0) == -math.inf and s.quantile(1.0) == math.inf
    empty = Stream(np.array([0.0, 1.0]))
    assert math.isnan(empty.quantile(0.5)) and math.isnan(empty.mean)


def test_view_and_repr(planted):
    from etlab.visualizer import DatasetQuantizationView

    _, _, layer, report = planted
    html = report._repr_html_()
    assert layer in html and "clipped" in html
    view = report.show()
    assert isinstance(view, DatasetQuantizationView)
    assert view.worst_layers[0] == layer and layer in view.details.value
    static = view.static_html()
    assert "<svg" in static and layer in static and "inputs with the lowest output SQNR" in static
    view.select(report.layers["layer"].iloc[0])
    assert report.layers["layer"].iloc[0] in view.details.value


def test_coverage_of_the_calibration_data_itself_clips_nothing():
    """Coverage compares the float model's values (what the observers saw) with each range: over the very
    inputs that calibrated it, nothing is clipped and every range is reached (requantization noise, a step
    or so past a range in the converted graph, is not a coverage gap)."""
    model, inputs = make_cnn()
    float_gm = float_graph_of(model, inputs)
    data = [(x,) for x in _data(4, seed=5)]
    quantized = quantize_pt2e(float_gm, EtlabQuantizer(), data)
    r = quantization_report(float_gm, quantized, dataset=data, backend=None, progress=False)
    assert len(r.coverage) > 10 and r.clipped().empty
    assert (r.coverage["range_used"] > 0.9).all()  # every range reached (mean's is the dropout's: within 10%)


def _per_input_reference(float_gm, quantized, data) -> dict[str, np.ndarray]:
    """The straightforward computation: one single-input report per input (both graphs run whole, every value
    kept, quantize/dequantize as decomposed ops), stacked to (inputs, layers) per metric."""
    ones = [quantization_report(float_gm, quantized, x) for x in data]
    cols = ("sqnr", "local_sqnr", "input_sqnr", "cosine", "max_abs")
    out = {c: np.stack([o.layers[c].to_numpy(float) for o in ones]) for c in cols}
    out["layer"] = ones[0].layers["layer"].to_numpy()
    out["output_sqnr"] = np.array([o.output_sqnr for o in ones])
    return out


def _check_against_reference(report, ref, db: float, rel: float) -> None:
    layers = report.layers.set_index("layer").loc[ref["layer"]]
    for col in ("sqnr", "local_sqnr", "input_sqnr"):
        per = ref[col]
        finite = np.isfinite(per).all(0)
        assert finite.sum() > 10, col
        np.testing.assert_allclose(layers[f"{col}_mean"].to_numpy(float)[finite], per[:, finite].mean(0), atol=db,
                                   err_msg=col)
        if col != "input_sqnr":
            np.testing.assert_allclose(layers[f"{col}_min"].to_numpy(float)[finite], per[:, finite].min(0), atol=db,
                                       err_msg=col)
            # p95 from the streamed histogram: the 5th percentile to one 0.1 dB bin
            p95 = np.quantile(per[:, finite], 0.05, axis=0, method="lower")
            assert np.all(np.abs(layers[f"{col}_p95"].to_numpy(float)[finite] - p95) <= 0.1 + db + 1e-9), col
    np.testing.assert_allclose(layers["cosine_mean"].to_numpy(float), ref["cosine"].mean(0), atol=1e-5)
    np.testing.assert_allclose(layers["max_abs_max"].to_numpy(float), ref["max_abs"].max(0), rtol=rel, atol=1e-7)
    np.testing.assert_allclose(report.per_input["output_sqnr"].to_numpy(float), ref["output_sqnr"], atol=db)


@pytest.mark.slow  # 7 single-input reports and two over the dataset (~10 s of CPU)
def test_dataset_statistics_equal_the_per_input_reports(cnn):
    """The streamed, batched, fused computation against the straightforward one (a single-input report per
    input, aggregated with numpy). One input at a time it is the same computation: equal to float rounding.
    Batched (and channels-last) the convolutions round differently, which moves an element across a
    quantization step here and there: equal within half a dB (one flipped element of a 10-wide layer moves its
    mean local SQNR over 7 inputs by ~0.1-0.3 dB) and a step of max-abs error."""
    float_gm, quantized = cnn
    data = _data(7, seed=4)
    ref = _per_input_reference(float_gm, quantized, data)
    one = quantization_report(float_gm, quantized, dataset=data, backend=None, batch_size=1, workers=1,
                              progress=False)
    _check_against_reference(one, ref, db=1e-3, rel=1e-5)
    batched = quantization_report(float_gm, quantized, dataset=data, backend=None, batch_size=4, workers=2,
                                  progress=False)
    assert batched.batch_size == 4 and not batched.notes
    _check_against_reference(batched, ref, db=0.5, rel=0.5)
