"""Self-contained model zoo for etlab.

This file must import only ``torch`` and the standard library: external tools
load it by file path (``zoo.py:make_mlp``) inside other virtualenvs.

Every ``make_*`` factory takes no arguments and returns ``(module, example_inputs)``
with the module in eval mode and weights/inputs fully determined by a fixed seed.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.nn import functional as F

Example = tuple[nn.Module, tuple[Tensor, ...]]


def _register_self() -> None:
    """Put this module in ``sys.modules`` if a by-path loader did not.

    Dynamo (strict export, and ``torch.cond`` even with strict=False) resolves a
    traced function's globals via ``importlib.import_module(__name__)``, which
    fails for ``spec_from_file_location`` + ``exec_module`` without registration.
    """
    if __name__ in sys.modules:
        return
    import gc
    import types

    # The module object is the only ModuleType whose __dict__ is our globals().
    for obj in gc.get_referrers(globals()):
        if isinstance(obj, types.ModuleType) and obj.__dict__ is globals():
            sys.modules[__name__] = obj
            return


_register_self()


def _seeded(seed: int) -> Callable[[Callable[[], Example]], Callable[[], Example]]:
    """Run a factory under a fixed global seed without disturbing the caller's RNG."""

    def deco(fn: Callable[[], Example]) -> Callable[[], Example]:
        @functools.wraps(fn)
        def wrapper() -> Example:
            # nn.Module initializers draw from the global RNG, so seed that (in a fork).
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                return fn()

        return wrapper

    return deco


def _randomize_bn_stats(module: nn.Module) -> None:
    """Give every BatchNorm non-trivial affine params and running stats.

    Fresh BatchNorms are identity-like (mean 0, var 1, weight 1, bias 0), which
    would hide conv+BN folding bugs.
    """
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.BatchNorm2d):
                n = m.num_features
                m.running_mean.copy_(torch.randn(n) * 0.1)
                m.running_var.copy_(torch.rand(n) * 0.5 + 0.75)
                m.weight.copy_(torch.rand(n) * 0.5 + 0.75)
                m.bias.copy_(torch.randn(n) * 0.1)


# --- 1. MLP ---


class MLP(nn.Module):
    """Linear + ReLU stack: exercises addmm/linear lowering and elementwise ops."""

    def __init__(self, d_in: int = 32, hidden: int = 64, d_out: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, d_out)

    def forward(self, x: Tensor) -> Tensor:
        """Three linear layers with ReLU between them: (batch, in) -> (batch, out)."""
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)


@_seeded(0)
def make_mlp() -> Example:
    """MLP 32 -> 64 -> 64 -> 10; input (4, 32)."""
    model = MLP().eval()
    return model, (torch.randn(4, 32),)


# --- 2/3. MobileNetV2-style CNNs (shared building blocks) ---


class ConvBNReLU(nn.Sequential):
    """Conv2d (no bias) + BatchNorm + optional ReLU6: the conv+BN folding target."""

    def __init__(self, c_in: int, c_out: int, k: int = 3, stride: int = 1, groups: int = 1, act: bool = True) -> None:
        pad = (k - 1) // 2
        conv = nn.Conv2d(c_in, c_out, k, stride, pad, groups=groups, bias=False)
        layers: list[nn.Module] = [conv, nn.BatchNorm2d(c_out)]
        if act:
            layers.append(nn.ReLU6())
        super().__init__(*layers)


