"""The model zoo: Hugging Face transformers architectures from tiny configs with random weights.

``ZOO`` maps a name to how to build the model (a config, never a download) and what kind it is:
``decoder`` (a causal LM), ``encoder`` (masked LM over a padded batch), ``seq2seq`` (encoder and
decoder over given decoder ids) or ``vision`` (image classification). What is run on each model
lives in ``checks`` and ``background``; ``tests/e2e/test_zoo.py`` asserts on their
results, and ``table`` writes them as the table of ``docs/zoo.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from models import seeded

VOCAB = 128
"""Tokens of every text model (the checks draw their ids from it)."""
IMAGE_SIZE = 16
"""Side of a ``vision`` model's square images unless its entry says otherwise."""
CALIBRATION_BATCH, CALIBRATION_SEED = 8, 1000
"""The random images that set a vision model's BatchNorm statistics (``calibrate_batch_norms``)."""

TOKENS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
"""Special tokens inside the tiny vocabulary (several configs default to ids past it)."""

LLAMA_LIKE = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    **TOKENS,
)
"""Sizes shared by the Llama-style decoders (RMSNorm, rotary, grouped-query attention)."""


@dataclass(frozen=True)
class ZooModel:
    """One architecture: ``build()`` returns it seeded, in eval mode; ``kind`` picks its inputs."""

    config: Callable[[], Any]
    model_class: str
    kind: str
    options: dict[str, Any] = field(default_factory=dict)
    """npugraph_ex options beyond the defaults of the check ``forward, static kernels``."""
    fallbacks: dict[str, str] = field(default_factory=dict)
    """Check name -> why one of its graphs runs eagerly (a host sync in the model's own code)."""
    image_size: int = IMAGE_SIZE
    """Side of the square images a ``vision`` model is given."""
    dynamic: bool = False
    """Also checked compiled with ``dynamic=True`` over the batch sizes of
    ``checks.DYNAMIC_BATCHES``."""

    def build(self) -> torch.nn.Module:
        import transformers

        model_class = getattr(transformers, self.model_class)
        model = seeded(lambda: model_class(self.config()), 0)
        if self.kind == "vision":
            calibrate_batch_norms(model, self.image_size)
        return model


@torch.no_grad()
def calibrate_batch_norms(model: torch.nn.Module, image_size: int) -> None:
    """Give ``model``'s BatchNorm layers what training would: scale 1, shift 0 and the running
    statistics of one batch of random images (those layers alone in train mode for it).

    A fresh layer's statistics (mean 0, variance 1) do not normalise, and EfficientNet and
    MobileViT draw the scale from N(0, 0.02): with random weights each layer then shrinks the
    activations, MobileNetV2's logits come out near 1e-26 and MobileViT's exactly 0, and a
    comparison within a tolerance says nothing about them.
    """
    kinds = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d)
    norms = [module for module in model.modules() if isinstance(module, kinds)]
    if not norms:
        return
    for norm in norms:
        norm.reset_parameters()
        norm.momentum = None  # a cumulative average: one batch's statistics exactly
        norm.train()
    generator = torch.Generator().manual_seed(CALIBRATION_SEED)
    images = torch.randn(CALIBRATION_BATCH, 3, image_size, image_size, generator=generator)
    model(pixel_values=images)
    for norm in norms:
        norm.eval()


def config(name: str, **kwargs: Any) -> Callable[[], Any]:
    """A deferred ``transformers.<name>(**kwargs)``: the registry imports without transformers."""

    def build() -> Any:
        import transformers

        return getattr(transformers, name)(**kwargs)

    return build


def vision(name: str, image_size: int, dynamic: bool = False, **kwargs: Any) -> ZooModel:
    """``<name>ForImageClassification`` (10 labels) over ``image_size`` x ``image_size`` images,
    from ``<name>Config(**kwargs)`` (a config without an ``image_size`` field keeps it as a plain
    attribute)."""
    return ZooModel(
        config(f"{name}Config", image_size=image_size, num_labels=10, **kwargs),
        f"{name}ForImageClassification",
        "vision",
        image_size=image_size,
        dynamic=dynamic,
    )


STATIC_KERNELS = {"static_kernel_compile": True}
TINY_VIT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, patch_size=4)
"""Sizes shared by the ViT-style encoders after ``vit``: 16 patches of 4x4 and a class token."""

