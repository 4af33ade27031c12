"""Every mistake gets one clear line before any work is spent, and nothing the user has is changed.

One table of bad inputs across the commands: each must exit 1 with one line `PROG: error: ...` naming the flag
or the file, print no traceback, write nothing, and leave every input file byte for byte as it was (checksums of the
whole folder of inputs before and after). Each fails before training, so the table runs in about a minute.
"""

import hashlib
import json
import shutil
import sys
from pathlib import Path

import pytest
from conftest import TINY_RUN
from datasets import Dataset, DatasetDict
from test_bad_input import cli_error

from minirope import MiniRopeConfig
from minirope.commands import export, extend, finetune, generate, posttrain, pretrain

PLAY = "ROMEO:\nBut soft, what light through yonder window breaks?\nIt is the east, and Juliet is the sun.\n\n" * 60
TINY_EXTEND = [
    "--max_steps",
    "2",
    "--per_device_train_batch_size",
    "2",
    "--max_train_samples",
    "8",
    "--eval_document_tokens",
    "200",
    "--repeat_distances",
    "8",
    "--repeat_samples",
    "2",
]


CHAT = [{"role": "user", "content": "Who is there?"}, {"role": "assistant", "content": "Nay, answer me."}]
TOOL = {"role": "tool", "content": "42"}


@pytest.fixture(scope="module")
def world(tiny_pretrained, tmp_path_factory) -> Path:
    """The inputs the cases read: a model folder with its checkpoint, and data files good and bad."""
    root = tmp_path_factory.mktemp("world")
    shutil.copytree(tiny_pretrained, root / "model")
    files = {
        "train.txt": PLAY,
        "valid.txt": PLAY[:2000],
        "pairs.jsonl": "".join(
            json.dumps({"prompt": "Q: who?\nA:", "completion": " ROMEO.\n"}) + "\n" for _ in range(8)
        ),
        "text.jsonl": "".join(json.dumps({"text": PLAY[:500]}) + "\n" for _ in range(8)),
        "chat.jsonl": "".join(json.dumps({"messages": CHAT}) + "\n" for _ in range(8)),
        "chat-role.jsonl": json.dumps({"messages": CHAT}) + "\n" + json.dumps({"messages": [*CHAT, TOOL]}) + "\n",
        "chat-empty.jsonl": json.dumps({"messages": CHAT}) + "\n" + json.dumps({"messages": []}) + "\n",
        "chat-no-answer.jsonl": json.dumps({"messages": CHAT[:1]}) + "\n",
        "chat-one.jsonl": json.dumps({"messages": CHAT}) + "\n",
        "content.jsonl": json.dumps({"content": PLAY}) + "\n",
        "bad.jsonl": json.dumps({"text": PLAY}) + "\nnot json\n",
        "empty.txt": "",
        "x.csv": "a,b\n",
        "no-chosen.jsonl": json.dumps({"prompt": "ROMEO:\n", "chosen": "Ay.\n", "rejected": "No.\n"})
        + "\n"
        + json.dumps({"prompt": "ROMEO:\n", "rejected": "No.\n"})
        + "\n",
        "bad-args.json": '{"max_steps": 3,\n "output_dir": }\n',
        "unknown-args.json": json.dumps({"max_stepz": 3}),
        "bad.yaml": "max_steps: [3\n",
        "unknown.yaml": "max_stepz: 3\n",
        "list-args.json": "[3]",
        "list.yaml": "- max_steps: 3\n",
    }
    for name, text in files.items():
        (root / name).write_text(text, encoding="utf-8")
    (root / "latin1.txt").write_bytes(PLAY.encode() + "caf\u00e9\n".encode("latin-1"))
    (root / "model.gguf").write_bytes(b"GGUF")  # a released model as llama.cpp ships it, not yet imported
    (root / "latin1-args.json").write_bytes('{"output_dir": "caf\u00e9"}'.encode("latin-1"))
    (root / "folder").mkdir()
    rows = [{"prompt": "ROMEO:\n", "solution": "But"}] * 8
    DatasetDict({"train": Dataset.from_list(rows)}).save_to_disk(str(root / "problems"))
    DatasetDict({"train": Dataset.from_list([{"prompt": "ROMEO:\n"}] * 8)}).save_to_disk(str(root / "prompts"))
    (root / "flat_rewards.py").write_text("def zero(completions, **kwargs):\n    return [0.0] * len(completions)\n")
    (root / "broken_rewards.py").write_text("undefined_name\n\ndef exact(completions, **kwargs):\n    return [0.0]\n")
    shutil.copytree(root / "model", root / "model-other", ignore=shutil.ignore_patterns("checkpoint-*"))
    summary = json.loads((root / "model-other" / "run_summary.json").read_text())
    (root / "model-other" / "run_summary.json").write_text(json.dumps({**summary, "training_data": "my.txt"}))
    (root / "notes").mkdir()  # a user's own folder: not a run
    for name in ("ideas.md", "draft.txt", "todo.txt", "plot.png"):
        (root / "notes" / name).write_text("mine\n")
    return root


