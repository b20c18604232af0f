"""causal-lm: chat rendering and loss masks, LoRA options, perplexity (units, also under transformers 4.57), and
real 2-rank trainings of the tiny Llama with LoRA (torchrun, and MPICH's mpirun)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import EXAMPLES, ROOT, free_port, job_config, run_runtime, runtime_env
from tierdeps import mpi_env

from finetune_runtime import data
from finetune_runtime.config import ConfigError, JobConfig, TaskConfig
from finetune_runtime.tasks import causal_lm as clm

INSTRUCT_CONFIG = EXAMPLES / "jobs" / "instruct-mini-config.json"
TINY_LLAMA = EXAMPLES / "models" / "tiny-llama"
COLS = clm.Columns("messages", "prompt", "response")


@pytest.fixture(scope="module")
def tok() -> Any:
    from finetune_runtime.tokenization import load_tokenizer

    return load_tokenizer(str(TINY_LLAMA))


def _supervised(enc: dict[str, Any], tok: Any) -> str:
    return str(tok.decode([t for t, lab in zip(enc["input_ids"], enc["labels"], strict=True) if lab != -100]))


# --- rendering and masks ----------------------------------------------------------------------------------


@pytest.mark.tf457
def test_chat_loss_covers_every_assistant_turn_only(tok: Any) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the opposite of hot?"},
        {"role": "assistant", "content": "The opposite of hot is cold."},
        {"role": "user", "content": "And of big?"},
        {"role": "assistant", "content": "The opposite of big is small."},
    ]
    text, spans = clm.render(messages, tok)
    assert text.startswith("<s><|system|>\nBe brief.<|end|>\n<|user|>\n")
    assert [text[s:e] for s, e in spans] == [
        "The opposite of hot is cold.<|end|>\n",
        "The opposite of big is small.<|end|>\n",
    ]
    enc = clm.tokenize_masked(text, spans, tok, 256)
    assert len(enc["labels"]) == len(enc["input_ids"]) == len(enc["attention_mask"])
    assert _supervised(enc, tok) == "The opposite of hot is cold.<|end|>\nThe opposite of big is small.<|end|>\n"
    # The eos (<|end|>) closing each answer is learnt: it is what stops generation.
    assert [t for t, lab in zip(enc["input_ids"], enc["labels"], strict=True) if lab != -100].count(
        tok.eos_token_id
    ) == 2
    assert "What is the opposite" not in _supervised(enc, tok)


@pytest.mark.tf457
def test_prompt_response_rows_use_the_template(tok: Any) -> None:
    msgs = clm.to_messages({"prompt": "What is two plus two?", "response": "Two plus two is four."}, COLS)
    text, spans = clm.render(msgs, tok)
    assert text == "<s><|user|>\nWhat is two plus two?<|end|>\n<|assistant|>\nTwo plus two is four.<|end|>\n"
    assert _supervised(clm.tokenize_masked(text, spans, tok, 256), tok) == "Two plus two is four.<|end|>\n"
    assert clm.prompt_messages(msgs) == msgs[:1]


def test_without_a_chat_template_prompt_and_response_are_plain_text(tok: Any) -> None:
    import copy

    plain = copy.copy(tok)
    plain.chat_template = None
    text, spans = clm.render([{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}], plain)
    assert text == "Hi?\nHello.<|end|>" and [text[s:e] for s, e in spans] == ["Hello.<|end|>"]
    with pytest.raises(ValueError, match="chat_template"):
        clm.render(
            [
                {"role": "system", "content": "x"},
                {"role": "user", "content": "Hi?"},
                {"role": "assistant", "content": "Hello."},
            ],
            plain,
        )
    with pytest.raises(ValueError, match="assistant turn"):
        clm.render([{"role": "user", "content": "Hi?"}], tok)


def test_truncation_keeps_masks_aligned(tok: Any) -> None:
    text, spans = clm.render(
        [{"role": "user", "content": "word " * 40}, {"role": "assistant", "content": "answer"}], tok
    )
    enc = clm.tokenize_masked(text, spans, tok, 16)
    assert len(enc["input_ids"]) == 16 and all(lab == -100 for lab in enc["labels"])  # answer truncated away


@pytest.mark.tf457
def test_dataset_build_masks_prompts_and_keeps_eval_prompts(tok: Any) -> None:
    cfg = JobConfig.from_dict(job_config(INSTRUCT_CONFIG).doc)
    assert cfg.task is not None
    raw = data.load_raw(cfg.task.dataset)
    dsets = clm.PLUGIN.build_dataset(raw, cfg.task, tok, 42, pad_to_max=False)
    assert len(dsets["train"]) == 99 and len(dsets["validation"]) == 17
    row = dsets["train"][0]
    assert row["labels"][0] == -100 and any(lab != -100 for lab in row["labels"])
    assert all(lab in (-100, t) for t, lab in zip(row["input_ids"], row["labels"], strict=True))
    prompts = list(dsets["validation_prompts"]["messages"])
    assert len(prompts) == clm.DEFAULT_PROMPTS and all(p[-1]["role"] == "user" for p in prompts)
    static = clm.PLUGIN.build_dataset(raw, cfg.task, tok, 42, pad_to_max=True)
    assert {len(r) for r in static["train"]["input_ids"]} == {cfg.task.max_length}  # XLA: one shape


def test_missing_columns_name_the_options(tok: Any) -> None:
    import datasets

    task = TaskConfig.from_dict({"type": "causal-lm", "model": str(TINY_LLAMA), "dataset": {"path": "x"}})
    raw = datasets.DatasetDict({"train": datasets.Dataset.from_list([{"text": "a"}] * 4)})
    with pytest.raises(KeyError, match="messagesColumn"):
        clm.PLUGIN.build_dataset(raw, task, tok, 1, pad_to_max=False)


# --- options and metrics ----------------------------------------------------------------------------------


@pytest.mark.tf457
def test_lora_options_parse_and_errors_name_the_key() -> None:
    def task(lora: Any) -> TaskConfig:
        return TaskConfig.from_dict({"type": "causal-lm", "model": "m", "dataset": {"path": "p"}, "lora": lora})

    assert (
        clm.LoraOptions.from_task(TaskConfig.from_dict({"type": "causal-lm", "model": "m", "dataset": {"path": "p"}}))
        is None
    )
    opts = clm.LoraOptions.from_task(task({"r": 4, "targetModules": ["q_proj"], "merge": True}))
    assert opts == clm.LoraOptions(r=4, alpha=16, dropout=0.05, target_modules=["q_proj"], merge=True)
    for bad, key in (
        ({"r": 0}, r"task\.lora\.r"),
        ({"dropout": 1.0}, r"task\.lora\.dropout"),
        ({"rank": 8}, r"task\.lora has unknown keys \['rank'\]"),
        ([8], r"task\.lora must"),
    ):
        with pytest.raises(ConfigError, match=key):
            clm.LoraOptions.from_task(task(bad))


def test_perplexity_is_exp_of_eval_loss() -> None:
    metrics: dict[str, float] = {"eval_loss": 2.0}
    clm.PerplexityCallback().on_evaluate(None, None, None, metrics=metrics)
    assert metrics["eval_perplexity"] == pytest.approx(math.exp(2.0))
    huge: dict[str, float] = {"eval_loss": 800.0}
    clm.PerplexityCallback().on_evaluate(None, None, None, metrics=huge)
    assert huge["eval_perplexity"] == math.inf


@pytest.mark.parametrize("sample", sorted(p.stem for p in (ROOT / "manifests" / "samples").glob("*-lora.yaml")))
def test_lora_samples_config_parses_in_the_runtime(sample: str) -> None:
    """What the operator writes into the pods of each LoRA sample is a config the runtime accepts."""
    from finetune_operator.admission import validate
    from finetune_operator.builders import desired

    job = validate(yaml.safe_load((ROOT / "manifests" / "samples" / f"{sample}.yaml").read_text()))
    cm = next(o for o in desired(job).objects if o["kind"] == "ConfigMap")
    cfg = JobConfig.from_dict(json.loads(cm["data"]["config.json"]))
    assert cfg.task is not None and cfg.task.type == "causal-lm"
    lora = clm.LoraOptions.from_task(cfg.task)
    assert lora is not None and lora.merge and lora.target_modules
    assert clm.Columns.of(cfg.task.dataset).messages == "messages"
    want_bf16 = not sample.startswith("cpu")  # bf16 on the accelerator and AMX profiles
    assert (cfg.training.precision == "bf16") == want_bf16


def test_adapter_checkpoint_is_complete(tmp_path: Path) -> None:
    """A LoRA run's checkpoints hold adapter weights only; they must count as resumable, not be deleted, and
    losing the adapter makes them incomplete."""
    from finetune_runtime import checkpoints

    ckpt = tmp_path / "checkpoint-7"
    ckpt.mkdir()
    (ckpt / "trainer_state.json").write_text('{"global_step": 7, "max_steps": 7}')
    (ckpt / "adapter_model.safetensors").write_bytes(b"x")
    checkpoints.mark_complete(ckpt, "u")
    assert checkpoints.newest_complete(tmp_path, "u") == ckpt and checkpoints.finished_training(ckpt)
    (ckpt / "adapter_model.safetensors").unlink()
    assert not checkpoints.is_complete(ckpt)


# --- real trainings ---------------------------------------------------------------------------------------


def _check_outputs(out: Path, done: dict[str, Any], evals: list[dict[str, Any]]) -> None:
    m = done["metrics"]
    assert set(m) >= {"loss", "perplexity"} and m["perplexity"] == pytest.approx(math.exp(m["loss"]), rel=1e-4)
    assert done["summaryMetric"] == "perplexity" and all(e["summaryMetric"] == "perplexity" for e in evals)
    # It learns: the final eval loss is well below the first epoch's.
    assert m["loss"] < evals[0]["metrics"]["loss"] - 0.5, [e["metrics"] for e in evals]
    preds = json.loads((out / "predictions.json").read_text())
    assert preds["method"].startswith("peft:") and len(preds["predictions"]) == 3
    assert all(p["generation"] for p in preds["predictions"])
    assert {p["prompt"] for p in preds["predictions"]} >= {"What is the opposite of hot?"}
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["task"] == "causal-lm" and metrics["worldSize"] == 2
    assert (out / "model" / "adapter_config.json").exists() and (out / "model" / "adapter_model.safetensors").exists()
    assert not list((out / "model").glob("model*.safetensors")), "model/ holds the adapter only"
    assert (out / "model-merged" / "config.json").exists() and (out / "base-model" / "config.json").exists()


def _adapter_generates(out: Path) -> None:
    """The adapter loads with peft (its base: base-model/, the tiny model's initial weights), changes the base
    model's outputs, equals the merged model, and generates from the chat template."""
    import torch
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoModelForCausalLM

    from finetune_runtime.tokenization import load_tokenizer

    tok = load_tokenizer(str(out / "model"))
    peft_model = AutoPeftModelForCausalLM.from_pretrained(str(out / "model")).eval()
    base = AutoModelForCausalLM.from_pretrained(str(out / "base-model")).eval()
    merged = AutoModelForCausalLM.from_pretrained(str(out / "model-merged")).eval()
    text = tok.apply_chat_template(
        [{"role": "user", "content": "What is the opposite of big?"}], tokenize=False, add_generation_prompt=True
    )
    ids = tok(text, add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        adapted, plain, fused = (m(**ids).logits for m in (peft_model, base, merged))
        gen = peft_model.generate(**ids, max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id)
    assert not torch.allclose(adapted, plain, atol=1e-3), "the adapter changes nothing"
    assert torch.allclose(adapted, fused, atol=1e-4), "model-merged/ is not base + adapter"
    assert gen.shape[1] > ids["input_ids"].shape[1]
    assert tok.decode(gen[0][ids["input_ids"].shape[1] :], skip_special_tokens=True).strip()


@pytest.mark.slow
@pytest.mark.tf457
def test_lora_torchrun_two_ranks_saves_an_adapter_that_generates(tmp_path: Path) -> None:
    cfg = job_config(INSTRUCT_CONFIG).write(tmp_path / "config.json")
    env = runtime_env(tmp_path, cfg)
    run = run_runtime(["launch"], env, tmp_path)
    assert run.rc == 0, run.out[-4000:]
    assert "rank 0 of 2 (torchrun)" in run.out and "LoRA r=16 alpha=32" in run.out
    _check_outputs(run.output_dir, run.done, run.events("eval"))
    _adapter_generates(run.output_dir)

    # A restart after the last checkpoint rebuilds base + adapter from the checkpoint and redoes the final steps.
    again = run_runtime(["launch"], {**env, "FTJOB_MASTER_PORT": str(free_port())}, tmp_path)
    assert again.rc == 0, again.out[-4000:]
    assert "training had finished" in again.out and not again.events("train")
    assert again.done["metrics"]["loss"] == pytest.approx(run.done["metrics"]["loss"], rel=1e-4)


@pytest.mark.slow
def test_lora_mpich_two_ranks(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    cfg = job_config(INSTRUCT_CONFIG).training(epochs=2, logEverySteps=2).write(tmp_path / "config.json")
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost:2\n")
    (tmp_path / "home").mkdir()
    env = runtime_env(
        tmp_path,
        cfg,
        FTJOB_LAUNCHER="mpi",
        **mpi_env(request, "mpich"),
        FTJOB_HOSTFILE=str(hostfile),
        FTJOB_WORLD_SIZE="2",
        FTJOB_MPI_SLOTS_PER_NODE="2",
        FTJOB_SSH_SECRET_DIR=str(tmp_path / "no-secret"),
        HOME=str(tmp_path / "home"),
    )
    run = run_runtime(["mpirun"], env, tmp_path)
    assert run.rc == 0, run.out[-4000:]
    assert "rank 0 of 2 (hydra)" in run.out
    assert run.done["step"] == 14 and set(run.done["metrics"]) >= {"loss", "perplexity"}
    assert (run.output_dir / "model" / "adapter_model.safetensors").exists()
    assert len(json.loads((run.output_dir / "predictions.json").read_text())["predictions"]) == 3
