"""The model zoo: Hugging Face transformers architectures from tiny configs with random weights.

``ZOO`` maps a name to how to build the model (a config, never a download) and what kind it is:
``decoder`` (a causal LM), ``encoder`` (masked LM over a padded batch), ``seq2seq`` (encoder and
decoder over given decoder ids) or ``vision`` (image classification). ``check_forward`` and
``check_generate`` run one model eagerly and under npugraph_ex and return what happened: the
outputs of both, the largest difference and the capture counters of the compiled calls; for the
table, ``check_forward`` also times eager calls against replays.
``tests/e2e/test_zoo.py`` asserts on those results; run as a script, this module writes the
table of ``docs/zoo.md``::

    PYTHONPATH=src:tests python tests/zoo_models.py --out docs/zoo.md
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import npugraph_ex
from helpers import counts
from models import seeded
from npugraph_ex.bench.decode import cache_keyword
from npugraph_ex.bench.environment import environment, environment_line
from npugraph_ex.bench.tables import format_table

VOCAB = 128
BATCH, SEQ, DECODER_SEQ = 2, 8, 5
PROMPT_LEN = 5
NEW_TOKENS = 6
MAX_CACHE_LEN = 32
IMAGE_SIZE = 16
CALLS = 3
"""Forward calls per check, each with new inputs of one shape: one capture, then replays."""
DYNAMIC_BATCHES = (BATCH, BATCH + 1, BATCH, BATCH + 1)
"""Batch sizes of the ``dynamic=True`` forward check: one graph, a key per size, then replays
(not 1, which Dynamo specialises into a graph of its own)."""
TIMED_CALLS = 21
"""Eager calls and replays, interleaved, whose medians the table reports."""
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
    """npugraph_ex options of the forward check beyond the defaults."""
    fallbacks: dict[str, str] = field(default_factory=dict)
    """Check name -> why one of its graphs runs eagerly (a host sync in the model's own code)."""
    image_size: int = IMAGE_SIZE
    """Side of the square images a ``vision`` model is given."""
    dynamic: bool = False
    """Also checked compiled with ``dynamic=True`` over the batch sizes of ``DYNAMIC_BATCHES``."""

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


def forward_inputs(entry: ZooModel, seed: int, batch: int = BATCH) -> dict[str, Any]:
    """One call's keyword arguments for ``entry``; ``seed`` changes values, not shapes."""
    generator = torch.Generator().manual_seed(seed)
    if entry.kind == "vision":
        size = entry.image_size
        return {"pixel_values": torch.randn(batch, 3, size, size, generator=generator)}
    ids = torch.randint(3, VOCAB, (batch, SEQ), generator=generator)
    if entry.kind == "decoder":
        return {"input_ids": ids, "use_cache": False}
    # The second row is padded: the attention mask takes part in the graph.
    mask = torch.ones(batch, SEQ, dtype=torch.long)
    mask[1, SEQ - 3 :] = 0
    if entry.kind == "encoder":
        return {"input_ids": ids, "attention_mask": mask}
    decoder_ids = torch.randint(3, VOCAB, (batch, DECODER_SEQ), generator=generator)
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "decoder_input_ids": decoder_ids,
        "use_cache": False,
    }


@dataclass
class Check:
    """The outcome of one check: compiled and eager outputs and the counters, call by call."""

    compiled: list[torch.Tensor]
    eager: list[torch.Tensor]
    per_call: list[Counter[str]]
    seconds: tuple[float, float] | None = None
    """Median seconds of an eager call and of a replay, when the check was timed."""

    @property
    def counters(self) -> Counter[str]:
        return sum(self.per_call, Counter())

    @property
    def max_abs_diff(self) -> float:
        return max(
            float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
            for a, b in zip(self.compiled, self.eager, strict=True)
        )

    @property
    def equal(self) -> bool:
        return all(torch.equal(a, b) for a, b in zip(self.compiled, self.eager, strict=True))


