"""Corpus architectures from the model libraries users bring: torchvision classification and
segmentation models, timm's conv / attention / hybrid families, torchaudio's recurrent and speech models.

Random weights (no hub download: `weights=None` / `pretrained=False`), small inputs where the model
takes any size (64x64 images), the libraries imported as `_library_imports` describes (the wheels'
compiled extensions do not load with the project's CPU torch). The libraries are test-only
dependencies (extra `corpus`); they are imported when a factory runs.

Not in the corpus: torchvision's detection models (their box NMS is `torchvision::nms`, a C++ operator
with no CPU kernel here) and video models (3-D inputs, hundreds of MB of weights); VGG/AlexNet/ViT-B
(0.2-0.5 GB of weights each: what they cover is covered by smaller entries); torchaudio's Conformer
(its padding mask takes `max(lengths)`, a data-dependent size torch.export refuses; `conformer_block`
covers the block) and Tacotron2 (a data-dependent decoding loop).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from etlab.models.corpus._entry import Built, CorpusEntry
from etlab.models.corpus._library_imports import import_torchaudio_models, import_torchvision, timm


class _Tensors(nn.Module):
    """A model whose forward returns a dict or a named tuple, returning its tensors in order."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *args):
        out = self.model(*args)
        if isinstance(out, dict):
            return tuple(v for v in out.values() if isinstance(v, Tensor))
        if isinstance(out, tuple):  # (features, lengths=None) from torchaudio's wav2vec 2.0
            return tuple(v for v in out if isinstance(v, Tensor))
        return out


def _image(size: int = 64, batch: int = 1) -> tuple[Tensor]:
    return (torch.randn(batch, 3, size, size),)


def _tv(name: str, size: int = 64, **kw) -> Built:
    tv = import_torchvision()
    return getattr(tv.models, name)(weights=None, **kw), {"forward": _image(size)}


def _tv_seg(name: str, size: int = 64, **kw) -> Built:
    tv = import_torchvision()
    model = getattr(tv.models.segmentation, name)(weights=None, weights_backbone=None, **kw)
    return _Tensors(model), {"forward": _image(size)}


def _timm(name: str, size: int = 64, **kw) -> Built:
    model = timm().create_model(name, pretrained=False, num_classes=10, **kw)
    return model, {"forward": _image(size)}


def _wavernn() -> Built:
    ta = import_torchaudio_models()
    model = ta.WaveRNN(upsample_scales=[5, 5, 8], n_classes=256, hop_length=200, n_res_block=2, n_rnn=32, n_fc=32,
                       kernel_size=5, n_freq=16, n_hidden=16, n_output=16)
    frames = 2
    return model, {"forward": (torch.randn(1, 1, 200 * frames), torch.randn(1, 1, 16, frames + 4))}


def _conv_tasnet() -> Built:
    ta = import_torchaudio_models()
    model = ta.ConvTasNet(num_sources=2, enc_kernel_size=16, enc_num_feats=32, msk_kernel_size=3, msk_num_feats=16,
                          msk_num_hidden_feats=32, msk_num_layers=3, msk_num_stacks=2)
    return model, {"forward": (torch.randn(1, 1, 800),)}


def _wav2letter() -> Built:
    ta = import_torchaudio_models()
    return ta.Wav2Letter(num_classes=20, input_type="mfcc", num_features=13), {"forward": (torch.randn(1, 13, 60),)}


def _deepspeech() -> Built:
    ta = import_torchaudio_models()
    return ta.DeepSpeech(n_feature=16, n_hidden=32, n_class=10), {"forward": (torch.randn(1, 1, 12, 16),)}


def _wav2vec2_audio() -> Built:
    ta = import_torchaudio_models()
    model = ta.wav2vec2_model(extractor_mode="group_norm", extractor_conv_layer_config=[(16, 10, 5), (16, 3, 2)],
                              extractor_conv_bias=False, encoder_embed_dim=32, encoder_projection_dropout=0.0,
                              encoder_pos_conv_kernel=16, encoder_pos_conv_groups=4, encoder_num_layers=2,
                              encoder_num_heads=4, encoder_attention_dropout=0.0, encoder_ff_interm_features=64,
                              encoder_ff_interm_dropout=0.0, encoder_dropout=0.0, encoder_layer_norm_first=False,
                              encoder_layer_drop=0.0, aux_num_out=12)
    return _Tensors(model), {"forward": (torch.randn(1, 800),)}


def _tv_entry(name: str, what: str, factory, **kw) -> CorpusEntry:
    return CorpusEntry(name=f"tv_{name}", source="torchvision", what=what, factory=factory, **kw)


