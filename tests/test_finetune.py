"""minirope-finetune: plain text, one bundled play, JSONL prompt/completion; full, LoRA merged, LoRA adapter."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from minirope import MiniRopeForCausalLM
from minirope.commands import finetune
from minirope.data.supervised import load_prompt_completion, prompt_completion_examples
from minirope.training.arguments import LORA_TARGETS
from minirope.training.heap import malloc_trim
from minirope.training.metrics import IGNORE_INDEX

FAST = ["--num_train_epochs", "2", "--per_device_train_batch_size", "4", "--torch_compile", "False",
        "--max_train_samples", "24", "--max_eval_samples", "8", "--learning_rate", "3e-3"]  # fmt: skip


def finetune_run(base, output_dir, *extra):
    return finetune.run(["--model_name_or_path", str(base), "--output_dir", str(output_dir), *FAST, *extra])


def test_full_finetune_on_a_play_lowers_the_held_out_loss(tiny_pretrained, tmp_path):
    result = finetune_run(tiny_pretrained, tmp_path, "--play", "the-tempest")
    assert result["after"]["eval_nats_per_token"] < result["before"]["eval_nats_per_token"]
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert isinstance(model, MiniRopeForCausalLM)
    card = (tmp_path / "README.md").read_text()
    assert "library_name: transformers" in card and "bits_per_byte" in card
    # a local base is named in the text; the metadata's base_model is for Hub ids (tests/test_hub.py)
    assert "base_model:" not in card and f"Fine-tuned from `{tiny_pretrained}`" in card
    summary = json.loads((tmp_path / "run_summary.json").read_text())
    assert (
        summary["method"] == "full" and summary["after"]["eval_bits_per_byte"] < summary["before"]["eval_bits_per_byte"]
    )


def test_lora_merged_and_adapter_only(tiny_pretrained, tmp_path, capsys, monkeypatch):
    """Also: the heap trimmed or not, and activation checkpointing sized on for a model above `RELEASED_SIZE` (here
    0), train alike; a checkpointed step runs each layer's forward twice."""
    from minirope.modeling_minirope import MiniRopeAttention

    trimmed, sized = "heap's freed pages handed back to the system every 1 s", "activation checkpointing: on, sized"
    forwards, attention = [], MiniRopeAttention.forward
    monkeypatch.setattr(MiniRopeAttention, "forward", lambda *a, **k: forwards.append(1) or attention(*a, **k))
    merged = finetune_run(tiny_pretrained, tmp_path / "merged", "--play", "the-tempest", "--lora")
    out, plain = capsys.readouterr().out, len(forwards)
    assert (trimmed in out) == (malloc_trim() is not None) and sized not in out
    monkeypatch.setattr("minirope.training.sizing.RELEASED_SIZE", 0)
    monkeypatch.setenv("MINIROPE_HEAP_TRIM_SECONDS", "0")  # never
    adapter = finetune_run(
        tiny_pretrained, tmp_path / "adapter", "--play", "the-tempest", "--use_peft", "--merge_lora", "False",
    )  # fmt: skip
    out = capsys.readouterr().out
    assert trimmed not in out and sized in out
    assert len(forwards) - plain > plain  # the training steps' layers ran again in the backward pass
    assert merged["after"]["eval_nats_per_token"] < merged["before"]["eval_nats_per_token"]
    # the same training (the heap trimmed or not, checkpointed or not); only what is saved differs
    assert adapter["after"]["eval_nats_per_token"] == pytest.approx(merged["after"]["eval_nats_per_token"], rel=1e-5)
    assert (tmp_path / "merged" / "model.safetensors").is_file()
    assert not (tmp_path / "merged" / "adapter_config.json").exists()
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    assert not (tmp_path / "adapter" / "model.safetensors").exists()
    # the merged model's weights give the adapted model's loss (same seed, same data: same training)
    from peft import AutoPeftModelForCausalLM

    peft_model = AutoPeftModelForCausalLM.from_pretrained(tmp_path / "adapter").eval()
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    input_ids = AutoTokenizer.from_pretrained(tmp_path / "merged")("ROMEO:\nO", return_tensors="pt").input_ids
    with torch.no_grad():
        torch.testing.assert_close(plain(input_ids).logits, peft_model(input_ids).logits, rtol=0, atol=1e-4)