@torch.no_grad()
def check_forward(
    entry: ZooModel,
    options: dict[str, Any] | None = None,
    reference: str = "eager",
    dynamic: bool = False,
    timed: int = 0,
) -> Check:
    """``CALLS`` forward calls of one shape, compiled with ``options`` against ``reference``.

    ``reference="eager"`` is the model itself; ``"dynamo"`` is ``backend="eager"``, Dynamo's
    graph without AOTAutograd or npugraph_ex, which a replay without fusion patterns must equal
    bit for bit. ``dynamic=True`` compiles both with ``dynamic=True`` and calls them with the
    batch sizes of ``DYNAMIC_BATCHES`` instead. ``timed`` > 0 then times that many eager calls
    and replays of the last inputs (``time_replays``).
    """
    model = entry.build()
    compiled_model = torch.compile(
        model,
        backend="npugraph_ex",
        fullgraph=True,
        dynamic=dynamic or None,
        options=dict(options or {}),
    )
    reference_model = (
        model
        if reference == "eager"
        else torch.compile(model, backend="eager", dynamic=dynamic or None)
    )
    batches = DYNAMIC_BATCHES if dynamic else (BATCH,) * CALLS
    inputs = [forward_inputs(entry, seed, batch) for seed, batch in enumerate(batches)]
    expected = [reference_model(**call).logits.clone() for call in inputs]
    got, per_call = [], []
    for call in inputs:
        before = counts()
        # A replay returns the graph's own memory: clone what must outlive the next call.
        got.append(compiled_model(**call).logits.clone())
        per_call.append(counts() - before)
    seconds = time_replays(model, compiled_model, inputs[-1], timed) if timed else None
    return Check(got, expected, per_call, seconds)


def time_replays(
    model: torch.nn.Module, compiled_model: Any, call: dict[str, Any], repeats: int
) -> tuple[float, float]:
    """Median wall-clock seconds of ``repeats`` eager calls and ``repeats`` replays of ``call``,
    interleaved so that both see the same load on the machine."""
    eager, replay = [], []
    before = counts()
    for _ in range(repeats):
        for run, times in ((model, eager), (compiled_model, replay)):
            start = time.perf_counter()
            run(**call)
            times.append(time.perf_counter() - start)
    ran = counts() - before
    if ran != Counter(replays=repeats):
        raise RuntimeError(f"expected {repeats} timed replays, the compiled calls did {dict(ran)}")
    return statistics.median(eager), statistics.median(replay)


@contextlib.contextmanager
def compiled_forward(model: torch.nn.Module, dynamic: bool | None) -> Iterator[None]:
    """``model.forward`` compiled with npugraph_ex inside the block, the way transformers documents
    ``torch.compile`` for ``generate()``; the class's own forward again after it."""
    model.forward = torch.compile(
        model.forward, backend="npugraph_ex", fullgraph=True, dynamic=dynamic
    )
    try:
        yield
    finally:
        del model.forward


