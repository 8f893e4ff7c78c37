"""``npugraph-ex bench --model NAME|PATH --dtype --attn``: which model runs, in which dtype, with
which attention, and what the report and the record say about it.

The runs are one-token forwards of the micro preset, four steps, one repeat: a few seconds each.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from npugraph_ex.bench.models import ModelSource, build_model, model_source
from npugraph_ex.bench.precision import PRECISIONS
from npugraph_ex.bench.presets import build_qwen3
from npugraph_ex.cli import main

STEPS = 4


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The micro preset (seed 0, float32) saved as a Hugging Face checkpoint folder."""
    pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("micro-checkpoint")
    build_qwen3("micro", seed=0).save_pretrained(folder)
    return folder


def bench(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], *flags: str, variant: str = "npugraph_ex"
) -> tuple[dict, str]:
    """One run of the token workload, eager against ``variant`` (the default: the kernel tier,
    which settles before it is timed; ``npugraph_ex+aten`` where only the model matters): its
    JSON record and stdout."""
    pytest.importorskip("transformers")
    out = tmp_path / "bench.json"
    argv = ["bench", "--workloads", "token", "--variants", f"eager,{variant}", "--repeats", "1"]
    argv += ["--steps", str(STEPS), "--no-plot", "--out", str(out), *flags]
    if "--model" not in flags:
        argv += ["--model", "micro"]
    assert main(argv) == 0
    return json.loads(out.read_text()), capsys.readouterr().out


def npugraph_ex_figures(record: dict, variant: str = "npugraph_ex") -> dict:
    return record["workloads"]["token"]["variants"][variant]


ATEN = "npugraph_ex+aten"
"""The variant of the tests that check what reaches the model: no compile to settle."""


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_runs_every_variant_in_it_and_says_so(
    dtype: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record, stdout = bench(tmp_path, capsys, "--dtype", dtype)
    assert record["model"]["dtype"] == dtype
    assert record["settings"]["dtype"] == dtype
    figures = npugraph_ex_figures(record)
    assert "error" not in figures
    assert figures["tokens_checked"] == STEPS and figures["captured_keys"] == 1
    assert f"dtype {dtype}, sdpa attention) on cpu" in stdout
    assert f"(dynamic=False, one key); {dtype}, median of 1" in stdout
    assert f"dtype: {dtype} (eps {PRECISIONS[dtype].eps:.2g}), eager in the same dtype" in stdout
    assert "k/n agreeing is expected" in stdout


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_the_attention_implementation_reaches_the_model(
    attn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record, stdout = bench(tmp_path, capsys, "--attn", attn, variant=ATEN)
    assert record["model"]["attn_implementation"] == attn
    assert record["settings"]["attn"] == attn
    assert npugraph_ex_figures(record, ATEN)["tokens_match_eager"] is True
    assert f"dtype float32, {attn} attention) on cpu" in stdout


def test_a_saved_checkpoint_gives_the_tokens_of_the_preset_it_was_saved_from(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    preset, _ = bench(tmp_path / "preset", capsys, "--model", "micro", variant=ATEN)
    loaded, stdout = bench(tmp_path / "loaded", capsys, "--model", str(checkpoint), variant=ATEN)
    assert loaded["model"]["checkpoint"] == str(checkpoint.resolve())
    assert loaded["model"]["architecture"] == "Qwen3ForCausalLM"
    assert loaded["model"]["parameters"] == preset["model"]["parameters"]
    tokens = loaded["workloads"]["token"]["eager_tokens"]
    assert len(tokens) == STEPS and tokens == preset["workloads"]["token"]["eager_tokens"]
    assert npugraph_ex_figures(loaded, ATEN)["tokens_match_eager"] is True
    assert f"model: Qwen3ForCausalLM from {checkpoint} (2 layers" in stdout
    assert "the checkpoint's weights" in stdout


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_preset_and_its_checkpoint_compute_the_same_logits(checkpoint: Path, dtype: str) -> None:
    """A preset's parameters are cast as from_pretrained(dtype=...) loads a checkpoint's, buffers
    left in float32; casting the whole model would round RoPE's frequencies in bfloat16 too."""
    precision = PRECISIONS[dtype]
    preset = build_model(ModelSource("micro"), precision, "sdpa", seed=0)
    loaded = build_model(ModelSource(str(checkpoint), checkpoint), precision, "sdpa", seed=0)
    ids = torch.tensor([[1, 50, 7, 300, 12, 90]])
    with torch.no_grad():
        expected = preset(input_ids=ids, use_cache=False).logits
        got = loaded(input_ids=ids, use_cache=False).logits
    assert expected.dtype == got.dtype == precision.dtype
    assert torch.equal(expected, got)
    assert preset.model.rotary_emb.inv_freq.dtype == torch.float32


def test_a_name_is_a_preset_and_a_folder_with_a_config_is_a_checkpoint(checkpoint: Path) -> None:
    assert model_source("tiny") == ModelSource("tiny")
    assert model_source(str(checkpoint)) == ModelSource(str(checkpoint), checkpoint.resolve())


def exit_message(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    return stop.value.code, capsys.readouterr().err


def test_a_missing_path_names_the_presets_and_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-such-model"
    code, err = exit_message(["bench", "--model", str(missing)], capsys)
    assert code == 2
    assert "argument --model: expected a preset (tiny, micro, qwen3-0.6b)" in err
    assert f"got '{missing}': no such file or folder" in err
    assert "save_pretrained() wrote" in err


def test_a_folder_without_config_json_says_which_file_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"")
    code, err = exit_message(["bench", "--model", str(tmp_path)], capsys)
    assert code == 2
    assert f"checkpoint folder '{tmp_path}' has no config.json" in err
    assert "save_pretrained() wrote (with config.json and the weights)" in err


@pytest.mark.parametrize(("flag", "value"), [("--dtype", "float64"), ("--attn", "flash")])
def test_a_dtype_or_attention_outside_the_choices_is_refused(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = exit_message(["bench", flag, value], capsys)
    assert code == 2
    assert f"argument {flag}: invalid choice: '{value}'" in err