def test_lora_takes_trls_flags_and_still_reads_the_old_ones(tiny_pretrained, capsys):
    """`--use_peft` and a list of `--lora_target_modules`, as minirope-posttrain (TRL's `ModelConfig`) takes them;
    `--lora` and `q_proj,v_proj` read the same, with one line naming the new form; `--model_revision` and the old
    `--revision` name one flag."""
    model = ["--model_name_or_path", str(tiny_pretrained)]
    new = finetune.parse_args([*model, "--use_peft", "--lora_target_modules", "q_proj", "v_proj",
                               "--model_revision", "v1"])  # fmt: skip
    old = finetune.parse_args([*model, "--lora", "--lora_target_modules", "q_proj,v_proj", "--revision", "v1"])
    for parsed in (new, old):
        assert parsed[1].use_peft and parsed[1].lora_target_modules == ["q_proj", "v_proj"]
        assert parsed[0].model_revision == "v1"
    default = finetune.parse_args(model)[1]
    assert not default.use_peft and default.lora_target_modules == list(LORA_TARGETS)
    finetune.note_old_names(["--use_peft", "--lora_target_modules", "q_proj", "v_proj"])
    assert capsys.readouterr().out == ""
    finetune.note_old_names(["--lora", "--lora_target_modules", "q_proj,v_proj"])
    line = capsys.readouterr().out
    assert "--lora is --use_peft" in line and "--lora_target_modules q_proj v_proj" in line


def test_prompt_completion_trains_on_completions_only(tiny_pretrained, tmp_path):
    rows = [{"prompt": f"Q: who speaks {i}?\nA:", "completion": " ROMEO speaks.\n"} for i in range(12)]
    for name in ("train.jsonl", "valid.jsonl"):
        (tmp_path / name).write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    args = finetune.parse_args(
        ["--model_name_or_path", str(tiny_pretrained), "--train_file", str(tmp_path / "train.jsonl"),
         "--validation_file", str(tmp_path / "valid.jsonl"), "--block_size", "32"]
    )  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(tiny_pretrained)
    data_args = args[2]
    raw = load_prompt_completion(data_args.train_file, data_args.validation_file)
    train, _ = prompt_completion_examples(raw, tokenizer, data_args)
    row = train[0]
    prompt_length = len(tokenizer(rows[0]["prompt"], add_special_tokens=False).input_ids)
    assert row["labels"][:prompt_length] == [IGNORE_INDEX] * prompt_length
    assert row["labels"][prompt_length:] == row["input_ids"][prompt_length:]
    assert row["input_ids"][-1] == tokenizer.eos_token_id

    result = finetune_run(
        tiny_pretrained, tmp_path / "out", "--train_file", str(tmp_path / "train.jsonl"),
        "--validation_file", str(tmp_path / "valid.jsonl"),
    )  # fmt: skip
    assert result["after"]["eval_nats_per_token"] < result["before"]["eval_nats_per_token"]


@pytest.mark.parametrize(
    ("line", "message"),
    [("not json", "is not JSON"), ('{"prompt": "a"}', "'prompt' and 'completion'")],
)
def test_bad_jsonl_rows_are_named(tmp_path, line, message):
    (tmp_path / "t.jsonl").write_text('{"prompt": "a", "completion": "b"}\n' + line + "\n")
    with pytest.raises(ValueError, match=message) as error:
        load_prompt_completion([str(tmp_path / "t.jsonl")], [str(tmp_path / "t.jsonl")])
    assert "line 2" in str(error.value)


