"""Corpus architectures from HuggingFace `transformers`, built from small configs with random weights.

Nothing is downloaded: every model comes from `AutoModel.from_config`-style constructors. The
`transformers` package is a test-only dependency (extra `corpus`); it is imported when a factory runs.
Each model is wrapped so that it takes and returns plain tensors (ModelOutput flattened in order).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from etlab.models.corpus._entry import Built, CorpusEntry

_SMALL_TEXT = dict(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                   max_position_embeddings=64)


class _Outputs(nn.Module):
    """Calls a transformers model with keyword inputs and returns its ModelOutput as a tuple of tensors."""

    def __init__(self, model: nn.Module, names: tuple[str, ...], **fixed):
        super().__init__()
        self.model, self.names, self.fixed = model, names, fixed

    def forward(self, *args):
        out = self.model(**dict(zip(self.names, args)), **self.fixed)
        return tuple(v for v in out.to_tuple() if isinstance(v, Tensor))


def _tf():
    import importlib.util

    # transformers imports torchvision and torchaudio when they are installed; the registry's CUDA builds
    # need torchvision's operator schemas declared first, and torchaudio without its extension-loading
    # `__init__` (see _library_imports; transformers uses torchaudio only for audio feature extraction)
    from etlab.models.corpus._library_imports import import_torchaudio_models, import_torchvision

    if importlib.util.find_spec("torchvision") is not None:
        import_torchvision()
    if importlib.util.find_spec("torchaudio") is not None:
        import_torchaudio_models()
    import transformers

    return transformers


def _prepared(model: nn.Module) -> nn.Module:
    """Eval mode, SDPA attention where the model supports it (the path on-device exports take)."""
    return model.eval()


def _text(model_cls: str, config_cls: str, names=("input_ids", "attention_mask"), seq: int = 10, mask: bool = True,
          **config) -> Built:
    tf = _tf()
    cfg = getattr(tf, config_cls)(**config)
    model = _prepared(getattr(tf, model_cls)(cfg))
    ids = torch.randint(0, cfg.vocab_size, (2, seq))
    inputs = (ids, torch.ones(2, seq, dtype=torch.long).index_fill_(1, torch.tensor([seq - 1]), 0)) if mask else (ids,)
    return _Outputs(model, names[:len(inputs)], use_cache=False) if "CausalLM" in model_cls or "GPT2" in model_cls \
        else _Outputs(model, names[:len(inputs)]), {"forward": inputs}


def _bert() -> Built:
    return _text("BertModel", "BertConfig", **_SMALL_TEXT)


def _distilbert() -> Built:
    return _text("DistilBertModel", "DistilBertConfig", vocab_size=96, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                 max_position_embeddings=64)


def _albert() -> Built:
    return _text("AlbertModel", "AlbertConfig", embedding_size=16, **_SMALL_TEXT)


def _roberta() -> Built:
    return _text("RobertaModel", "RobertaConfig", pad_token_id=1, **{**_SMALL_TEXT, "max_position_embeddings": 72})


def _mobilebert() -> Built:
    return _text("MobileBertModel", "MobileBertConfig", vocab_size=96, hidden_size=32, num_hidden_layers=2,
                 num_attention_heads=4, intermediate_size=64, embedding_size=16, intra_bottleneck_size=16,
                 true_hidden_size=16, num_feedforward_networks=2, max_position_embeddings=64)


def _gpt2() -> Built:
    return _text("GPT2LMHeadModel", "GPT2Config", mask=False, vocab_size=96, n_embd=32, n_layer=2, n_head=4,
                 n_positions=64, bos_token_id=0, eos_token_id=0)


def _decoder_config(config_cls: str, **extra):
    return getattr(_tf(), config_cls)(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      **extra)


def _causal_lm(model_cls: str, config_cls: str, **extra) -> Built:
    model = _prepared(getattr(_tf(), model_cls)(_decoder_config(config_cls, **extra)))
    return _Outputs(model, ("input_ids",), use_cache=False), {"forward": (torch.randint(0, 96, (1, 12)),)}


class _PrefillDecode(nn.Module):
    """A causal LM with its KV cache passed in and out as tensors: `prefill(tokens)` returns the last
    logits and the cache (layers, batch, kv-heads, length, head dim) for keys and values;
    `decode(token, keys, values)` runs one step on that cache and returns the next logits and the
    cache grown by one position."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm

    def _run(self, tokens, cache):
        out = self.lm(input_ids=tokens, past_key_values=cache, use_cache=True)
        layers = out.past_key_values.layers
        return (out.logits[:, -1], torch.stack([layer.keys for layer in layers]),
                torch.stack([layer.values for layer in layers]))

    def prefill(self, tokens):
        return self._run(tokens, _tf().DynamicCache(config=self.lm.config))

    def decode(self, token, keys, values):
        cache = _tf().DynamicCache(config=self.lm.config)
        for i in range(keys.shape[0]):
            cache.update(keys[i], values[i], i)
        return self._run(token, cache)

    def forward(self, tokens):
        return self.prefill(tokens)


def _llama_kv() -> Built:
    lm = _prepared(_tf().LlamaForCausalLM(_decoder_config("LlamaConfig")))
    module = _PrefillDecode(lm)
    prompt = torch.randint(0, 96, (1, 8))
    with torch.no_grad():
        _, keys, values = module.prefill(prompt)
    return module, {"prefill": (prompt,), "decode": (torch.randint(0, 96, (1, 1)), keys, values)}