ZOO: dict[str, ZooModel] = {
    "llama": ZooModel(config("LlamaConfig", **LLAMA_LIKE), "LlamaForCausalLM", "decoder"),
    "mistral": ZooModel(config("MistralConfig", **LLAMA_LIKE), "MistralForCausalLM", "decoder"),
    "qwen2": ZooModel(config("Qwen2Config", **LLAMA_LIKE), "Qwen2ForCausalLM", "decoder"),
    "qwen3": ZooModel(
        config("Qwen3Config", **LLAMA_LIKE, head_dim=8), "Qwen3ForCausalLM", "decoder"
    ),
    "qwen3_moe": ZooModel(
        config(
            "Qwen3MoeConfig",
            **LLAMA_LIKE,
            head_dim=8,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
        ),
        "Qwen3MoeForCausalLM",
        "decoder",
    ),
    "gemma": ZooModel(
        config("GemmaConfig", **LLAMA_LIKE, head_dim=8), "GemmaForCausalLM", "decoder"
    ),
    "gemma2": ZooModel(
        config("Gemma2Config", **LLAMA_LIKE, head_dim=8, sliding_window=16),
        "Gemma2ForCausalLM",
        "decoder",
    ),
    "gemma3": ZooModel(
        config("Gemma3TextConfig", **LLAMA_LIKE, head_dim=8, sliding_window=16),
        "Gemma3ForCausalLM",
        "decoder",
    ),
    "phi3": ZooModel(config("Phi3Config", **LLAMA_LIKE), "Phi3ForCausalLM", "decoder"),
    "gpt2": ZooModel(
        config(
            "GPT2Config", vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, **TOKENS
        ),
        "GPT2LMHeadModel",
        "decoder",
        STATIC_KERNELS,
    ),
    "gpt_neox": ZooModel(
        config(
            "GPTNeoXConfig",
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=64,
            **TOKENS,
        ),
        "GPTNeoXForCausalLM",
        "decoder",
    ),
    "opt": ZooModel(
        config(
            "OPTConfig",
            vocab_size=VOCAB,
            hidden_size=32,
            ffn_dim=64,
            word_embed_proj_dim=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=64,
            **TOKENS,
        ),
        "OPTForCausalLM",
        "decoder",
        fallbacks={
            "generate, StaticCache": (
                "OPT builds its position ids from `cache.get_seq_length()`, which a "
                "`StaticCache` returns as a 0-d tensor: the prefill's "
                "`torch.ones(batch, past_seen_tokens + seq)` and "
                "`position_ids[:, past_seen_tokens:]` read it on the host (`.item()`), so "
                "that graph runs eagerly, logged once with the op and line; the decode steps, "
                "which `generate()` gives an attention mask and position ids, replay"
            )
        },
    ),
    "falcon": ZooModel(
        config(
            "FalconConfig",
            vocab_size=VOCAB,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            **TOKENS,
        ),
        "FalconForCausalLM",
        "decoder",
    ),
    "bert": ZooModel(
        config(
            "BertConfig",
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=64,
        ),
        "BertForMaskedLM",
        "encoder",
        STATIC_KERNELS,
    ),
    "roberta": ZooModel(
        config(
            "RobertaConfig",
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=64,
            pad_token_id=1,
        ),
        "RobertaForMaskedLM",
        "encoder",
    ),
    "t5": ZooModel(
        config(
            "T5Config",
            vocab_size=VOCAB,
            d_model=32,
            d_kv=8,
            d_ff=64,
            num_layers=2,
            num_decoder_layers=2,
            num_heads=4,
            decoder_start_token_id=0,
            **TOKENS,
        ),
        "T5ForConditionalGeneration",
        "seq2seq",
    ),
    "bart": ZooModel(
        config(
            "BartConfig",
            vocab_size=VOCAB,
            d_model=32,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            max_position_embeddings=64,
            decoder_start_token_id=2,
            **TOKENS,
        ),
        "BartForConditionalGeneration",
        "seq2seq",
    ),
    "vit": ZooModel(
        config(
            "ViTConfig",
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            image_size=IMAGE_SIZE,
            patch_size=4,
            num_labels=10,
        ),
        "ViTForImageClassification",
        "vision",
        STATIC_KERNELS,
    ),
    # Convolutional networks: a stem and two or three stages of 8 to 64 channels.
    "resnet": vision(
        "ResNet",
        32,
        dynamic=True,
        embedding_size=16,
        hidden_sizes=[32, 64],
        depths=[1, 1],
        layer_type="bottleneck",
    ),
    "convnext": vision(
        "ConvNext", 32, dynamic=True, num_stages=2, hidden_sizes=[16, 32], depths=[1, 1]
    ),
    "convnextv2": vision("ConvNextV2", 32, num_stages=2, hidden_sizes=[16, 32], depths=[1, 1]),
    "regnet": vision(
        "RegNet", 32, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], groups_width=8
    ),
    "mobilenet_v2": vision("MobileNetV2", 32, depth_multiplier=0.25, finegrained_output=False),
    "efficientnet": vision(
        "EfficientNet",
        32,
        width_coefficient=0.25,
        depth_coefficient=1.0,
        kernel_sizes=[3, 5],
        in_channels=[32, 16],
        out_channels=[16, 24],
        strides=[1, 2],
        num_block_repeats=[1, 2],
        expand_ratios=[1, 6],
        hidden_dim=320,  # the top convolution's width: 1280 x width_coefficient
    ),
    "poolformer": vision(
        "PoolFormer",
        32,
        num_encoder_blocks=2,
        depths=[1, 1],
        hidden_sizes=[16, 32],
        patch_sizes=[7, 3],
        strides=[4, 2],
        padding=[2, 1],
    ),
    # Attention over patches or windows, some with convolutions around it.
    "swin": vision(
        "Swin",
        32,
        patch_size=4,
        embed_dim=16,
        depths=[2, 1],  # the second block of the first stage shifts its windows (masked)
        num_heads=[2, 4],
        window_size=4,
    ),
    "levit": vision(
        "Levit",
        64,  # its stem downsamples 16 times: 4x4 tokens, then 2x2 and 1x1
        hidden_sizes=[32, 48, 64],
        num_attention_heads=[2, 3, 4],
        depths=[1, 1, 1],
        key_dim=[8, 8, 8],
        mlp_ratio=[2, 2, 2],
        attention_ratio=[2, 2, 2],
    ),
    "mobilevit": vision(
        "MobileViT",
        64,  # 32 times downsampled at the end: 2x2 patches still fit
        hidden_sizes=[16, 24, 32],
        neck_hidden_sizes=[8, 8, 16, 16, 16, 24, 48],
        num_attention_heads=2,
    ),
    "deit": vision("DeiT", IMAGE_SIZE, dynamic=True, **TINY_VIT, intermediate_size=64),
    "beit": vision(
        "Beit", IMAGE_SIZE, **TINY_VIT, intermediate_size=64, use_relative_position_bias=True
    ),
    "dinov2": vision("Dinov2", IMAGE_SIZE, **TINY_VIT, mlp_ratio=2),
}
