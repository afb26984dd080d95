"""A Llama-style decoder whose KV cache is the program's state: mutable buffers written in place at
the token positions, as on-device LLM exports (ExecuTorch's export_llama) hold it, with a prefill
method (the prompt) and a decode method (one token). Written with torch.nn (RMSNorm, rotary
embeddings, grouped-query attention, SwiGLU), random weights.

Compiled with `MemoryPlanningPass(share_mutable_buffers=True)`, prefill and decode share one cache,
so decode continues the prompt prefill wrote (`generate` runs that loop eagerly). Without it each
method plans its own copy (upstream's default too), and decode sees only what it wrote itself.

This file imports torch only, so upstream ExecuTorch's python can load it by path (the interop tests
export the same model there).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class _RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding on (batch, heads, tokens, head_dim) with cos/sin of (tokens, head_dim / 2)."""
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class _Layer(nn.Module):
    """Pre-norm attention (GQA, rotary, a static cache in buffers `k_cache`/`v_cache`) + SwiGLU MLP."""

    def __init__(self, dim: int, heads: int, kv_heads: int, hidden: int, max_seq: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.attn_norm, self.mlp_norm = _RMSNorm(dim), _RMSNorm(dim)
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.gate, self.up = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)
        self.register_buffer("k_cache", torch.zeros(1, kv_heads, max_seq, self.head_dim))
        self.register_buffer("v_cache", torch.zeros(1, kv_heads, max_seq, self.head_dim))

    def forward(self, x: Tensor, input_pos: Tensor, cos: Tensor, sin: Tensor, mask: Tensor) -> Tensor:
        b, t, _ = x.shape
        h = self.attn_norm(x)
        q = self.wq(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        self.k_cache[:, :, input_pos] = k
        self.v_cache[:, :, input_pos] = v
        group = self.heads // self.kv_heads
        keys = self.k_cache.repeat_interleave(group, dim=1)
        values = self.v_cache.repeat_interleave(group, dim=1)
        scores = q @ keys.transpose(-1, -2) / math.sqrt(self.head_dim)
        scores = scores.masked_fill(~mask, float("-inf"))
        out = (scores.softmax(-1) @ values).transpose(1, 2).reshape(b, t, -1)
        x = x + self.wo(out)
        h = self.mlp_norm(x)
        return x + self.down(nn.functional.silu(self.gate(h)) * self.up(h))


class LlamaStaticKV(nn.Module):
    """`prefill(tokens (1, P), input_pos (P,))` and `decode(token (1, 1), input_pos (1,))`: the logits of
    the last token; both write their keys/values into the cache buffers at `input_pos`."""

    def __init__(self, vocab: int = 96, dim: int = 32, layers: int = 2, heads: int = 4, kv_heads: int = 2,
                 hidden: int = 64, max_seq: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(_Layer(dim, heads, kv_heads, hidden, max_seq) for _ in range(layers))
        self.norm, self.head = _RMSNorm(dim), nn.Linear(dim, vocab, bias=False)
        half = dim // heads // 2
        freqs = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float32) / half))
        angles = torch.outer(torch.arange(max_seq, dtype=torch.float32), freqs)
        self.register_buffer("rope_cos", angles.cos(), persistent=False)
        self.register_buffer("rope_sin", angles.sin(), persistent=False)
        self.register_buffer("positions", torch.arange(max_seq), persistent=False)

    def _step(self, tokens: Tensor, input_pos: Tensor) -> Tensor:
        x = self.embed(tokens)
        cos, sin = self.rope_cos[input_pos], self.rope_sin[input_pos]
        mask = input_pos[:, None] >= self.positions[None, :]  # causal over absolute positions
        for layer in self.layers:
            x = layer(x, input_pos, cos, sin, mask)
        return self.head(self.norm(x))[:, -1]

    def prefill(self, tokens: Tensor, input_pos: Tensor) -> Tensor:
        """Fills the cache with a prompt's keys and values at `input_pos` and returns the last token's logits."""
        return self._step(tokens, input_pos)

    def decode(self, token: Tensor, input_pos: Tensor) -> Tensor:
        """One generation step: writes the token's key and value at `input_pos` and returns its logits."""
        return self._step(token, input_pos)

    def forward(self, tokens: Tensor, input_pos: Tensor) -> Tensor:
        """`prefill` (what a single-method export takes)."""
        return self.prefill(tokens, input_pos)


@torch.no_grad()
def generate(module: LlamaStaticKV, prompt: Tensor, steps: int) -> list[int]:
    """Greedy generation, eagerly: prefill the prompt (1, P), then `steps` decode steps, each fed the
    previous token at the next position. The token ids, the first from prefill."""
    p = prompt.shape[1]
    token = int(module.prefill(prompt, torch.arange(p)).argmax(-1))
    tokens = [token]
    for i in range(steps):
        token = int(module.decode(torch.tensor([[token]]), torch.tensor([p + i])).argmax(-1))
        tokens.append(token)
    return tokens
