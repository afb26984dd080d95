"""Corpus architectures written with torch.nn: recurrent nets, mobile CNNs, audio, detection necks,
recommendation, attention, control flow and dynamic shapes. Small sizes, random weights."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.export import Dim
from torch.nn import functional as F

from etlab.models.corpus._entry import Built, CorpusEntry


def _randomize_norm_stats(module: nn.Module) -> nn.Module:
    """BatchNorm running stats and affine params away from identity, so folding errors show."""
    for m in module.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
            if m.affine:
                m.weight.data.uniform_(0.5, 1.5)
                m.bias.data.uniform_(-0.2, 0.2)
    return module


# -- recurrent ---------------------------------------------------------------------------------------------


class _Recurrent(nn.Module):
    """An nn.LSTM/GRU/RNN with a linear head on every step and the final hidden state returned."""

    def __init__(self, rnn: nn.Module):
        super().__init__()
        self.rnn = rnn
        width = rnn.hidden_size * (2 if rnn.bidirectional else 1)
        self.head = nn.Linear(width, 8)

    def forward(self, x: Tensor):
        out, state = self.rnn(x)
        return self.head(out), state


def _rnn(kind: type, layers: int, bidirectional: bool, batch_first: bool = True) -> Built:
    rnn = kind(16, 24, num_layers=layers, bidirectional=bidirectional, batch_first=batch_first)
    x = torch.randn(2, 7, 16) if batch_first else torch.randn(7, 2, 16)
    return _Recurrent(rnn), {"forward": (x,)}


class _LSTMWithState(nn.Module):
    """nn.LSTM with the initial (h, c) passed in and projections (proj_size): the non-oneDNN path."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(12, 20, num_layers=1, proj_size=10)

    def forward(self, x, h, c):
        return self.lstm(x, (h, c))


def _lstm_state() -> Built:
    return _LSTMWithState(), {"forward": (torch.randn(5, 3, 12), torch.randn(1, 3, 10), torch.randn(1, 3, 20))}


# -- mobile CNNs -------------------------------------------------------------------------------------------


def _conv_bn_act(cin: int, cout: int, k: int = 3, stride: int = 1, groups: int = 1, act=nn.ReLU) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout),
                         act() if act else nn.Identity())


