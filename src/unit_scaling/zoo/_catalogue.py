"""Every zoo model in one table, grouped by family in the order of :data:`Family`.

A row names the model, what builds it and feeds it (from its family's module),
what it exercises and what it stands for; the family gives the rest (the output
picker, the usual inputs, the packages it needs).
"""

from __future__ import annotations

import functools

from . import (
    _conv,
    _decoders,
    _diffusion,
    _encoders,
    _moe,
    _seq2seq,
    _ssm,
    _torch,
    _vision,
)
from ._common import (
    DIFFUSERS,
    TRANSFORMERS,
    first,
    identity,
    image_inputs,
    last_hidden_state,
    lm_inputs,
    logits,
    sample,
    seq2seq_inputs,
)
from ._model import ZooModel

_decoder = functools.partial(
    ZooModel, family="decoder", inputs=lm_inputs, output=logits, requires=TRANSFORMERS
)
_moe_lm = functools.partial(
    ZooModel, family="moe", inputs=lm_inputs, output=logits, requires=TRANSFORMERS
)
_encoder = functools.partial(
    ZooModel, family="encoder", output=last_hidden_state, requires=TRANSFORMERS
)
_encoder_decoder = functools.partial(
    ZooModel,
    family="encoder-decoder",
    inputs=seq2seq_inputs,
    output=logits,
    requires=TRANSFORMERS,
)
_vision_model = functools.partial(
    ZooModel, family="vision", output=last_hidden_state, requires=TRANSFORMERS
)
_convnet = functools.partial(
    ZooModel,
    family="conv",
    inputs=image_inputs,
    output=last_hidden_state,
    requires=TRANSFORMERS,
)
_denoiser = functools.partial(
    ZooModel, family="diffusion", output=sample, requires=DIFFUSERS
)
_ssm_lm = functools.partial(
    ZooModel, family="ssm", inputs=lm_inputs, output=logits, requires=TRANSFORMERS
)
_plain_torch = functools.partial(ZooModel, family="torch", output=identity)