def _t5_encoder() -> Built:
    return _text("T5EncoderModel", "T5Config", vocab_size=96, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                 feed_forward_proj="gated-gelu")


def _vision(model_cls: str, config_cls: str, size: int = 32, channels: int = 3, **config) -> Built:
    tf = _tf()
    model = _prepared(getattr(tf, model_cls)(getattr(tf, config_cls)(**config)))
    return _Outputs(model, ("pixel_values",)), {"forward": (torch.randn(1, channels, size, size),)}


def _vit() -> Built:
    return _vision("ViTModel", "ViTConfig", image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                   num_attention_heads=4, intermediate_size=64)


def _deit() -> Built:
    return _vision("DeiTModel", "DeiTConfig", image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                   num_attention_heads=4, intermediate_size=64)


def _convnext() -> Built:
    return _vision("ConvNextModel", "ConvNextConfig", hidden_sizes=[16, 32, 48, 64], depths=[1, 1, 1, 1])


def _mobilevit() -> Built:
    return _vision("MobileViTModel", "MobileViTConfig", image_size=64, size=64, hidden_sizes=[24, 32, 40],
                   neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 32], num_attention_heads=2)


def _resnet() -> Built:
    return _vision("ResNetModel", "ResNetConfig", embedding_size=16, hidden_sizes=[16, 32, 32, 64], depths=[1, 1, 1, 1])


def _swin() -> Built:
    return _vision("SwinModel", "SwinConfig", image_size=32, patch_size=4, embed_dim=16, depths=[1, 1],
                   num_heads=[2, 4], window_size=4)


def _segformer() -> Built:
    return _vision("SegformerForSemanticSegmentation", "SegformerConfig", size=64, num_encoder_blocks=2, depths=[1, 1],
                   sr_ratios=[2, 1], hidden_sizes=[16, 32], num_attention_heads=[1, 2], decoder_hidden_size=32,
                   num_labels=4, patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2])


def _whisper_encoder() -> Built:
    tf = _tf()
    cfg = tf.WhisperConfig(num_mel_bins=16, d_model=32, encoder_layers=2, encoder_attention_heads=4,
                           encoder_ffn_dim=64, max_source_positions=20, decoder_layers=1, decoder_attention_heads=4,
                           decoder_ffn_dim=64, vocab_size=96, pad_token_id=0, bos_token_id=1,
                           eos_token_id=2, decoder_start_token_id=1)
    encoder = _prepared(tf.WhisperForConditionalGeneration(cfg).get_encoder())
    return _Outputs(encoder, ("input_features",)), {"forward": (torch.randn(1, 16, 40),)}


def _wav2vec2() -> Built:
    tf = _tf()
    cfg = tf.Wav2Vec2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                            conv_dim=(16, 16, 16), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3),
                            num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, vocab_size=32)
    return _Outputs(_prepared(tf.Wav2Vec2Model(cfg)), ("input_values",)), {"forward": (torch.randn(1, 800),)}


def _entry(name: str, what: str, factory, **kw) -> CorpusEntry:
    return CorpusEntry(name=name, source="transformers", what=what, factory=factory, **kw)


HF_ENTRIES: list[CorpusEntry] = [
    _entry("bert", "BERT encoder: absolute positions, token types, GELU, pooler", _bert),
    _entry("distilbert", "DistilBERT encoder", _distilbert),
    _entry("albert", "ALBERT: factorized embeddings, shared layers", _albert),
    _entry("roberta", "RoBERTa: padding-offset positions", _roberta),
    _entry("mobilebert", "MobileBERT: bottlenecks, NoNorm, stacked FFNs", _mobilebert),
    _entry("gpt2", "GPT-2 LM head: Conv1D projections, causal mask", _gpt2),
    _entry("llama_kv", "Llama decoder: prefill and one decode step with the KV cache as two methods", _llama_kv),
    _entry("qwen2", "Qwen2: GQA, RoPE, RMSNorm, SwiGLU, qkv bias", lambda: _causal_lm("Qwen2ForCausalLM",
                                                                                        "Qwen2Config")),
    _entry("mistral", "Mistral: GQA, sliding-window attention", lambda: _causal_lm("MistralForCausalLM",
                                                                                  "MistralConfig",
                                                                                  sliding_window=6)),
    _entry("phi3", "Phi-3: fused qkv and gate-up projections", lambda: _causal_lm("Phi3ForCausalLM", "Phi3Config",
                                                                                  pad_token_id=0)),
    _entry("t5_encoder", "T5 encoder: relative position buckets, RMS layer norm, gated GELU", _t5_encoder),
    _entry("vit", "ViT: patch embedding conv, CLS token", _vit),
    _entry("deit", "DeiT: CLS and distillation tokens", _deit),
    _entry("swin", "Swin: shifted windows (roll), patch merging", _swin),
    _entry("convnext", "ConvNeXt: 7x7 depthwise conv, channels-last LayerNorm, layer scale", _convnext),
    _entry("mobilevit", "MobileViT: unfold/fold patches around transformer blocks", _mobilevit),
    _entry("resnet_hf", "ResNet (transformers) with bottleneck layers", _resnet),
    _entry("segformer", "SegFormer: overlapping patch merge, efficient attention, all-MLP decode head",
           _segformer, atol=2e-4),
    _entry("whisper_encoder", "Whisper encoder: Conv1d stem, sinusoidal positions", _whisper_encoder),
    _entry("wav2vec2", "Wav2Vec2: conv feature encoder, GroupNorm, positional conv, transformer", _wav2vec2,
           atol=2e-4),
]