def held_out_split(tiny_pretrained, tmp_path, name: str, text: str, *extra):
    (tmp_path / name).write_text(text)
    args = finetune.parse_args(
        ["--model_name_or_path", str(tiny_pretrained), "--train_file", str(tmp_path / name), "--block_size", "32",
         *extra]
    )  # fmt: skip
    data_args = args[2]
    kind, dataset = finetune.data_kind_and_dataset(data_args)
    tokenizer = AutoTokenizer.from_pretrained(tiny_pretrained)
    train, validation, _ = finetune.datasets_and_collator(data_args, kind, dataset, tokenizer, seed=0)
    return [tuple(row) for row in train["input_ids"]], [tuple(row) for row in validation["input_ids"]]


def test_without_a_validation_file_the_first_rows_are_held_out_and_never_trained_on(tiny_pretrained, tmp_path):
    """run_clm's --validation_split_percentage: the first 5 % (10 % here) of the rows are the validation set."""
    rows = [{"prompt": f"Q: who speaks {i}?\nA:", "completion": f" ROMEO, {i} times.\n"} for i in range(40)]
    train, validation = held_out_split(
        tiny_pretrained, tmp_path, "pairs.jsonl", "".join(json.dumps(row) + "\n" for row in rows),
        "--validation_split_percentage", "10",
    )  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(tiny_pretrained)
    first = tokenizer(rows[0]["prompt"] + rows[0]["completion"], add_special_tokens=False)["input_ids"]
    assert len(validation) == 4 and len(train) == 36 and not set(validation) & set(train)
    assert list(validation[0][: len(first)]) == first  # the first rows, as run_clm's train[:N%]
    text = "".join(f"ROMEO:\nSpeech number {i}, of a line or two.\n\n" for i in range(200))
    train, validation = held_out_split(tiny_pretrained, tmp_path, "play.txt", text)  # blocks of 32 tokens
    assert len(validation) == round(0.05 * (len(train) + len(validation))) >= 1
    assert not set(validation) & set(train) and all(len(block) == 32 for block in validation)


def test_conversations_are_held_out_by_conversation():
    from datasets import Dataset, DatasetDict

    conversations = [
        [{"role": "user", "content": f"Who {i}?"}, {"role": "assistant", "content": "I."}] for i in range(30)
    ]
    raw = DatasetDict({"train": Dataset.from_list([{"messages": m} for m in conversations])})
    args = finetune.parse_args(["--model_name_or_path", "x", "--train_file", "c.jsonl"])[2]
    split = finetune.held_out(raw, args, "conversations")
    assert [row["messages"] for row in split["validation"]] == conversations[:2]  # round(5 % of 30) = 2
    assert [row["messages"] for row in split["train"]] == conversations[2:]


def test_a_text_file_alone_fine_tunes_with_a_held_out_validation_loss(tiny_pretrained, tmp_path):
    (tmp_path / "my.txt").write_text("ROMEO:\nBut soft, what light through yonder window breaks?\n\n" * 80)
    result = finetune_run(tiny_pretrained, tmp_path / "out", "--train_file", str(tmp_path / "my.txt"))
    assert result["after"]["eval_nats_per_token"] < result["before"]["eval_nats_per_token"]
    assert json.loads((tmp_path / "out" / "eval_results.json").read_text())["eval_nats_per_token"] > 0


@pytest.mark.parametrize("given", [[], ["--activation_checkpointing", "False"], ["--gradient_checkpointing", "False"]])
def test_activation_checkpointing_is_sized_from_the_model_unless_given(given, tmp_path, monkeypatch):
    from minirope.training.sizing import CHECKPOINTING, RELEASED_SIZE, sized_checkpointing

    if given and given[0][2:] not in finetune.FinetuningArguments.__dataclass_fields__:
        pytest.skip(f"{given[0]} is not a flag of this transformers")
    *_, args = finetune.parse_args(["--model_name_or_path", "any", "--output_dir", str(tmp_path), *given])
    line = sized_checkpointing(args, RELEASED_SIZE)
    assert line is None and not getattr(args, CHECKPOINTING)  # a model this size: nothing changes
    line = sized_checkpointing(args, 134_515_008)
    assert (line is None) == bool(given) and getattr(args, CHECKPOINTING) == (not given)
    if not given:
        assert "134.5M parameters" in line and f"--{CHECKPOINTING} False" in line