MODELS = (
    _decoder(
        name="gpt2",
        build=_decoders.gpt2,
        features=(
            "learned-positions",
            "conv1d-linear",
            "fused-qkv",
            "gelu-tanh",
            "tied-lm-head",
        ),
        description="GPT-2: pre-norm, learned positions, Conv1D projections",
    ),
    _decoder(
        name="llama",
        build=_decoders.llama,
        features=("rotary", "gqa", "rms-norm", "swiglu"),
        description="Llama: RMSNorm, rotary, SwiGLU, grouped-query attention",
    ),
    _decoder(
        name="gpt-neox",
        build=_decoders.gpt_neox,
        features=("parallel-residual", "partial-rotary", "fused-qkv"),
        description="GPT-NeoX / Pythia: parallel attention and MLP, quarter rotary",
    ),
    _decoder(
        name="gptj",
        build=_decoders.gptj,
        features=(
            "parallel-residual",
            "partial-rotary",
            "interleaved-rotary",
            "eager-attention",
        ),
        description="GPT-J: parallel attention and MLP after one LayerNorm",
    ),
    _decoder(
        name="bloom",
        build=_decoders.bloom,
        features=("alibi", "fused-qkv", "embedding-layernorm", "tied-lm-head"),
        description="BLOOM: ALiBi position biases, LayerNorm on the embedding",
    ),
    _decoder(
        name="gemma2",
        build=_decoders.gemma2,
        features=(
            "softcap",
            "sandwich-norm",
            "gqa",
            "sliding-window",
            "rms-norm",
            "geglu",
            "scaled-embedding",
            "eager-attention",
        ),
        description="Gemma 2: logit soft-capping, sandwich norms, local/global layers",
    ),
    _decoder(
        name="phi",
        build=_decoders.phi,
        features=("parallel-residual", "partial-rotary", "biased-qkv", "lm-head-bias"),
        description="Phi-1/2: parallel residual, rotary on half, biased projections",
    ),
    _decoder(
        name="qwen2",
        build=_decoders.qwen2,
        features=("biased-qkv", "gqa", "rotary", "rms-norm", "swiglu"),
        description="Qwen2: Llama with biased QKV projections",
    ),
    _decoder(
        name="qwen3",
        build=_decoders.qwen3,
        features=("qk-norm", "gqa", "rotary", "rms-norm", "swiglu"),
        description="Qwen3: Llama with RMSNorm on queries and keys",
    ),
    _decoder(
        name="mistral",
        build=_decoders.mistral,
        features=("sliding-window", "gqa", "rotary", "rms-norm", "swiglu"),
        description="Mistral: Llama with sliding-window attention",
    ),
    _decoder(
        name="opt",
        build=_decoders.opt,
        features=("learned-positions", "position-offset", "relu"),
        description="OPT: learned positions (offset by 2), ReLU MLP",
    ),
    _decoder(
        name="falcon",
        build=_decoders.falcon,
        features=("multi-query", "parallel-residual", "alibi"),
        description="Falcon-7B style: multi-query attention, parallel residual, ALiBi",
    ),
    _decoder(
        name="nanogpt",
        build=_decoders.NanoGPT,
        inputs=_decoders.positional_ids,
        output=first,
        features=("learned-positions", "tied-lm-head", "user-code", "tuple-output"),
        requires=(),
        description="nanoGPT: user code calling F.scaled_dot_product_attention",
    ),
    _moe_lm(
        name="mixtral",
        build=_moe.mixtral,
        features=("top-k-routing", "gqa", "rotary", "rms-norm", "swiglu"),
        description="Mixtral: top-2 of 4 SwiGLU experts after Mistral attention",
    ),
    _moe_lm(
        name="qwen2-moe",
        build=_moe.qwen2_moe,
        features=("top-k-routing", "shared-expert", "gqa", "biased-qkv"),
        description="Qwen2-MoE: routed experts plus a gated shared expert",
    ),
    _moe_lm(
        name="olmoe",
        build=_moe.olmoe,
        features=("top-k-routing", "qk-norm", "gqa"),
        description="OLMoE: top-2 of 8 experts, RMSNorm on queries and keys",
    ),
    _moe_lm(
        name="switch-transformers",
        build=_moe.switch_transformers,
        inputs=seq2seq_inputs,
        features=(
            "top-1-routing",
            "expert-capacity",
            "cross-attention",
            "relative-position-bias",
            "padding-mask",
        ),
        # Routing by capacity breaks the graph at each expert (20 breaks), so a
        # torch.compile of both variants takes over a minute.
        slow=True,
        description="Switch Transformer: T5 encoder-decoder with top-1 expert layers",
    ),
    _encoder(
        name="bert",
        build=_encoders.bert,
        inputs=_encoders.padded_inputs(pad_token_id=0, token_types=True),
        features=("padding-mask", "learned-positions", "token-types", "post-norm"),
        description="BERT: post-norm encoder, learned positions and segment embeddings",
    ),
    _encoder(
        name="roberta",
        build=_encoders.roberta,
        inputs=_encoders.padded_inputs(pad_token_id=1, token_types=False),
        features=("padding-mask", "learned-positions", "position-offset", "post-norm"),
        description="RoBERTa: BERT with positions counted from the padding mask",
    ),
    _encoder(
        name="distilbert",
        build=_encoders.distilbert,
        inputs=_encoders.padded_inputs(pad_token_id=0, token_types=False),
        features=("padding-mask", "learned-positions", "post-norm"),
        description="DistilBERT: BERT without segment embeddings",
    ),
    _encoder(
        name="deberta-v2",
        build=_encoders.deberta_v2,
        inputs=_encoders.padded_inputs(pad_token_id=0, token_types=False),
        features=(
            "padding-mask",
            "relative-attention",
            "disentangled-attention",
            "post-norm",
        ),
        description="DeBERTa-v3: disentangled content and relative-position attention",
    ),
    _encoder_decoder(
        name="t5",
        build=_seq2seq.t5,
        features=(
            "relative-position-bias",
            "cross-attention",
            "rms-norm",
            "unscaled-attention",
            "scaled-tied-lm-head",
            "padding-mask",
        ),
        description="T5: bucketed relative position bias, attention without 1/√d",
    ),
    _encoder_decoder(
        name="bart",
        build=_seq2seq.bart,
        features=(
            "cross-attention",
            "learned-positions",
            "position-offset",
            "post-norm",
            "padding-mask",
        ),
        description="BART: post-norm encoder-decoder with learned positions",
    ),
    _encoder_decoder(
        name="whisper",
        build=_seq2seq.whisper,
        inputs=_seq2seq.whisper_inputs,
        features=("speech", "conv-frontend", "cross-attention", "sinusoidal-positions"),
        description="Whisper: conv front end on log-mel features, pre-norm seq2seq",
    ),
    _encoder_decoder(
        name="speech-to-text",
        build=_seq2seq.speech_to_text,
        inputs=_seq2seq.speech_to_text_inputs,
        features=(
            "speech",
            "conv-frontend",
            "glu",
            "cross-attention",
            "sinusoidal-positions",
            "padding-mask",
        ),
        description="Speech2Text: strided GLU convolutions subsample filter banks",
    ),
    _vision_model(
        name="vit",
        build=_vision.vit,
        inputs=_vision.interpolated,
        features=("patch-embedding", "cls-token", "interpolated-positions"),
        description="ViT: patch embedding, class token, learned positions",
    ),
    _vision_model(
        name="swin",
        build=_vision.swin,
        inputs=_vision.swin_inputs,
        features=(
            "windowed-attention",
            "shifted-windows",
            "relative-position-bias",
            "patch-merging",
        ),
        # Tracing one shape takes 2 s, but tracing the second with dynamic shapes
        # takes a minute, in sympy, on the window partitions' shape arithmetic.
        slow=True,
        description="Swin: shifted-window attention, relative position bias",
    ),
    _vision_model(
        name="clip-vision",
        build=_vision.clip_vision,
        inputs=_vision.interpolated,
        features=("patch-embedding", "cls-token", "quick-gelu", "pre-layernorm"),
        description="CLIP image tower: ViT with quick GELU and a pre-LayerNorm",
    ),
    _vision_model(
        name="dinov2",
        build=_vision.dinov2,
        inputs=image_inputs,
        features=("layer-scale", "cls-token", "interpolated-positions"),
        description="DINOv2: ViT with layer scale, positions interpolated to the image",
    ),
    _vision_model(
        name="beit",
        build=_vision.beit,
        inputs=_vision.interpolated,
        features=("relative-position-bias", "layer-scale", "cls-token"),
        description="BEiT: per-layer relative position bias and layer scale",
    ),
    _convnet(
        name="resnet",
        build=_conv.resnet,
        features=("batch-norm", "bottleneck", "relu", "max-pool", "inplace-ops"),
        description="ResNet-50 style: bottleneck blocks with batch norm",
    ),
    _convnet(
        name="convnext",
        build=_conv.convnext,
        features=(
            "depthwise-conv",
            "layer-scale",
            "channels-last-layernorm",
            "patchify-stem",
        ),
        description="ConvNeXt: 7x7 depthwise convolutions, LayerNorm, layer scale",
    ),
    _convnet(
        name="mobilenet-v2",
        build=_conv.mobilenet_v2,
        inputs=_conv.mobilenet_v2_inputs,
        features=(
            "depthwise-conv",
            "batch-norm",
            "relu6",
            "inverted-residual",
            "same-padding",
        ),
        description="MobileNetV2: inverted residuals of depthwise convolutions, ReLU6",
    ),
    _convnet(
        name="bit",
        build=_conv.bit,
        features=(
            "group-norm",
            "weight-standardization",
            "pre-activation",
            "same-padding",
        ),
        description="BiT: pre-activation ResNetV2, group norm, standardized weights",
    ),
    _denoiser(
        name="unet2d",
        build=_diffusion.unet2d,
        inputs=_diffusion.unet2d_inputs,
        features=(
            "group-norm",
            "silu",
            "timestep-embedding",
            "skip-connections",
            "spatial-attention",
            "upsampling",
        ),
        description="DDPM U-Net: ResNet blocks with group norm and self-attention",
    ),
    _denoiser(
        name="unet2d-condition",
        build=_diffusion.unet2d_condition,
        inputs=_diffusion.unet2d_condition_inputs,
        features=(
            "group-norm",
            "cross-attention",
            "geglu",
            "timestep-embedding",
            "skip-connections",
        ),
        description="Stable Diffusion U-Net: cross-attention to text on latents",
    ),
    _denoiser(
        name="dit",
        build=_diffusion.dit,
        inputs=_diffusion.dit_inputs,
        features=("adaln-zero", "timestep-embedding", "class-embedding", "patchify"),
        description="DiT: transformer on latent patches, adaLN-Zero conditioning",
    ),
    _ssm_lm(
        name="mamba",
        build=_ssm.mamba,
        inputs=_ssm.mamba_inputs,
        features=("selective-scan", "causal-conv1d", "gated-mlp", "rms-norm"),
        slow=True,
        description="Mamba: selective state-space scan, sequential on CPU",
    ),
    _ssm_lm(
        name="mamba2",
        build=_ssm.mamba2,
        features=("chunked-scan", "causal-conv1d", "gated-rms-norm", "multi-head-ssm"),
        description="Mamba-2: state-space duality, scanned chunk by chunk in torch",
    ),
    _plain_torch(
        name="mlp",
        build=_torch.MLP,
        inputs=_torch.features,
        features=("gelu",),
        description="A two-layer GELU MLP on token features",
    ),
    _plain_torch(
        name="transformer-encoder",
        build=_torch.Encoder,
        inputs=_torch.padded_features,
        features=("post-norm", "padding-mask", "fused-attention-module"),
        description="nn.TransformerEncoder with a key padding mask",
    ),
    _plain_torch(
        name="nn-transformer",
        build=_torch.nn_transformer,
        inputs=_torch.transformer_inputs,
        features=("cross-attention", "causal-mask", "post-norm"),
        description="nn.Transformer encoder-decoder with a causal target mask",
    ),
    _plain_torch(
        name="sequential",
        build=_torch.sequential,
        inputs=_torch.pixels,
        features=("sequential-root", "batch-norm", "max-pool", "global-pool"),
        description="An nn.Sequential CNN classifier: convolutions, batch norm, pools",
    ),
    _plain_torch(
        name="user-inplace",
        build=_torch.UserInplace,
        inputs=_torch.features,
        features=("inplace-ops", "gelu-tanh", "silu", "functional-dropout"),
        description="User code with in-place residuals, scalings and activations",
    ),
)