def checksums(folder: Path) -> dict[str, str]:
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
        for path in sorted(folder.rglob("*"))
    }


def run_folder(world: Path, tmp_path: Path, damage: str | None = None) -> Path:
    """A copy of the model's training folder (`checkpoint-6` inside), with one checkpoint file cut in half."""
    run = tmp_path / "run"
    shutil.copytree(world / "model", run)
    if damage:
        path = run / "checkpoint-6" / damage
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return run


def model_variant(world: Path, tmp_path: Path, change) -> Path:
    """A copy of the model folder with `change(config dict)` applied to its config.json (or to the folder)."""
    folder = tmp_path / "variant"
    shutil.copytree(world / "model", folder, ignore=shutil.ignore_patterns("checkpoint-*"))
    if callable(change):
        config = json.loads((folder / "config.json").read_text())
        change(config)
        (folder / "config.json").write_text(json.dumps(config))
    else:
        (folder / change).unlink()
    return folder


def other_vocabulary(world: Path, tmp_path: Path, _) -> Path:
    """A copy of the model folder whose tokenizer gives two tokens each other's ids (another vocabulary, same size)."""
    folder = tmp_path / "teacher"
    shutil.copytree(world / "model", folder, ignore=shutil.ignore_patterns("checkpoint-*"))
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    first, second = list(vocab)[300:302]
    vocab[first], vocab[second] = vocab[second], vocab[first]
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    return folder


def text_reward(completions, **kwargs):
    """A reward that breaks TRL's contract: text instead of numbers (imported by the table as
    test_bad_input_table.text_reward)."""
    return ["good"] * len(completions)


def none_reward(completions, **kwargs):
    """A reward that applies to no row (imported by the table as test_bad_input_table.none_reward)."""
    return [None] * len(completions)