class InvertedResidual(nn.Module):
    """1x1 expand -> 3x3 depthwise (groups=C) -> 1x1 linear project (+ residual)."""

    def __init__(self, c_in: int, c_out: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = c_in * expand
        self.use_residual = stride == 1 and c_in == c_out
        layers: list[nn.Module] = []
        if expand != 1:  # MobileNetV2 skips the expansion conv when t == 1
            layers.append(ConvBNReLU(c_in, hidden, k=1))
        layers.append(ConvBNReLU(hidden, hidden, 3, stride, groups=hidden))
        layers.append(ConvBNReLU(hidden, c_out, k=1, act=False))
        self.conv = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        """The block's output, with the input added back when shapes allow (stride 1, same channels)."""
        y = self.conv(x)
        return x + y if self.use_residual else y


def _make_divisible(v: float, divisor: int = 8) -> int:
    # Same channel rounding as torchvision's MobileNetV2 so parameter counts match.
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


# (expand t, channels c, repeats n, first stride s), as in the MobileNetV2 paper.
MOBILENET_V2_SETTINGS: list[tuple[int, int, int, int]] = [
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
]


class MobileNetV2(nn.Module):
    """Parameterized MobileNetV2: depthwise conv, BN folding, ReLU6 clamp, mean-pool."""

    def __init__(
        self,
        settings: list[tuple[int, int, int, int]] = MOBILENET_V2_SETTINGS,
        stem_channels: int = 32,
        last_channels: int = 1280,
        num_classes: int = 1000,
        width: float = 1.0,
        dropout: float = 0.2,
    ) -> None:
        super().__init__()
        c_in = _make_divisible(stem_channels * width)
        last = _make_divisible(last_channels * max(1.0, width))
        layers: list[nn.Module] = [ConvBNReLU(3, c_in, stride=2)]
        for t, c, n, s in settings:
            c_out = _make_divisible(c * width)
            for i in range(n):
                layers.append(InvertedResidual(c_in, c_out, s if i == 0 else 1, t))
                c_in = c_out
        layers.append(ConvBNReLU(c_in, last, k=1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(last, num_classes))

    def forward(self, x: Tensor) -> Tensor:
        """Class logits of an image batch: features, global mean pool, linear classifier."""
        x = self.features(x)
        x = x.mean((2, 3))
        return self.classifier(x)


@_seeded(1)
def make_cnn() -> Example:
    """Tiny MobileNetV2 (3 inverted-residual stages, 10 classes); input (1,3,32,32)."""
    model = MobileNetV2(
        settings=[(1, 8, 1, 1), (4, 16, 2, 2), (4, 24, 2, 2)],
        stem_channels=8,
        last_channels=64,
        num_classes=10,
    )
    _randomize_bn_stats(model)
    return model.eval(), (torch.randn(1, 3, 32, 32),)


@_seeded(2)
def make_mobilenet_v2() -> Example:
    """Full MobileNetV2 (width 1.0, 1000 classes, 3.5M params); input (1,3,224,224)."""
    model = MobileNetV2()
    _randomize_bn_stats(model)
    return model.eval(), (torch.randn(1, 3, 224, 224),)


# --- 4. GPT-style decoder ---


class CausalSelfAttention(nn.Module):
    """Explicit matmul/softmax attention with a registered causal-mask buffer."""

    def __init__(self, d_model: int, n_heads: int, max_seq: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        mask = torch.tril(torch.ones(max_seq, max_seq, dtype=torch.bool))
        # Non-persistent: derived constant, keeps state_dict to real weights.
        self.register_buffer("causal_mask", mask, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        """Multi-head attention of each position over itself and earlier ones (the causal mask buffer hides later
        positions)."""
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q = q.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = k.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        scores = scores.masked_fill(~self.causal_mask[:t, :t], float("-inf"))
        y = torch.softmax(scores, dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    """Pre-norm transformer block: LayerNorm, attention, GELU MLP, residuals."""

    def __init__(self, d_model: int, n_heads: int, max_seq: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads, max_seq)
        self.ln2 = nn.LayerNorm(d_model)
        hidden = 4 * d_model
        self.mlp = nn.Sequential(nn.Linear(d_model, hidden), nn.GELU(), nn.Linear(hidden, d_model))

    def forward(self, x: Tensor) -> Tensor:
        """One pre-norm transformer step: x + attention(norm(x)), then + MLP(norm(x))."""
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """Embedding gather, LayerNorm, batched matmul, softmax, GELU, int64 inputs."""

    def __init__(
        self, vocab: int = 64, d_model: int = 32, n_heads: int = 4, n_layers: int = 2, max_seq: int = 8
    ) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d_model)
        self.pos_emb = nn.Embedding(max_seq, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads, max_seq) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, tokens: Tensor) -> Tensor:
        """Next-token logits (batch, seq, vocab) of int64 tokens (batch, seq)."""
        t = tokens.shape[1]
        pos = torch.arange(t, device=tokens.device)
        x = self.tok_emb(tokens) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


@_seeded(3)
def make_transformer() -> Example:
    """GPT decoder (vocab 64, d 32, 4 heads, 2 layers); input int64 tokens (1, 8)."""
    model = TinyGPT().eval()
    return model, (torch.randint(0, 64, (1, 8), dtype=torch.int64),)


# --- 5. Single-token decoder with an in-place KV cache ---


class KVCacheDecoder(nn.Module):
    """One decode step with KV cache buffers mutated in place (mutable-buffer export).

    State persists across calls: calling with input_pos 0 then 1 attends to the
    cached key/value of step 0, so its output differs from a fresh model called
    directly at position 1 (whose slot 0 is still zeros).
    """

    def __init__(self, vocab: int = 64, d_model: int = 32, n_heads: int = 4, max_seq: int = 16) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.max_seq = max_seq
        self.tok_emb = nn.Embedding(vocab, d_model)
        self.pos_emb = nn.Embedding(max_seq, d_model)
        self.ln = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)
        shape = (1, n_heads, max_seq, self.head_dim)
        self.register_buffer("k_cache", torch.zeros(shape))
        self.register_buffer("v_cache", torch.zeros(shape))

    def forward(self, token: Tensor, input_pos: Tensor) -> Tensor:
        """The logits of one token at `input_pos`, writing its key and value into the cache buffers in place (a
        mutable-buffer export), attending to positions <= input_pos."""
        x = self.tok_emb(token) + self.pos_emb(input_pos)  # (1, 1, d)
        h = self.ln(x)
        q, k, v = self.qkv(h).split(h.shape[-1], dim=-1)
        q = q.view(1, 1, self.n_heads, self.head_dim).transpose(1, 2)  # (1, H, 1, hd)
        k = k.view(1, 1, self.n_heads, self.head_dim).transpose(1, 2)
        v = v.view(1, 1, self.n_heads, self.head_dim).transpose(1, 2)
        # In-place write at a data-dependent position: exported as a buffer mutation.
        self.k_cache.index_copy_(2, input_pos, k)
        self.v_cache.index_copy_(2, input_pos, v)
        scores = (q @ self.k_cache.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        # Attend only to positions <= input_pos (mask built from a tensor, no guards).
        visible = torch.arange(self.max_seq, device=token.device) <= input_pos
        scores = scores.masked_fill(~visible, float("-inf"))
        y = torch.softmax(scores, dim=-1) @ self.v_cache  # (1, H, 1, hd)
        x = x + self.proj(y.transpose(1, 2).reshape(1, 1, -1))
        return self.lm_head(x)


@_seeded(4)
def make_kv_cache_decoder() -> Example:
    """KV-cache decode step; inputs token (1, 1) int64, input_pos (1,) int64."""
    model = KVCacheDecoder().eval()
    token = torch.tensor([[7]], dtype=torch.int64)
    input_pos = torch.tensor([0], dtype=torch.int64)
    return model, (token, input_pos)


# --- 6. Dynamic batch ---


class DynamicBatchNet(nn.Module):
    """Conv + Linear head whose batch dim is symbolic: exercises dynamic shapes."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x: Tensor) -> Tensor:
        """Logits of an image batch of any size (the batch dimension is exported symbolic)."""
        x = torch.relu(self.conv(x))
        return self.fc(x.mean((2, 3)))


@_seeded(5)
def make_dynamic_batch() -> Example:
    """Conv net exported with batch in [1, 16]; example input (4, 3, 8, 8)."""
    model = DynamicBatchNet().eval()
    return model, (torch.randn(4, 3, 8, 8),)


# --- 7. Two methods ---


class TwoMethods(nn.Module):
    """Multi-method program: ``forward`` (classifier) and ``encode`` (embedding)."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(16, 8)
        self.head = nn.Linear(8, 3)

    def encode(self, x: Tensor) -> Tensor:
        """The second method: a normalized embedding from the shared encoder (differs from forward by design)."""
        # Shares weights with forward; normalized so the two methods differ clearly.
        return F.normalize(torch.tanh(self.encoder(x)), dim=-1)

    def forward(self, x: Tensor) -> Tensor:
        """The first method: a sigmoid score from the shared encoder and the head."""
        return torch.sigmoid(self.head(torch.relu(self.encoder(x))))


def _two_methods_inputs() -> dict[str, tuple[Tensor, ...]]:
    gen = torch.Generator().manual_seed(106)  # own generator: also used at import time
    return {
        "forward": (torch.randn(2, 16, generator=gen),),
        "encode": (torch.randn(5, 16, generator=gen),),
    }


@_seeded(6)
def make_two_methods() -> Example:
    """Methods forward (2, 16) and encode (5, 16); returns the forward inputs."""
    model = TwoMethods().eval()
    return model, _two_methods_inputs()["forward"]


# --- 8. Control flow ---


class CondNet(nn.Module):
    """Data-dependent ``torch.cond``: exercises higher-order control-flow ops."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: Tensor) -> Tensor:
        """torch.cond on the input's sum: ReLU(linear(x)) + 1 when positive, else 2 sin(x): a program with two branch
        graphs."""
        def true_fn(x: Tensor) -> Tensor:
            return torch.relu(self.lin(x)) + 1.0

        def false_fn(x: Tensor) -> Tensor:
            return torch.sin(x) * 2.0

        return torch.cond(x.sum() > 0, true_fn, false_fn, (x,))


@_seeded(7)
def make_cond() -> Example:
    """torch.cond on ``x.sum() > 0``; input (2, 8) (sum positive -> true branch)."""
    model = CondNet().eval()
    x = torch.linspace(-1.0, 2.0, 16).reshape(2, 8)  # deterministic, positive sum
    return model, (x,)


# --- Registries ---

DYNAMIC_SHAPES: dict[str, object] = {
    "make_dynamic_batch": {"x": {0: torch.export.Dim("batch", min=1, max=16)}},
}

METHOD_INPUTS: dict[str, dict[str, tuple[Tensor, ...]]] = {
    "make_two_methods": _two_methods_inputs(),
}

ZOO: dict[str, Callable[[], Example]] = {
    "mlp": make_mlp,
    "cnn": make_cnn,
    "mobilenet_v2": make_mobilenet_v2,
    "transformer": make_transformer,
    "kv_cache_decoder": make_kv_cache_decoder,
    "dynamic_batch": make_dynamic_batch,
    "two_methods": make_two_methods,
    "cond": make_cond,
}