def _timm_entry(name: str, family: str, what: str, size: int = 64, atol: float = 1e-4, **model_kw) -> CorpusEntry:
    return CorpusEntry(name=f"timm_{name}", source="timm", what=f"{family}: {what}",
                       factory=lambda: _timm(name, size, **model_kw), atol=atol, rtol=1e-4,
                       tags=frozenset({family}))


def _audio_entry(name: str, what: str, factory, **kw) -> CorpusEntry:
    return CorpusEntry(name=f"ta_{name}", source="torchaudio", what=what, factory=factory, **kw)


TORCHVISION_ENTRIES: list[CorpusEntry] = [
    _tv_entry("resnet18", "ResNet-18: basic blocks", lambda: _tv("resnet18")),
    _tv_entry("resnet50", "ResNet-50: bottleneck blocks", lambda: _tv("resnet50")),
    _tv_entry("resnext50", "ResNeXt-50 32x4d: grouped bottlenecks", lambda: _tv("resnext50_32x4d")),
    _tv_entry("mobilenet_v2", "MobileNetV2: inverted residuals, ReLU6", lambda: _tv("mobilenet_v2")),
    _tv_entry("mobilenet_v3_small", "MobileNetV3-Small: SE, hardswish", lambda: _tv("mobilenet_v3_small")),
    _tv_entry("mobilenet_v3_large", "MobileNetV3-Large", lambda: _tv("mobilenet_v3_large")),
    _tv_entry("efficientnet_b0", "EfficientNet-B0: MBConv, SiLU, stochastic depth (eval)",
              lambda: _tv("efficientnet_b0")),
    _tv_entry("efficientnet_v2_s", "EfficientNetV2-S: fused MBConv", lambda: _tv("efficientnet_v2_s")),
    _tv_entry("convnext_tiny", "ConvNeXt-T: permuted LayerNorm, adaptive pool on a permuted tensor",
              lambda: _tv("convnext_tiny"), atol=2e-4),
    _tv_entry("regnet_x_400mf", "RegNetX-400MF: blocks named 'block1-0'", lambda: _tv("regnet_x_400mf")),
    _tv_entry("regnet_y_400mf", "RegNetY-400MF: SE, dashed block names", lambda: _tv("regnet_y_400mf")),
    _tv_entry("shufflenet_v2", "ShuffleNetV2 x0.5: channel shuffle", lambda: _tv("shufflenet_v2_x0_5")),
    _tv_entry("squeezenet", "SqueezeNet 1.1: fire modules, ceil-mode pooling", lambda: _tv("squeezenet1_1")),
    _tv_entry("densenet121", "DenseNet-121: concatenated features", lambda: _tv("densenet121")),
    _tv_entry("mnasnet", "MNASNet 0.5", lambda: _tv("mnasnet0_5")),
    _tv_entry("googlenet", "GoogLeNet: inception branches (no aux heads)",
              lambda: _tv("googlenet", aux_logits=False, init_weights=False)),
    _tv_entry("swin_t", "Swin-T: shifted windows with an in-place mask, relative position bias",
              lambda: _tv("swin_t"), atol=2e-4),
    _tv_entry("swin_v2_t", "Swin-V2-T: cosine attention, log-spaced CPB MLP", lambda: _tv("swin_v2_t"), atol=2e-4),
    _tv_entry("vit_b_32_small", "ViT (torchvision) at 64x64 with 2 layers: class token, MHA",
              lambda: (import_torchvision().models.VisionTransformer(image_size=64, patch_size=16, num_layers=2,
                                                                      num_heads=4, hidden_dim=64, mlp_dim=128,
                                                                      num_classes=10), {"forward": _image(64)})),
    _tv_entry("fcn_resnet50", "FCN-ResNet50 segmentation: dilated backbone, bilinear upsample",
              lambda: _tv_seg("fcn_resnet50", aux_loss=False)),
    _tv_entry("deeplabv3_mobilenet", "DeepLabV3-MobileNetV3: ASPP", lambda: _tv_seg("deeplabv3_mobilenet_v3_large")),
    _tv_entry("lraspp_mobilenet", "LR-ASPP MobileNetV3 segmentation", lambda: _tv_seg("lraspp_mobilenet_v3_large")),
]