def rope(config: dict, **values) -> None:
    config["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0, **values}


PRETRAIN, FINETUNE, EXTEND = "minirope-pretrain", "minirope-finetune", "minirope-extend"
GENERATE, EXPORT, POSTTRAIN = "minirope-generate", "minirope-export", "minirope-posttrain"
MAINS = {
    POSTTRAIN: posttrain.main,
    PRETRAIN: pretrain.main,
    FINETUNE: finetune.main,
    EXTEND: extend.main,
    GENERATE: generate.main,
    EXPORT: export.main,
}
P, F = [*TINY_RUN, "--output_dir", "{out}"], ["--model_name_or_path", "{model}", "--output_dir", "{out}"]
E, G, X = [*F, *TINY_EXTEND], ["--model", "{model}", "--prompt", "ROMEO:"], ["--model", "{model}", "--output", "{out}"]
T, V = ["--train_file", "{w}/train.txt"], ["--validation_file", "{w}/valid.txt"]
VC = ["--validation_file", "{w}/chat.jsonl"]
PLAY_DATA = ["--play", "the-tempest"]
POST = [*F, "--max_steps", "2", "--eval_prompts", "1", "--num_generations_eval", "2", "--eval_max_new_tokens", "4"]
GRPO, DPO, DISTILL = [*POST, "--method", "grpo"], [*POST, "--method", "dpo"], [*POST, "--method", "distill"]

# (command, argv, what the error line must contain); {w} is the inputs' folder, {model} its model, {out} a fresh path.
# An argv that starts with a callable builds its model or run folder first.
CASES = [
    (PRETRAIN, [*P, "--max_steps", "0"], "--max_steps must be > 0, or -1"),
    (PRETRAIN, [*P, "--max_steps", "-1", "--num_train_epochs", "0"], "--num_train_epochs must be > 0"),
    (PRETRAIN, [*P, "--sample_prompt", ""], "--sample_prompt is empty"),
    (PRETRAIN, [*P, "--sample_max_new_tokens", "-1"], "--sample_max_new_tokens must be >= 0"),
    (PRETRAIN, [*P, "--max_eval_samples", "0"], "--max_eval_samples must be >= 1"),
    (PRETRAIN, [*P, "--max_train_samples", "0"], "--max_train_samples must be >= 1"),
    (PRETRAIN, [*P, "--block_size", "1"], "--block_size must be >= 2"),
    (PRETRAIN, [*P, "--tokenizer_vocab_size", "100"], "--tokenizer_vocab_size must be > 262"),
    (PRETRAIN, [*P, "--tokenizer_sample_bytes", "0"], "--tokenizer_sample_bytes must be >= 1"),
    (PRETRAIN, [*P, "--shuffle_buffer_size", "-1"], "--shuffle_buffer_size must be >= 0"),
    (PRETRAIN, [*P, "--learning_rate", "0"], "--learning_rate must be > 0"),
    (PRETRAIN, [*P, "--learning_rate", "-0.001"], "--learning_rate must be > 0"),
    (PRETRAIN, [*P, "--per_device_train_batch_size", "0"], "--per_device_train_batch_size must be >= 1"),
    (PRETRAIN, [*P, "--gradient_accumulation_steps", "0"], "--gradient_accumulation_steps must be >= 1"),
    (PRETRAIN, [*P, "--warmup_steps", "-1"], "warmup_steps >= 0"),
    (PRETRAIN, [*P, "--seed", "-1"], "--seed must be >= 0"),
    (PRETRAIN, [*P, "--save_total_limit", "-3"], "--save_total_limit must be >= 1"),
    (PRETRAIN, [*P, "--attn_implementation", "fast"], "--attn_implementation 'fast' is not one of"),
    (PRETRAIN, [*P, "--optim_hidden", "lion"], "--optim_hidden must be adamw or muon"),
    (PRETRAIN, [*P, "--muon_momentum", "1"], "--muon_momentum must be in [0, 1)"),
    (PRETRAIN, [*P, "--optim", "adafactor"], "--optim adafactor does not combine with --optim_hidden muon"),
    (PRETRAIN, [*P, "--lr_scheduler_type", "bogus"], "bogus"),
    (PRETRAIN, [*P, "--lr_decay_ratio", "2"], "--lr_decay_ratio must be in [0, 1]"),
    (PRETRAIN, [*TINY_RUN, "--output_dir", "{w}/notes"], "--output_dir {w}/notes holds files that are not a"),
    (PRETRAIN, [*P, *T, "--validation_split_percentage", "0"], "--validation_split_percentage must be in 1..50"),
    (PRETRAIN, [*P, "--train_file", "{w}/folder", *V], "folder is a directory"),
    (PRETRAIN, [*P, "--train_file", "{w}/missing.txt", *V], "missing.txt does not exist"),
    (PRETRAIN, [*P, "--train_file", "{w}/x.csv", *V], "x.csv is not .txt, .jsonl, .json, .parquet"),
    (PRETRAIN, [*P, "--train_file", "{w}/empty.txt", *V], "empty.txt is empty"),
    (PRETRAIN, [*P, "--train_file", "{w}/latin1.txt", *V], "latin1.txt is not UTF-8 text (byte 0xe9 at offset"),
    (PRETRAIN, [*P, "--train_file", "{w}/bad.jsonl", *V], "bad.jsonl line 2 is not JSON"),
    (PRETRAIN, [*P, "--train_file", "{w}/content.jsonl", *V], "content.jsonl line 1 has no 'text' field"),
    (PRETRAIN, [*P, *T, "--validation_file", "{w}/latin1.txt"], "latin1.txt is not UTF-8 text"),
    (PRETRAIN, [*P, "--dataset_name", "{w}/no-dataset"], "--dataset_name {w}/no-dataset: no such dataset"),
    (PRETRAIN, [*P, "--dataset_name", "{w}", *T], "either --dataset_name or --train_file"),
    (PRETRAIN, [*TINY_RUN, "--output_dir", "{w}/train.txt"], "--output_dir {w}/train.txt is a file"),
    (PRETRAIN, [*TINY_RUN, "--output_dir", "{w}/train.txt/out"], "--output_dir {w}/train.txt/out cannot be written"),
    (
        PRETRAIN,
        [*TINY_RUN, "--output_dir", "{model}", "--tokenizer_name_or_path", "{model}"],
        "--output_dir {model} is --tokenizer_name_or_path",
    ),
    (PRETRAIN, [*P, "--block_size", "32", "--max_position_embeddings", "16"], "--block_size 32 is longer than"),
    (PRETRAIN, [*P, "--num_attention_heads", "3", "--num_key_value_heads", "3"], "divisible by num_attention_heads"),
    (PRETRAIN, [*P, "--rope_theta", "-1"], "rope_theta'] must be a number > 0"),
    (PRETRAIN, [*P, "--hidden_size", "0"], "hidden_size must be a positive integer"),
    (PRETRAIN, [*P, "--streaming", "True", "--max_steps", "-1", "--num_train_epochs", "1"], "--streaming needs"),
    (PRETRAIN, [*P, "--streaming", "True", "--dataloader_num_workers", "2"], "drop --dataloader_num_workers"),
    (PRETRAIN, [*P, "--streaming", "True", "--train_file", "{w}/none-*.txt"], "none-*.txt matches no file"),
    (PRETRAIN, ["{w}/bad-args.json"], "arguments file {w}/bad-args.json is not JSON (Expecting value, line 2)"),
    (PRETRAIN, ["{w}/list-args.json"], "list-args.json must hold one mapping of flag names and values (e.g. "),
    (PRETRAIN, ["{w}/no-args.json"], "arguments file {w}/no-args.json does not exist"),
    (PRETRAIN, ["{w}/latin1-args.json"], "latin1-args.json is not UTF-8 text (byte 0xe9 at offset 19"),
    (POSTTRAIN, ["{w}/latin1-args.json"], "latin1-args.json is not UTF-8 text (byte 0xe9 at offset 19"),
    (PRETRAIN, ["{w}/unknown-args.json"], "max_stepz"),
    (PRETRAIN, [*P, "--resume_from_checkpoint", "{w}/nope"], "--resume_from_checkpoint {w}/nope is not a checkpoint"),
    (PRETRAIN, [*P, "--resume_from_checkpoint", "last"], "no complete checkpoint-N folder"),
    *[
        (
            PRETRAIN,
            [
                run_folder,
                name,
                *TINY_RUN,
                "--output_dir",
                "{run}",
                "--resume_from_checkpoint",
                "{run}/checkpoint-6",
                "--max_steps",
                "8",
            ],
            f"checkpoint-6/{name} is truncated or corrupt",
        )
        for name in ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth")
    ],
    (
        PRETRAIN,
        [
            run_folder,
            None,
            *TINY_RUN,
            "--output_dir",
            "{run}",
            "--resume_from_checkpoint",
            "last",
            "--hidden_size",
            "48",
            "--intermediate_size",
            "96",
        ],
        "holds another model (hidden_size 32, this run 48)",
    ),
    (
        PRETRAIN,
        [run_folder, None, *TINY_RUN, "--output_dir", "{run}", "--resume_from_checkpoint", "last", "--max_steps", "4"],
        "is at step 6, and --max_steps is 4: nothing is left to train",
    ),
    (
        PRETRAIN,
        [
            run_folder,
            None,
            *TINY_RUN,
            "--output_dir",
            "{run}",
            "--resume_from_checkpoint",
            "last",
            "--streaming",
            "True",
            "--max_steps",
            "8",
        ],
        "holds no stream_state.json",
    ),
    (
        FINETUNE,
        ["--model_name_or_path", "{w}/none", "--output_dir", "{out}", *PLAY_DATA],
        "'{w}/none': it does not exist",
    ),
    (
        FINETUNE,
        ["--model_name_or_path", "{w}/train.txt", "--output_dir", "{out}", *PLAY_DATA],
        "train.txt': it is a file",
    ),
    (
        FINETUNE,
        ["--model_name_or_path", "{model}", "--output_dir", "{model}", *PLAY_DATA],
        "--output_dir {model} is --model_name_or_path",
    ),
    (FINETUNE, ["--model_name_or_path", "{model}", "--output_dir", "{model}/tuned", *PLAY_DATA], "is inside"),
    (FINETUNE, ["--model_name_or_path", "{model}", "--output_dir", "{w}", *PLAY_DATA], "--output_dir {w} holds"),
    (FINETUNE, [*F, "--play", "hamlett"], "--play 'hamlett' is not in the corpus"),
    (FINETUNE, [*F, *PLAY_DATA, "--heap_trim_seconds", "-1"], "MINIROPE_HEAP_TRIM_SECONDS=-1: give a number"),
    (
        FINETUNE,
        ["--model_name_or_path", "{model}", "--output_dir", "{w}/notes", *PLAY_DATA],
        "minirope run (draft.txt, ideas.md, plot.png and 1 more): choose a new or empty --output_dir",
    ),
    (FINETUNE, F, "No data: give --play NAME"),
    (FINETUNE, [*F, "--train_file", "{w}/chat-role.jsonl", *VC], "{w}/chat-role.jsonl line 2: unknown role 'tool'"),
    (FINETUNE, [*F, "--train_file", "{w}/chat-empty.jsonl", *VC], "{w}/chat-empty.jsonl line 2: 'messages' must be"),
    (FINETUNE, [*F, "--train_file", "{w}/chat-no-answer.jsonl", *VC], "chat-no-answer.jsonl line 1: no assistant turn"),
    (FINETUNE, [*F, "--train_file", "{w}/chat.jsonl", *V], "mix conversations ({w}/chat.jsonl) and text"),
    (FINETUNE, [*F, *V], "--validation_file needs a --train_file"),
    (FINETUNE, [*F, "--train_file", "{w}/chat-one.jsonl"], "--train_file has too few conversations (1) to hold"),
    (FINETUNE, [*F, *T, "--validation_split_percentage", "0"], "--validation_split_percentage must be in 1..50, got 0"),
    (
        FINETUNE,
        [*F, "--train_file", "{w}/pairs.jsonl", *V],
        "mix prompt/completion records ({w}/pairs.jsonl) and text",
    ),
    (
        FINETUNE,
        [*F, "--train_file", "{w}/content.jsonl", "--validation_file", "{w}/content.jsonl"],
        "content.jsonl has records with fields ['content']",
    ),
    (FINETUNE, [*F, *PLAY_DATA, "--lora", "True", "--lora_r", "0"], "LoRA needs --lora_r >= 1"),
    (FINETUNE, [*F, *PLAY_DATA, "--lora", "True", "--lora_target_modules", ","], "--lora_target_modules is empty"),
    (FINETUNE, [*F, *PLAY_DATA, "--block_size", "64"], "--block_size 64 is longer than the model's context 32"),
    (FINETUNE, [*F, *PLAY_DATA, "--max_eval_samples", "0"], "--max_eval_samples must be >= 1"),
    (
        FINETUNE,
        [model_variant, lambda c: c.update(num_hidden_layers=3), *F, *PLAY_DATA],
        "lack model.layers.2.input_layernorm.weight and 8 more",
    ),
    (
        FINETUNE,
        [model_variant, lambda c: c.update(vocab_size=400), *F, *PLAY_DATA],
        "lm_head.weight is (320, 32) in model.safetensors but (400, 32) by config.json",
    ),
    (FINETUNE, [model_variant, lambda c: rope(c, rope_type="linear"), *F, *PLAY_DATA], "Missing required keys"),
    (
        FINETUNE,
        [model_variant, lambda c: rope(c, rope_type="linear", factor="2"), *F, *PLAY_DATA],
        "factor field must be a float or int >= 1, got 2",
    ),
    (FINETUNE, [model_variant, lambda c: c.update(hidden_act="bogus"), *F, *PLAY_DATA], "hidden_act 'bogus'"),
    (FINETUNE, [model_variant, "tokenizer.json", *F, *PLAY_DATA], "cannot load a tokenizer"),
    (EXTEND, [*E, "--factor", "inf"], "--factor must be a finite number > 1"),
    (EXTEND, [*E, "--factor", "1"], "--factor must be > 1"),
    (EXTEND, [*E, "--rope_type", "longrope"], "--rope_type 'longrope' is not one of"),
    (EXTEND, [*E, "--repeat_distances", "0"], "--repeat_distances must be >= 1"),
    (EXTEND, [*E, "--repeat_distances", "-5"], "--repeat_distances must be >= 1"),
    (EXTEND, [*E, "--repeat_samples", "0"], "--repeat_samples must be >= 1"),
    (EXTEND, [*E, "--eval_block_sizes", "2"], "--eval_block_sizes must be >= 4"),
    (EXTEND, [*E, "--repeat_distances", "100000"], "no document has 200128 tokens"),
    (EXTEND, [*E, "--block_size", "1000"], "--block_size 1000 is beyond factor x the trained context"),
    (EXTEND, ["--model_name_or_path", "{model}", "--output_dir", "{model}", *TINY_EXTEND], "is --model_name_or_path"),
    (GENERATE, ["--model", "{model}", "--prompt", ""], "--prompt is empty"),
    (GENERATE, [*G, "--top_p", "2"], "--top_p must be in (0, 1]"),
    (GENERATE, [*G, "--top_p", "0"], "--top_p must be in (0, 1]"),
    (GENERATE, [*G, "--temperature", "0"], "--temperature must be > 0"),
    (GENERATE, [*G, "--top_k", "-1"], "--top_k must be >= 0"),
    (GENERATE, [*G, "--max_new_tokens", "0"], "--max_new_tokens must be >= 1"),
    (GENERATE, ["--model", "{w}/none", "--prompt", "x"], "cannot load a model from '{w}/none': it does not exist"),
    (EXPORT, [*X, "--format", "bogus"], "--format 'bogus' is not one of llama, gguf, onnx"),
    (EXPORT, [*X, "--format", "llama", "--outtype", "q4_k"], "--outtype q4_k is not one of f32 for --format llama"),
    (EXPORT, [*X, "--format", "gguf", "--outtype", "q4_k"], "--outtype q4_k is not one of f32, f16, q8_0, q4_0 for"),
    (EXPORT, [*X, "--format", "onnx", "--max_cache_len", "64"], "--max_cache_len applies to --format executorch"),
    (EXPORT, [*X, "--format", "executorch", "--outtype", "q4_0"], "--outtype q4_0 is not one of f32, 8da8w for"),
    (EXPORT, [*X, "--format", "executorch", "--max_cache_len", "1"], "--max_cache_len 1 leaves no room to generate"),
    (
        EXPORT,
        ["--model", "{model}", "--output", "{model}", "--format", "gguf", "--overwrite", "True"],
        "--output {model} is --model",
    ),
    (EXPORT, ["--model", "{model}", "--output", "{model}/m.gguf", "--format", "gguf"], "is inside --model"),
    (
        EXPORT,
        ["--model", "{model}", "--output", "{w}/folder", "--format", "gguf", "--overwrite", "True"],
        "--output {w}/folder is a folder, where a file is written",
    ),
    (
        EXPORT,
        ["--model", "{model}", "--output", "{w}/train.txt", "--format", "llama", "--overwrite", "True"],
        "--output {w}/train.txt is a file, where a folder is written",
    ),
    (EXPORT, ["--model", "{model}", "--output", "{w}/valid.txt", "--format", "gguf"], "valid.txt exists"),
    (EXPORT, ["--model", "{w}/none", "--output", "{out}", "--format", "llama"], "'{w}/none': it does not exist"),
    (POSTTRAIN, [*POST, "--method", "ppo"], "--method 'ppo' is not one of grpo, dpo, distill"),
    (POSTTRAIN, [*DPO, "--rejected_by", "last"], "--rejected_by 'last' is not one of sum, first_reward"),
    (POSTTRAIN, [*GRPO, "--reward_funcs", "no_such_reward"], "--reward_funcs 'no_such_reward' is not a reward"),
    (POSTTRAIN, [*GRPO, "--reward_funcs", "os.no_such_reward"], "--reward_funcs 'os.no_such_reward' is not a reward"),
    (
        POSTTRAIN,
        [*GRPO, "--reward_funcs", "trl.rewards.get_soft_overlong_punishment"],
        "get_soft_overlong_punishment takes (max_completion_len, soft_punish_cache), not a reward's keyword arguments",
    ),
    (
        POSTTRAIN,
        [*GRPO, "--reward_funcs", "test_bad_input_table.text_reward"],
        "reward text_reward returned ['good', 'good'] for 2 completions: a reward must return a list of one number",
    ),
    (POSTTRAIN, [*GRPO, "--num_generations", "1"], "--num_generations must be >= 2, got 1"),
    (POSTTRAIN, [*GRPO, "--weight_interpolation", "0"], "--weight_interpolation must be in (0, 1], got 0.0"),
    (POSTTRAIN, [*GRPO, "--lm_coef", "-1"], "--lm_coef must be >= 0"),
    (POSTTRAIN, [*DPO, "--train_file", "{w}/no-chosen.jsonl"], "no-chosen.jsonl train row 2 has no 'chosen'"),
    (POSTTRAIN, [*DPO, "--train_file", "{w}/none.jsonl"], "none.jsonl"),
    (
        POSTTRAIN,
        [*GRPO, "--train_file", "{w}/text.jsonl"],
        "text.jsonl train has no 'prompt' column (columns: ['text'])",
    ),
    (
        POSTTRAIN,
        [*GRPO, "--dataset_name", "{w}/problems", "--dataset_train_split", "training"],
        "has no split 'training' (splits: train): pass --dataset_train_split",
    ),  # fmt: skip
    (POSTTRAIN, [*GRPO, "--dataset_name", "{w}/problems"], "--method grpo trains on a reward: give --reward_funcs"),
    (
        POSTTRAIN,
        [*GRPO, "--dataset_name", "{w}/problems", "--dataset_test_split", "validation"],
        "has no split 'validation' (splits: train): pass one of them as --dataset_test_split",
    ),  # fmt: skip
    (
        POSTTRAIN,
        [*GRPO, "--resume_from_checkpoint", "last"],
        "no complete checkpoint-N folder in {out} to resume from",
    ),  # fmt: skip
    (
        POSTTRAIN,
        [*DISTILL, "--teacher_model_name_or_path", "{model}", "--sft_train_file", "{w}/train.txt"],
        "--sft_train_file is read by a warm start, and --method distill has none here (--sft_steps 0)",
    ),  # fmt: skip
    (
        POSTTRAIN,
        [*GRPO, "--dataset_name", "{w}/problems", "--reward_funcs", "test_bad_input_table.none_reward"],
        "reward none_reward returned None for all 2 completions",
    ),
    (
        POSTTRAIN,
        [*GRPO, "--reward_funcs", "broken_rewards.exact"],
        "--reward_funcs broken_rewards.exact: importing broken_rewards failed: NameError: name 'undefined_name'",
    ),
    (POSTTRAIN, [*GRPO, "--lm_coef", "0.5", "--model_name_or_path", "{w}/model-other"], "--lm_coef 0.5 needs the text"),
    (POSTTRAIN, [*GRPO, "--sft_steps", "-1"], "--sft_steps must be >= 0 (0: no warm start), got -1"),
    (POSTTRAIN, [*GRPO, "--test_split_size", "0.7"], "--test_split_size must be a share in (0, 0.5] or a whole"),
    (
        POSTTRAIN,
        [*GRPO, "--dataset_name", "{w}/problems", "--datasets", "{w}/problems"],
        "Give one of --dataset_name or",
    ),
    (
        POSTTRAIN,
        [
            *GRPO,
            "--dataset_name",
            "{w}/prompts",
            "--reward_funcs",
            "minirope.posttraining.tasks.verse.rewards.meter_reward",
            "--sft_steps",
            "5",
        ],
        "--sft_steps needs demonstrations of your task: give --sft_train_file",
    ),
    (
        POSTTRAIN,
        [*GRPO, "--sft_train_file", "{w}/train.txt", "{w}/pairs.jsonl"],
        "--sft_train_file: give .txt files or .jsonl/.json/.parquet rows, not both",
    ),
    (POSTTRAIN, [*GRPO, "--sft_train_file", "{w}/none.txt"], "data file {w}/none.txt does not exist"),
    (POSTTRAIN, [*GRPO, "--sft_train_file", "{w}/latin1.txt"], "latin1.txt is not UTF-8 text (byte 0xe9 at offset"),
    (POSTTRAIN, [*GRPO, "--sft_train_file", "{w}/demos-*.jsonl"], "--sft_train_file {w}/demos-*.jsonl matches no file"),
    (POSTTRAIN, [*GRPO, "--sft_batch_size", "0"], "--sft_config per_device_train_batch_size must be >= 1, got 0"),
    (POSTTRAIN, [*GRPO, "--sft_config", '{{"lm_coef": -1}}'], "--sft_config lm_coef must be >= 0, got -1"),
    (POSTTRAIN, [*GRPO, "--sft_config", '{{"learning_rate": 0}}'], "--sft_config learning_rate must be > 0, got 0."),
    (POSTTRAIN, [*GRPO, "--sft_config", '{{"lm_coef": "high"}}'], "--sft_config lm_coef must be >= 0, got high."),
    (POSTTRAIN, [*GRPO, "--sft_config", "{{learning_rate: 1}}"], "--sft_config {{learning_rate: 1}}: not JSON"),
    (POSTTRAIN, [*GRPO, "--sft_config", '{{"lr": 1e-3}}'], "--sft_config lr: not a flag of TRL's SFTConfig"),
    (POSTTRAIN, [*GRPO, "--sft_config", '{{"max_steps": 9}}'], "--sft_config max_steps: the warm start takes it from"),
    (POSTTRAIN, [*GRPO, "--sft_batch_size", "eight"], "--sft_batch_size 'eight': not a number"),
    (POSTTRAIN, [*GRPO, "--heap_trim_seconds", "-1"], "MINIROPE_HEAP_TRIM_SECONDS=-1: give a number of seconds >= 0"),
    (
        POSTTRAIN,
        [*DPO, "--reward_weights", "1"],
        "--reward_weights: 1 given for 3 rewards (meter_reward, word_variety_reward, monosyllable_penalty)",
    ),
    (
        POSTTRAIN,
        [*GRPO, "--sft_config", '{{"lm_coef": 0.5}}', "--model_name_or_path", "{w}/model-other"],
        "--sft_config lm_coef 0.5 needs the text",
    ),
    (
        POSTTRAIN,
        [*GRPO, "--sft_train_file", "{w}/no-chosen.jsonl"],
        "--sft_train_file has no text, prompt/completion or messages column",
    ),
    (POSTTRAIN, DISTILL, "--method distill needs --teacher_model_name_or_path"),
    (POSTTRAIN, [*DISTILL, "--teacher_model_name_or_path", "{w}/none"], "'{w}/none': it does not exist"),
    (
        POSTTRAIN,
        ["--method", "grpo", "--model_name_or_path", "{w}/model.gguf", "--output_dir", "{w}/out"],
        "it is a GGUF file; import it into a folder first (`minirope-import {w}/model.gguf --output_dir DIR`)",
    ),
    (
        POSTTRAIN,
        [*DISTILL, "--teacher_model_name_or_path", "{w}/train.txt"],
        "cannot load a model from '{w}/train.txt': it is a file",
    ),
    (
        POSTTRAIN,
        [
            other_vocabulary,
            None,
            *DISTILL,
            "--teacher_model_name_or_path",
            "{model}",
            "--model_name_or_path",
            "{w}/model",
        ],
        "the teacher's tokenizer (320 tokens) is not the student's",
    ),
    (POSTTRAIN, [*GRPO, "--output_dir", "{model}"], "--output_dir {model} is --model_name_or_path"),
    (
        POSTTRAIN,
        [*GRPO, "--use_peft", "--merge_lora", "False"],
        "--merge_lora False saves the LoRA adapter alone, for the model of --model_name_or_path, and the warm start",
    ),
    (POSTTRAIN, [*GRPO, "--use_peft", "--load_in_4bit"], "--load_in_4bit/--load_in_8bit (bitsandbytes QLoRA) are not"),
    (POSTTRAIN, [*GRPO, "--use_peft", "--lora_r", "0"], "LoRA needs --lora_r >= 1"),
    (
        POSTTRAIN,
        [*GRPO, "--use_peft", "--sft_steps", "0", "--merge_lora", "False", "--weight_interpolation", "0.5"],
        "--weight_interpolation mixes the saved weights with the starting ones, and --merge_lora False",
    ),
    (POSTTRAIN, ["--method", "grpo", "--output_dir", "{out}"], "--model_name_or_path is required"),
    (POSTTRAIN, [*GRPO, "--config", "{w}/none.yaml"], "--config {w}/none.yaml: no such file"),
    (POSTTRAIN, [*GRPO, "--config", "{w}/bad.yaml"], "--config {w}/bad.yaml is not YAML"),
    (POSTTRAIN, [*GRPO, "--config", "{w}/list.yaml"], "list.yaml must hold one mapping of flag names and values (as `"),
    (POSTTRAIN, [*GRPO, "--config", "{w}/unknown.yaml"], "unknown.yaml: max_stepz is not a flag of minirope-posttrain"),
    (POSTTRAIN, [*GRPO, "--dataset_streaming"], "--dataset_streaming: minirope-posttrain holds out"),
    (
        POSTTRAIN,
        [
            *GRPO,
            "--dataset_name",
            "{w}/problems",
            "--reward_funcs",
            "flat_rewards.zero",
            "--sft_steps",
            "0",
            "--num_generations_eval",
            "8",
        ],
        "GRPO would have nothing to learn from: every held-out prompt's 8 sampled completions score alike",
    ),
    (POSTTRAIN, [*DPO, "--output_dir", "{w}/notes"], "or pass --overwrite_output_dir to write the run among them"),
]


@pytest.mark.parametrize(("command", "argv", "expected"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_a_bad_input_is_one_line_and_changes_nothing(world, tmp_path, monkeypatch, capsys, command, argv, expected):
    names = {"w": str(world), "model": str(world / "model"), "out": str(tmp_path / "out")}
    if argv and callable(argv[0]):
        names["run"] = names["model"] = str(argv[0](world, tmp_path, argv[1]))
        argv = argv[2:]
    argv = [arg.format(**names) for arg in argv]
    before = checksums(world)
    monkeypatch.chdir(world)  # reward modules import from the working directory, as in `trl grpo`
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    err = cli_error(MAINS[command], argv, monkeypatch, capsys)
    assert err.startswith(f"{command}: error: ") and expected.format(**names) in err, err
    assert checksums(world) == before  # no input changed, nothing written among them
    assert not (tmp_path / "out").exists()  # nothing written


@pytest.mark.parametrize(
    ("rope_parameters", "expected"),
    [
        ({"rope_type": "linear"}, "Missing required keys"),
        ({"rope_type": "linear", "factor": "2"}, "factor field must be a float or int >= 1, got 2"),
        ({"rope_type": "dynamic", "factor": -2.0}, "factor field must be a float or int >= 1, got -2.0"),
        ({"rope_type": "llama3", "factor": 8.0}, "Missing required keys"),
        (
            {
                "rope_type": "llama3",
                "factor": 8.0,
                "original_max_position_embeddings": 64,
                "low_freq_factor": 4.0,
                "high_freq_factor": 1.0,
            },
            "high_freq_factor field must be greater than low_freq_factor",
        ),
        ({"rope_type": "bogus"}, "rope_type'] = 'bogus' is unknown"),
        ({"rope_theta": "x"}, "rope_theta'] must be a number > 0"),
    ],
)
def test_every_invalid_rope_value_is_a_value_error_naming_it(rope_parameters, expected):
    with pytest.raises(ValueError, match="rope_parameters") as error:
        MiniRopeConfig(
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, **rope_parameters},
            max_position_embeddings=256,
        )
    assert expected in str(error.value)


def test_the_table_is_large_and_docs_training_counts_it():
    assert len(CASES) >= 60
    commands = {case[0] for case in CASES}
    numbers = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven"}
    page = " ".join((Path(__file__).parent.parent / "docs" / "training.md").read_text().split())
    assert f"runs {len(CASES)} bad inputs across {numbers[len(commands)]} commands" in page


def test_training_by_epochs_with_the_default_schedule_and_no_sample(tmp_path):
    """`--max_steps -1` trains `--num_train_epochs` with warmup-stable-decay (its decay counted from the epochs'
    steps), and `--sample_max_new_tokens 0` means no sample: both used to fail after training."""
    out = tmp_path / "out"
    pretrain.run(
        [
            *TINY_RUN,
            "--max_steps",
            "-1",
            "--num_train_epochs",
            "1",
            "--sample_max_new_tokens",
            "0",
            "--logging_steps",
            "1",
            "--output_dir",
            str(out),
        ]
    )
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 64 // 4  # one pass over --max_train_samples 64 in batches of 4
    rates = [entry["learning_rate"] for entry in state["log_history"] if "learning_rate" in entry]
    assert rates[-1] < 0.25 * max(rates)  # decayed by the end: the last quarter of the steps
    assert json.loads((out / "run_summary.json").read_text())["sample"] == ""


def test_last_passes_over_a_damaged_checkpoint_to_the_previous_good_one(world, tmp_path, caplog):
    from minirope.training.checkpoints import last_complete_checkpoint

    run = run_folder(world, tmp_path, damage="optimizer.pt")
    shutil.copytree(world / "model" / "checkpoint-6", run / "checkpoint-3")
    with caplog.at_level("WARNING"):
        assert last_complete_checkpoint(run) == str(run / "checkpoint-3")
    assert "checkpoint-6/optimizer.pt is truncated or corrupt" in caplog.text


def test_text_records_fine_tune_as_text(world, tmp_path):
    """A `.jsonl` of `text` records is text to fine-tune on (it used to be read as prompt/completion pairs)."""
    result = finetune.run(
        [
            "--model_name_or_path",
            str(world / "model"),
            "--train_file",
            str(world / "text.jsonl"),
            "--validation_file",
            str(world / "text.jsonl"),
            "--output_dir",
            str(tmp_path / "out"),
            "--max_steps",
            "2",
            "--per_device_train_batch_size",
            "2",
        ]
    )
    assert result["after"]["eval_nats_per_token"] < result["before"]["eval_nats_per_token"]