def prompts(seed: int = 0) -> list[torch.Tensor]:
    """Two prompts of one length: the second generation replays what the first captured."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (1, PROMPT_LEN), generator=generator) for _ in range(2)]


GREEDY = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
"""Greedy and always ``NEW_TOKENS`` long: an end-of-sequence token cannot end a run early."""


@torch.no_grad()
def check_generate(entry: ZooModel, cache: str) -> Check:
    """Greedy ``generate()`` of two prompts with the forward compiled, against eager.

    ``cache="dynamic"``: transformers' default cache (a ``DynamicCache``, or for encoder-decoders
    an ``EncoderDecoderCache`` of two), a new one per call, growing by a token per step; compiled
    with ``dynamic=True``, so that one graph serves every cache length (without it, Dynamo first
    traces the first step for its static shapes, and the second call's first step then goes to
    the dynamic graph, a capture more). ``cache="static"``: one ``StaticCache`` the caller keeps
    and resets between calls, passed under the keyword the installed transformers asks for, so
    its tensors keep their addresses and the second call replays the prefill and every step.
    """
    import transformers

    model = entry.build()
    if cache == "static":
        expected = [model.generate(p, **GREEDY, cache_implementation="static") for p in prompts()]
        keep = transformers.StaticCache(config=model.config, max_cache_len=MAX_CACHE_LEN)
        settings = {cache_keyword(model): keep}
        # Its layers allocate their tensors on first use; one eager call does that up front, so
        # that every prefill sees an initialised cache (Dynamo guards on it: a prefill over a
        # fresh cache and one over a reset cache are two graphs).
        model(input_ids=prompts()[0], **settings)
    else:
        expected = [model.generate(p, **GREEDY) for p in prompts()]
        keep, settings = None, {}
    got, per_call = [], []
    with compiled_forward(model, dynamic=True if cache == "dynamic" else None):
        for prompt in prompts():
            if keep is not None:
                keep.reset()  # zeroed in place: the KV tensors keep their addresses
            before = counts()
            got.append(model.generate(prompt, **GREEDY, **settings))
            per_call.append(counts() - before)
    return Check(got, expected, per_call)


CHECKS: dict[str, Callable[[ZooModel], Check]] = {
    "forward": lambda entry: check_forward(entry, timed=TIMED_CALLS),
    "forward, dynamic=True": lambda entry: check_forward(entry, dynamic=True, timed=TIMED_CALLS),
    "generate, default cache": lambda entry: check_generate(entry, "dynamic"),
    "generate, StaticCache": lambda entry: check_generate(entry, "static"),
    "forward, static kernels": lambda entry: check_forward(entry, entry.options, timed=TIMED_CALLS),
}


def checks_of(entry: ZooModel) -> list[str]:
    """The checks that apply to ``entry``, in table order."""
    names = ["forward"]
    if entry.dynamic:
        names.append("forward, dynamic=True")
    if entry.kind in ("decoder", "seq2seq"):
        names.append("generate, default cache")
    if entry.kind == "decoder":
        names.append("generate, StaticCache")
    if entry.options:
        names.append("forward, static kernels")
    return names


def verdict(name: str, check: Check) -> str:
    """Equal to eager: tokens for generation; bit for bit, or within float tolerance, for logits."""
    if check.equal:
        return "yes (bit for bit)" if name.startswith("forward") else "yes (tokens)"
    if name.startswith("forward"):
        close = all(
            torch.allclose(a, b, rtol=1.3e-6, atol=1e-5)
            for a, b in zip(check.compiled, check.eager, strict=True)
        )
        return "yes (within 1e-5)" if close else "NO"
    return "NO"


def why(counters: Counter[str], prefix: str) -> str:
    reasons = [
        f"{key[len(prefix) :]} x{n}" for key, n in counters.items() if key.startswith(prefix)
    ]
    return ", ".join(reasons) or "none"


def table_rows(names: list[str]) -> list[list[Any]]:
    """One row per model and check; a check that raises keeps its row, with its error."""
    rows = []
    for name in names:
        entry = ZOO[name]
        for check_name in checks_of(entry):
            torch._dynamo.reset()
            npugraph_ex.reset_stats()
            print(f"{name}: {check_name} ...", file=sys.stderr, flush=True)
            head = [name, entry.model_class, check_name]
            try:
                check = CHECKS[check_name](entry)
            except Exception as error:  # any failure: the table reports it
                message = f"error: {type(error).__name__}: {str(error).splitlines()[0][:80]}"
                rows.append(head + ["-", "-", "-", message, "-", "NO", "-"])
                continue
            counters = check.counters
            rows.append(
                head
                + [
                    counters["captures"],
                    counters["replays"],
                    why(counters, "recapture:"),
                    why(counters, "eager:"),
                    f"{check.max_abs_diff:.3g}",
                    verdict(check_name, check),
                    timing(check),
                ]
            )
    return rows


def timing(check: Check) -> str:
    """``eager / replay`` medians in milliseconds and how many times faster the replay is."""
    if check.seconds is None:
        return "-"
    eager, replay = check.seconds
    return f"{eager * 1e3:.2f} / {replay * 1e3:.2f} (x{eager / replay:.2f})"


HEADERS = (
    "model",
    "class",
    "check",
    "keys captured",
    "replays",
    "recaptures (why)",
    "eager fallbacks (why)",
    "max abs diff",
    "equal to eager",
    "eager / replay, ms",
)

PREAMBLE = """# Model zoo

Hugging Face transformers architectures built from tiny configs (text: hidden size 32, two
layers, a vocabulary of {vocab}; images: two or three narrow stages, MobileNetV2's 17 blocks at a
quarter of their width, or two transformer layers of width 32, and 10 labels) with random weights,
compiled with `backend="npugraph_ex"` and default options, and compared with eager. The image
models' BatchNorm layers get what training would give them: scale 1, shift 0 and the statistics
of a batch of {calibration} random images (a fresh layer does not normalise, and with random
weights the logits of MobileNetV2 and MobileViT would shrink to 1e-26 and 0). Checks:

- **forward**: {calls} calls of one shape with new inputs each (batch {batch}, {seq} tokens; the
  encoders' second row padded; {decoder_seq} decoder tokens for the encoder-decoders; for the
  image models, images of {images}): one key captured, then replays.
- **forward, dynamic=True**: the forward check compiled with `dynamic=True` (and compared with
  eager) over batches of {dynamic_batches}: one graph, a key per batch size, then replays.
- **generate, default cache**: greedy `generate()` ({new} new tokens) of two prompts of {prompt}
  tokens, with `model.forward` compiled (`fullgraph=True, dynamic=True`) and transformers' default
  cache, new per call. Each step is a new cache length and so a key; the second prompt replays them.
- **generate, StaticCache**: the same with one `StaticCache({cache_len})` that the caller keeps
  and resets between the prompts, passed as `cache=` (the name transformers 5.24 asks for); the
  eager reference uses `cache_implementation="static"`.
- **forward, static kernels**: the forward check with `static_kernel_compile=True`.

Counters come from `npugraph_ex.stats()` over all of a check's calls. "Equal to eager" is
`torch.equal` of the logits (bit for bit) or of the generated tokens; `max abs diff` is over the
logits, or the token ids. The same checks are assertions in `tests/e2e/test_zoo.py`.

"Eager / replay" is measured, not asserted: after a forward check, {timed} eager calls of the model
and {timed} replays of its key on the check's last inputs, interleaved, and the median wall-clock
time of each, on the machine named below (its cores possibly shared with other work: a ratio is a
rough guide); "x1.20" means the replay took 1/1.2 of the eager time.

{fallbacks}Written by `PYTHONPATH=src:tests python tests/zoo_models.py --out docs/zoo.md`
({seconds:.0f} s).

{environment}; npugraph_ex commit {commit}.

"""


def fallback_notes(names: list[str]) -> str:
    """The expected eager fallbacks of ``names``, one paragraph each."""
    notes = [
        f"Fallback, {name} ({check}): {reason}.\n\n"
        for name in names
        for check, reason in ZOO[name].fallbacks.items()
    ]
    return "".join(notes)


def image_sizes(names: list[str]) -> str:
    """``16x16 for vit, deit; 32x32 for resnet``: the image models of ``names`` by size."""
    by_size: dict[int, list[str]] = {}
    for name in names:
        if ZOO[name].kind == "vision":
            by_size.setdefault(ZOO[name].image_size, []).append(name)
    parts = [f"{size}x{size} for {', '.join(group)}" for size, group in sorted(by_size.items())]
    return "; ".join(parts) or "none"


def write_table(out: Path, names: list[str]) -> str:
    env = environment()
    start = time.perf_counter()
    rows = table_rows(names)
    preamble = PREAMBLE.format(
        vocab=VOCAB,
        calls=CALLS,
        batch=BATCH,
        seq=SEQ,
        decoder_seq=DECODER_SEQ,
        calibration=CALIBRATION_BATCH,
        images=image_sizes(names),
        dynamic_batches=", ".join(map(str, DYNAMIC_BATCHES)),
        timed=TIMED_CALLS,
        new=NEW_TOKENS,
        prompt=PROMPT_LEN,
        cache_len=MAX_CACHE_LEN,
        seconds=time.perf_counter() - start,
        environment=environment_line(env),
        fallbacks=fallback_notes(names),
        commit=(env["npugraph_ex_commit"] or "unknown")[:12],
    )
    text = preamble + format_table(HEADERS, rows) + "\n"
    out.write_text(text)
    return text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs/zoo.md"), help="Markdown to write")
    parser.add_argument("--models", help=f"comma-separated subset of: {', '.join(ZOO)}")
    args = parser.parse_args(argv)
    names = args.models.split(",") if args.models else list(ZOO)
    unknown = sorted(set(names) - set(ZOO))
    if unknown:
        parser.error(f"unknown models {unknown}; the zoo holds {', '.join(ZOO)}")
    print(write_table(args.out, names))


if __name__ == "__main__":
    main()
