"""The model ``npugraph-ex bench`` runs: a named preset with random weights, or a local checkpoint.

``--model`` takes either a preset's name (``presets.QWEN3_MODELS``: built from its config, weights
drawn from ``--seed``, nothing downloaded) or the path of a Hugging Face checkpoint folder, as
``save_pretrained`` writes it (``config.json`` and the weights), loaded with
``AutoModelForCausalLM``: the user's own model, run as they run it. Either way the model is put in
``--dtype`` and uses ``--attn`` as its attention implementation. A preset is built in float32 and
its parameters cast as ``from_pretrained(dtype=...)`` leaves a checkpoint's (``cast_parameters``),
so a preset and a checkpoint saved from it compute the same logits in every dtype. A name wins
over a folder of the same name (``./tiny`` names the folder).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from npugraph_ex.bench.precision import Precision
from npugraph_ex.bench.presets import MIN_POSITIONS, QWEN3_MODELS, build_qwen3, parameter_count

ATTENTION = ("eager", "sdpa")
"""``--attn`` choices: transformers' ``attn_implementation`` for the model."""

DEFAULT_ATTENTION = "sdpa"
"""What transformers picks for Qwen3 when not told, so earlier figures (which did not tell it)
stay comparable."""

CONFIG_FILE = "config.json"


@dataclass(frozen=True)
class ModelSource:
    """What ``--model`` named: a preset, or a checkpoint folder (``checkpoint`` set)."""

    name: str
    """The preset's name, or the path as given."""
    checkpoint: Path | None = None

    def __str__(self) -> str:
        return self.name


def model_source(text: str) -> ModelSource:
    """An argparse type: a preset's name or a checkpoint folder holding ``config.json``."""
    if text in QWEN3_MODELS:
        return ModelSource(text)
    folder = Path(text).expanduser()
    choices = ", ".join(QWEN3_MODELS)
    if not folder.is_dir():
        found = "a file" if folder.exists() else "no such file or folder"
        raise argparse.ArgumentTypeError(
            f"expected a preset ({choices}) or a local Hugging Face checkpoint folder, got "
            f"{text!r}: {found}; pass a preset's name or the folder save_pretrained() wrote "
            f"(with {CONFIG_FILE} and the weights)"
        )
    if not (folder / CONFIG_FILE).is_file():
        raise argparse.ArgumentTypeError(
            f"checkpoint folder {text!r} has no {CONFIG_FILE}; pass the folder save_pretrained() "
            f"wrote (with {CONFIG_FILE} and the weights), or a preset ({choices})"
        )
    return ModelSource(text, folder.resolve())


def load_checkpoint(folder: Path, precision: Precision, attn: str) -> torch.nn.Module:
    """The causal LM saved in ``folder``, in ``precision`` with ``attn`` attention, eval mode."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        folder, attn_implementation=attn, dtype=precision.dtype, local_files_only=True
    )
    return model.eval()


def cast_parameters(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """``model`` with its parameters in ``dtype`` and its buffers as built.

    This is what ``from_pretrained(dtype=...)`` gives: the weights in the dtype, while what the
    model computes for itself (RoPE's ``inv_freq``) stays in float32. ``model.to(dtype)`` would
    round those frequencies too, and in half precision a preset's logits would then differ from
    those of a checkpoint saved from it (by 1e-2 in bfloat16 on the tiny preset).
    """
    for parameter in model.parameters():
        parameter.data = parameter.data.to(dtype)
    return model


def build_model(
    source: ModelSource,
    precision: Precision,
    attn: str,
    *,
    seed: int,
    device: str = "cpu",
    positions: int = MIN_POSITIONS,
) -> torch.nn.Module:
    """The model ``source`` names, in ``precision`` with ``attn`` attention, on ``device``.

    ``seed`` draws a preset's weights; a checkpoint keeps its own. ``positions`` is the least
    number of positions a preset must have room for.
    """
    if source.checkpoint is not None:
        model = load_checkpoint(source.checkpoint, precision, attn)
    else:
        built = build_qwen3(source.name, seed=seed, positions=positions, attn_implementation=attn)
        model = cast_parameters(built, precision.dtype)
    return model.to(device)


def describe_model(source: ModelSource, model: torch.nn.Module, seed: int) -> dict[str, Any]:
    """The model's source, config fields, parameter count, dtype and attention, for the report and
    the record; ``seed`` drew a preset's weights (a checkpoint's are its own)."""
    config = model.config
    if source.checkpoint is None:
        fields = dict(QWEN3_MODELS[source.name])
    else:
        fields = config.to_dict()
    return {
        "name": source.name,
        "checkpoint": str(source.checkpoint) if source.checkpoint is not None else None,
        "architecture": type(model).__name__,
        "config": fields,
        "parameters": parameter_count(model),
        "dtype": str(model.dtype).removeprefix("torch."),
        "attn_implementation": config._attn_implementation,
        "seed": seed,
    }