class _SqueezeExcite(nn.Module):
    def __init__(self, c: int, gate=nn.Sigmoid, act=nn.SiLU):
        super().__init__()
        self.reduce, self.expand = nn.Conv2d(c, max(4, c // 4), 1), nn.Conv2d(max(4, c // 4), c, 1)
        self.act, self.gate = act(), gate()

    def forward(self, x):
        s = x.mean((2, 3), keepdim=True)
        return x * self.gate(self.expand(self.act(self.reduce(s))))


class _MBConv(nn.Module):
    """EfficientNet/MobileNetV3 inverted residual: expand, depthwise, squeeze-excite, project."""

    def __init__(self, cin: int, cout: int, stride: int, act, gate):
        super().__init__()
        mid = cin * 4
        self.block = nn.Sequential(_conv_bn_act(cin, mid, 1, act=act), _conv_bn_act(mid, mid, 3, stride, mid, act=act),
                                   _SqueezeExcite(mid, gate=gate, act=act), _conv_bn_act(mid, cout, 1, act=None))
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.block(x)
        return x + y if self.residual else y


def _efficientnet() -> Built:
    net = nn.Sequential(_conv_bn_act(3, 16, stride=2, act=nn.SiLU), _MBConv(16, 16, 1, nn.SiLU, nn.Sigmoid),
                        _MBConv(16, 24, 2, nn.SiLU, nn.Sigmoid), _MBConv(24, 24, 1, nn.SiLU, nn.Sigmoid),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2), nn.Linear(24, 10))
    return _randomize_norm_stats(net), {"forward": (torch.randn(1, 3, 32, 32),)}


def _mobilenet_v3() -> Built:
    net = nn.Sequential(_conv_bn_act(3, 16, stride=2, act=nn.Hardswish), _MBConv(16, 16, 1, nn.ReLU, nn.Hardsigmoid),
                        _MBConv(16, 24, 2, nn.Hardswish, nn.Hardsigmoid), _MBConv(24, 24, 1, nn.Hardswish,
                                                                                   nn.Hardsigmoid),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(24, 32), nn.Hardswish(), nn.Linear(32, 10))
    return _randomize_norm_stats(net), {"forward": (torch.randn(1, 3, 32, 32),)}


class _ShuffleUnit(nn.Module):
    """ShuffleNetV2 unit: split channels, branch, concat, channel shuffle (view/transpose/reshape)."""

    def __init__(self, c: int):
        super().__init__()
        half = c // 2
        self.branch = nn.Sequential(_conv_bn_act(half, half, 1), _conv_bn_act(half, half, 3, groups=half, act=None),
                                    _conv_bn_act(half, half, 1))

    def forward(self, x):
        a, b = x.chunk(2, dim=1)
        y = torch.cat((a, self.branch(b)), 1)
        n, c, h, w = y.shape
        return y.view(n, 2, c // 2, h, w).transpose(1, 2).reshape(n, c, h, w)


def _shufflenet() -> Built:
    net = nn.Sequential(_conv_bn_act(3, 24, stride=2), nn.MaxPool2d(3, 2, 1), _ShuffleUnit(24), _ShuffleUnit(24),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(24, 10))
    return _randomize_norm_stats(net), {"forward": (torch.randn(1, 3, 32, 32),)}


class _ResNetGN(nn.Module):
    """ResNet basic block with GroupNorm and a strided 1x1 shortcut."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.a, self.b = nn.Conv2d(16, 32, 3, 2, 1), nn.Conv2d(32, 32, 3, padding=1)
        self.na, self.nb = nn.GroupNorm(4, 32), nn.GroupNorm(8, 32)
        self.short = nn.Conv2d(16, 32, 1, 2)

    def forward(self, x):
        x = F.relu(self.stem(x))
        y = self.nb(self.b(F.relu(self.na(self.a(x)))))
        return F.relu(y + self.short(x)).amax((2, 3))


# -- dense prediction --------------------------------------------------------------------------------------


class _UNet(nn.Module):
    """Two-level UNet: strided conv down, ConvTranspose2d up, skip concat."""

    def __init__(self):
        super().__init__()
        self.enc1, self.enc2 = _conv_bn_act(3, 8), _conv_bn_act(8, 16, stride=2)
        self.mid = _conv_bn_act(16, 16)
        self.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.dec = _conv_bn_act(16, 8)
        self.out = nn.Conv2d(8, 2, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        m = self.mid(self.enc2(e1))
        return self.out(self.dec(torch.cat((self.up(m), e1), 1)))


class _DetectionNeck(nn.Module):
    """YOLO/FPN-style neck: backbone at three strides, nearest upsample + concat, per-level heads."""

    def __init__(self):
        super().__init__()
        self.c3, self.c4, self.c5 = _conv_bn_act(3, 8, stride=2), _conv_bn_act(8, 16, stride=2), _conv_bn_act(
            16, 32, stride=2)
        self.lat5, self.lat4 = nn.Conv2d(32, 16, 1), nn.Conv2d(32, 8, 1)
        self.heads = nn.ModuleList([nn.Conv2d(16, 6, 1), nn.Conv2d(32, 6, 1), nn.Conv2d(16, 6, 1)])

    def forward(self, x):
        p3 = self.c3(x)
        p4 = self.c4(p3)
        p5 = self.c5(p4)
        u4 = torch.cat((F.interpolate(self.lat5(p5), scale_factor=2.0, mode="nearest"), p4), 1)
        u3 = torch.cat((F.interpolate(self.lat4(u4), size=p3.shape[-2:], mode="nearest"), p3), 1)
        return self.heads[0](u3), self.heads[1](u4), self.heads[2](self.lat5(p5))


class _Upsampling(nn.Module):
    """Every interpolate mode a segmentation/super-resolution model uses, on one feature map."""

    def forward(self, x):
        return (F.interpolate(x, scale_factor=2.0, mode="bilinear", align_corners=False),
                F.interpolate(x, size=(13, 11), mode="bilinear", align_corners=True),
                F.interpolate(x, scale_factor=2.0, mode="bicubic", align_corners=False),
                F.interpolate(x, scale_factor=3.0, mode="nearest"),
                F.interpolate(x, size=(9, 7), mode="nearest-exact"),
                F.interpolate(x[:, :, 0], scale_factor=2.0, mode="linear"),
                F.adaptive_avg_pool2d(x, (3, 3)))


class _SuperResolution(nn.Module):
    """ESPCN: convs then PixelShuffle to 3x resolution."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, 16, 5, padding=2), nn.Tanh(), nn.Conv2d(16, 9, 3, padding=1),
                                  nn.PixelShuffle(3))

    def forward(self, x):
        return self.body(x)


class _StyleTransfer(nn.Module):
    """Reflection padding, InstanceNorm, strided conv down and nearest-upsample conv up."""

    def __init__(self):
        super().__init__()
        self.down = nn.Sequential(nn.ReflectionPad2d(2), nn.Conv2d(3, 8, 5), nn.InstanceNorm2d(8, affine=True),
                                  nn.ReLU(), nn.Conv2d(8, 16, 3, 2, 1), nn.InstanceNorm2d(16, affine=True), nn.ReLU())
        self.up = nn.Sequential(nn.Upsample(scale_factor=2), nn.ReflectionPad2d(1), nn.Conv2d(16, 3, 3))

    def forward(self, x):
        return torch.sigmoid(self.up(self.down(x)))


class _Video3D(nn.Module):
    """Conv3d + BatchNorm3d + MaxPool3d + adaptive pooling: a tiny video classifier."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv3d(3, 8, 3, padding=1), nn.BatchNorm3d(8), nn.ReLU(), nn.MaxPool3d(2),
                                  nn.Conv3d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool3d(1), nn.Flatten(),
                                  nn.Linear(16, 5))

    def forward(self, x):
        return self.body(x)


# -- audio -------------------------------------------------------------------------------------------------


class _DilatedTCN(nn.Module):
    """WaveNet/TCN: causal dilated Conv1d stack (dilation 1..8) with gated activations and skips."""

    def __init__(self, c: int = 16):
        super().__init__()
        self.inp = nn.Conv1d(1, c, 1)
        self.filters = nn.ModuleList([nn.Conv1d(c, c, 2, dilation=d) for d in (1, 2, 4, 8)])
        self.gates = nn.ModuleList([nn.Conv1d(c, c, 2, dilation=d) for d in (1, 2, 4, 8)])
        self.out = nn.Conv1d(c, 4, 1)

    def forward(self, x):
        h = self.inp(x)
        skip = torch.zeros_like(h)
        for f, g in zip(self.filters, self.gates):
            pad = F.pad(h, (f.dilation[0], 0))
            y = torch.tanh(f(pad)) * torch.sigmoid(g(pad))
            h, skip = h + y, skip + y
        return self.out(F.relu(skip))


class _DSCNN(nn.Module):
    """Keyword-spotting DS-CNN on a log-mel spectrogram: depthwise-separable conv blocks, avg pool."""

    def __init__(self):
        super().__init__()
        blocks = [_conv_bn_act(1, 32, 3, stride=2)]
        for _ in range(3):
            blocks += [_conv_bn_act(32, 32, 3, groups=32), _conv_bn_act(32, 32, 1)]
        self.body = nn.Sequential(*blocks, nn.AvgPool2d((5, 3)), nn.Flatten())
        self.fc = nn.Linear(32 * 2 * 1, 12)

    def forward(self, spec):
        return F.log_softmax(self.fc(self.body(spec)), -1)


class _ConformerBlock(nn.Module):
    """Conformer: half FFN, MHSA (nn.MultiheadAttention), conv module (GLU, depthwise Conv1d, BN, SiLU), half FFN."""

    def __init__(self, d: int = 32):
        super().__init__()

        def ffn():
            return nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.SiLU(), nn.Linear(4 * d, d))

        self.ff1, self.ff2 = ffn(), ffn()
        self.attn_norm = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, 4, batch_first=True)
        self.conv_norm = nn.LayerNorm(d)
        self.pw1, self.pw2 = nn.Conv1d(d, 2 * d, 1), nn.Conv1d(d, d, 1)
        self.dw = nn.Conv1d(d, d, 7, padding=3, groups=d)
        self.bn = nn.BatchNorm1d(d)
        self.final = nn.LayerNorm(d)

    def forward(self, x):
        x = x + 0.5 * self.ff1(x)
        a = self.attn_norm(x)
        x = x + self.attn(a, a, a, need_weights=False)[0]
        c = self.conv_norm(x).transpose(1, 2)
        c = self.pw2(F.silu(self.bn(self.dw(F.glu(self.pw1(c), dim=1)))))
        x = x + c.transpose(1, 2)
        return self.final(x + 0.5 * self.ff2(x))


# -- recommendation ----------------------------------------------------------------------------------------


class _RecommendationTower(nn.Module):
    """DLRM-style: EmbeddingBag (sum, with offsets; mean, fixed bags) + dense MLP + dot interaction."""

    def __init__(self):
        super().__init__()
        self.user = nn.EmbeddingBag(100, 16, mode="sum")
        self.item = nn.EmbeddingBag(50, 16, mode="mean")
        self.dense = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        self.top = nn.Sequential(nn.Linear(16 + 3, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, user_ids, user_offsets, item_ids, dense):
        feats = torch.stack((self.user(user_ids, user_offsets), self.item(item_ids), self.dense(dense)), 1)
        inter = torch.bmm(feats, feats.transpose(1, 2))
        i, j = torch.triu_indices(3, 3, 1)
        return torch.sigmoid(self.top(torch.cat((feats[:, 2], inter[:, i, j]), 1)))


def _recommendation() -> Built:
    inputs = (torch.randint(0, 100, (10,)), torch.tensor([0, 3, 7, 8]), torch.randint(0, 50, (4, 5)),
              torch.randn(4, 8))
    return _RecommendationTower(), {"forward": inputs}


# -- attention, control flow, dynamic shapes ----------------------------------------------------------------


class _SDPAttention(nn.Module):
    """Multi-head attention through F.scaled_dot_product_attention: causal, and with a boolean mask."""

    def __init__(self, d: int = 32, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x, mask):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        masked = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj((causal + masked).transpose(1, 2).reshape(b, t, d))


class _Cond(nn.Module):
    """torch.cond on a data-dependent predicate, with different ops in each branch."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        def true_fn(x):
            return torch.relu(self.a(x)) * 2

        def false_fn(x):
            return torch.tanh(self.b(x)) - 1

        return torch.cond(x.sum() > 0, true_fn, false_fn, (x,))


class _DynamicEncoder(nn.Module):
    """nn.TransformerEncoder (two layers, GELU, norm_first) over a dynamic batch and sequence."""

    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.embed = nn.Embedding(50, 32)

    def forward(self, tokens):
        return self.encoder(self.embed(tokens)).mean(1)


def _dynamic_encoder_shapes() -> dict:
    return {"forward": {"tokens": {0: Dim("batch", min=1, max=8), 1: Dim("seq", min=2, max=32)}}}


class _DynamicConv(nn.Module):
    """Conv1d audio encoder over a dynamic number of frames, pooled over time."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv1d(4, 16, 3, padding=1), nn.ReLU(), nn.Conv1d(16, 16, 3, padding=1))

    def forward(self, x):
        return self.body(x).amax(-1)


def _simple(module_fn, *shapes, dtype=torch.float32) -> callable:
    def factory() -> Built:
        return _randomize_norm_stats(module_fn()), {"forward": tuple(torch.randn(*s, dtype=dtype) for s in shapes)}

    factory.__name__ = getattr(module_fn, "__name__", "factory")
    return factory


def _entry(name: str, what: str, factory, **kw) -> CorpusEntry:
    return CorpusEntry(name=name, source="torch.nn", what=what, factory=factory, **kw)


NN_ENTRIES: list[CorpusEntry] = [
    _entry("lstm", "nn.LSTM, one layer, batch_first (the aten.mkldnn_rnn_layer case)",
           lambda: _rnn(nn.LSTM, 1, False)),
    _entry("lstm_bidir_2layer", "nn.LSTM, two layers, bidirectional", lambda: _rnn(nn.LSTM, 2, True)),
    _entry("lstm_proj_state", "nn.LSTM with proj_size and an explicit initial state", _lstm_state),
    _entry("gru", "nn.GRU, one layer, sequence-first", lambda: _rnn(nn.GRU, 1, False, batch_first=False)),
    _entry("gru_bidir_2layer", "nn.GRU, two layers, bidirectional", lambda: _rnn(nn.GRU, 2, True)),
    _entry("rnn_tanh_2layer", "nn.RNN (tanh), two layers", lambda: _rnn(nn.RNN, 2, False)),
    _entry("efficientnet", "EfficientNet MBConv: SiLU, squeeze-excite, BatchNorm", _efficientnet),
    _entry("mobilenet_v3", "MobileNetV3: hardswish, hardsigmoid squeeze-excite", _mobilenet_v3),
    _entry("shufflenet_v2", "ShuffleNetV2: chunk, concat, channel shuffle, max pool", _shufflenet),
    _entry("resnet_groupnorm", "ResNet block with GroupNorm and amax pooling", _simple(_ResNetGN, (2, 3, 16, 16))),
    _entry("unet", "UNet: ConvTranspose2d up-sampling and skip concat", _simple(_UNet, (1, 3, 16, 16))),
    _entry("detection_neck", "YOLO/FPN neck: nearest upsample + concat, three heads",
           _simple(_DetectionNeck, (1, 3, 32, 32))),
    _entry("upsample_modes", "interpolate: bilinear (both align_corners), bicubic, nearest, nearest-exact, linear",
           _simple(_Upsampling, (1, 3, 5, 6))),
    _entry("super_resolution", "ESPCN: PixelShuffle", _simple(_SuperResolution, (1, 1, 12, 12))),
    _entry("style_transfer", "ReflectionPad2d, InstanceNorm2d, nn.Upsample", _simple(_StyleTransfer, (1, 3, 16, 16))),
    _entry("video_conv3d", "Conv3d, BatchNorm3d, MaxPool3d, AdaptiveAvgPool3d", _simple(_Video3D, (1, 3, 4, 8, 8))),
    _entry("dilated_tcn", "WaveNet/TCN: causal dilated Conv1d with gated activations",
           _simple(_DilatedTCN, (1, 1, 64))),
    _entry("ds_cnn_audio", "keyword spotting DS-CNN: depthwise-separable convs on a spectrogram",
           _simple(_DSCNN, (1, 1, 20, 10))),
    _entry("conformer_block", "Conformer: MultiheadAttention, GLU, depthwise Conv1d, BatchNorm1d, SiLU",
           _simple(_ConformerBlock, (2, 10, 32))),
    _entry("recommendation_tower", "DLRM-style EmbeddingBag (sum with offsets, mean) + dot interaction",
           _recommendation),
    _entry("sdpa_attention", "F.scaled_dot_product_attention, causal and with a boolean mask",
           lambda: (_SDPAttention(), {"forward": (torch.randn(2, 6, 32), torch.rand(6, 6) > 0.3)})),
    _entry("cond", "torch.cond on a data-dependent predicate", _simple(_Cond, (2, 8))),
    _entry("dynamic_encoder", "nn.TransformerEncoder with dynamic batch and sequence",
           lambda: (_DynamicEncoder(), {"forward": (torch.randint(0, 50, (2, 12)),)}),
           dynamic_shapes=_dynamic_encoder_shapes),
    _entry("dynamic_conv1d", "Conv1d encoder over a dynamic number of frames", _simple(_DynamicConv, (1, 4, 40)),
           dynamic_shapes=lambda: {"forward": {"x": {2: Dim("frames", min=8, max=256)}}}),
]