TIMM_ENTRIES: list[CorpusEntry] = [
    # conv
    _timm_entry("resnet10t", "conv", "ResNet-10-T: tiered stem, average-pool downsample"),
    _timm_entry("mobilenetv3_small_050", "conv", "MobileNetV3 0.5x (timm)"),
    _timm_entry("efficientnet_b0", "conv", "EfficientNet-B0 (timm)"),
    _timm_entry("regnetx_002", "conv", "RegNetX-200MF (timm)"),
    _timm_entry("mixnet_s", "conv", "MixNet-S: mixed depthwise kernel sizes"),
    _timm_entry("rexnet_100", "conv", "ReXNet: channel-wise slices and SE"),
    _timm_entry("ghostnet_100", "conv", "GhostNet: cheap ghost features"),
    _timm_entry("lcnet_050", "conv", "PP-LCNet 0.5x: hardswish, SE"),
    _timm_entry("mobileone_s0", "conv", "MobileOne-S0: reparameterizable branches (train form)"),
    _timm_entry("repvit_m1", "conv", "RepViT-M1: mobile conv with token/channel mixers"),
    _timm_entry("ese_vovnet19b_dw", "conv", "VoVNet-19 DW: one-shot aggregation, effective SE"),
    _timm_entry("hgnetv2_b0", "conv", "HGNetV2-B0: light conv blocks, learnable affine"),
    _timm_entry("convnext_atto", "conv", "ConvNeXt-Atto (timm): channels-last LayerNorm"),
    _timm_entry("dla34", "conv", "DLA-34: deep layer aggregation trees"),
    _timm_entry("cspresnet50", "conv", "CSPResNet-50: cross-stage partial blocks"),
    # attention
    _timm_entry("vit_tiny_patch16_224", "attention", "ViT-Tiny at 64x64: class token, fused qkv", img_size=64),
    _timm_entry("deit_tiny_distilled_patch16_224", "attention", "DeiT-Tiny distilled: class + distillation tokens",
                img_size=64),
    _timm_entry("cait_xxs24_224", "attention", "CaiT-XXS24: talking heads, class attention, layer scale",
                img_size=64, depth=4),
    _timm_entry("xcit_nano_12_p16_224", "attention", "XCiT-Nano: cross-covariance attention, local patch interaction",
                img_size=64),
    _timm_entry("pvt_v2_b0", "attention", "PVTv2-B0: spatial-reduction attention, overlapping patches"),
    _timm_entry("swin_tiny_patch4_window7_224", "attention", "Swin-T (timm) at 64x64 windows 4",
                img_size=64, window_size=4),
    # hybrid
    _timm_entry("mobilevit_xxs", "hybrid", "MobileViT-XXS: unfold/fold around transformers"),
    _timm_entry("mobilevitv2_050", "hybrid", "MobileViTv2-0.5: separable linear attention"),
    _timm_entry("levit_128s", "hybrid", "LeViT-128S: attention with conv stem, hardswish, attention bias",
                size=224),
    _timm_entry("edgenext_xx_small", "hybrid", "EdgeNeXt-XXS: split depthwise transposed attention"),
    # Its attention runs under torch.autocast(enabled=False): torch.export keeps a wrap_with_autocast
    # submodule, which the edge lowering inlines (etlab.compiler._autocast).
    _timm_entry("efficientvit_b0", "hybrid", "EfficientViT-B0: ReLU linear attention in an autocast region"),
    _timm_entry("fastvit_t8", "hybrid", "FastViT-T8: RepMixer, large-kernel conv"),
    _timm_entry("tiny_vit_5m_224", "hybrid", "TinyViT-5M: conv stages then windowed attention", size=224),
    _timm_entry("coatnet_nano_rw_224", "hybrid", "CoAtNet-Nano: MBConv then relative attention", size=224),
    _timm_entry("poolformer_s12", "hybrid", "PoolFormer-S12: pooling token mixer, GroupNorm"),
]

AUDIO_ENTRIES: list[CorpusEntry] = [
    _audio_entry("wavernn", "WaveRNN vocoder: upsampling ResNet, GRU over 400 samples", _wavernn, atol=2e-4),
    _audio_entry("conv_tasnet", "Conv-TasNet: temporal conv separation with PReLU and GroupNorm", _conv_tasnet),
    _audio_entry("wav2letter", "Wav2Letter: 1-D conv acoustic model on MFCCs", _wav2letter),
    _audio_entry("deepspeech", "DeepSpeech: clipped ReLU FCs and a bidirectional RNN", _deepspeech),
    _audio_entry("wav2vec2", "wav2vec 2.0 (torchaudio): conv extractor, positional conv, transformer",
                 _wav2vec2_audio, atol=2e-4),
]

LIBRARY_ENTRIES = [*TORCHVISION_ENTRIES, *TIMM_ENTRIES, *AUDIO_ENTRIES]
