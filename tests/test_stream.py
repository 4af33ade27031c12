"""`minirope-pretrain --streaming`: local shards (.txt, .jsonl, .parquet, globs) give the in-memory path's blocks,
2 processes read the stream without training a block twice, and bad shards stop with an error naming them."""

import json
import shutil
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import TINY_RUN
from test_bad_input import assert_no_model, cli_error
from test_distributed import assert_close, launch
from test_resume import kill_when_written
from transformers import TrainingArguments

from minirope.training import pretrain
from minirope.training.data import TextDataArguments, load_text_datasets, shakespeare_plays, tokenize_and_block
from minirope.training.stream import first_blocks, stream_blocks, stream_documents
from minirope.training.tokenizer import train_tokenizer


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Six plays as three .txt shards, the same six as two .jsonl shards and as one .parquet, and a validation file."""
    folder = tmp_path_factory.mktemp("shards")
    plays = list(shakespeare_plays().values())
    texts, validation = plays[:6], plays[-1]
    for i, text in enumerate(texts[:3]):
        (folder / f"a-{i}.txt").write_text(text, encoding="utf-8")
    for name, rows in (("b-0.jsonl", texts[3:5]), ("b-1.jsonl", texts[5:])):
        (folder / name).write_text("".join(json.dumps({"text": t}) + "\n" for t in rows), encoding="utf-8")
    pq.write_table(pa.table({"text": texts[3:]}), folder / "c.parquet")
    (folder / "valid.txt").write_text(validation, encoding="utf-8")
    return folder, texts


def test_streamed_blocks_equal_the_in_memory_blocks(shards, tmp_path):
    folder, texts = shards
    tokenizer = train_tokenizer(texts, vocab_size=512)
    training_args = TrainingArguments(str(tmp_path))
    files = [str(folder / f"a-{i}.txt") for i in range(3)] + [str(tmp_path / f"d-{i}.txt") for i in range(3, 6)]
    for i in range(3, 6):
        (tmp_path / f"d-{i}.txt").write_text(texts[i], encoding="utf-8")
    in_memory_args = TextDataArguments(train_file=files, validation_file=[str(folder / "valid.txt")], block_size=64)
    expected = tokenize_and_block(load_text_datasets(in_memory_args), tokenizer, in_memory_args, training_args)[0]
    expected = expected["input_ids"]
    assert len(expected) > 1000
    # The same documents as .txt shards given by a glob, and as .txt + .jsonl or .txt + .parquet shards.
    for train_file in (
        [str(folder / "a-*.txt"), str(tmp_path / "d-*.txt")],
        [str(folder / "a-*.txt"), str(folder / "b-*.jsonl")],
        [str(folder / "a-*.txt"), str(folder / "c.parquet")],
    ):
        args = TextDataArguments(train_file=train_file, block_size=64)
        blocks = first_blocks(stream_blocks(stream_documents(args), tokenizer, args, training_args), len(expected) + 5)
        assert blocks == expected, train_file


def test_tiny_streaming_pretraining_runs_and_two_processes_match_one(shards, tmp_path):
    """Two processes under torchrun: each reads the stream and keeps its half of every global batch, so no
    block is trained twice and the losses equal one process with the same global batch; resumed from a
    checkpoint's stream position, the 2 processes end where the uninterrupted run ends."""
    folder, _ = shards
    run = [*TINY_RUN, "--streaming", "True", "--train_file", str(folder / "a-*.txt"), "--validation_file",
           str(folder / "valid.txt"), "--bf16", "False", "--max_steps", "10", "--eval_strategy", "no",
           "--save_steps", "5", "--save_total_limit", "3", "--logging_steps", "1", "--seed", "1",
           "--max_train_samples", "1000"]  # fmt: skip
    single, double, resumed = tmp_path / "single", tmp_path / "double", tmp_path / "resumed"
    two = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "minirope.training.pretrain",
           *run, "--per_device_train_batch_size", "4"]  # fmt: skip
    launch([sys.executable, "-m", "minirope.training.pretrain", *run, "--per_device_train_batch_size", "8",
            "--output_dir", str(single)], tmp_path)  # fmt: skip
    launch([*two, "--output_dir", str(double)], tmp_path)
    assert_close(single, double)
    summary = json.loads((double / "run_summary.json").read_text())
    assert summary["processes"] == 2 and summary["train_tokens"] == 10 * 8 * 32
    shutil.copytree(double / "checkpoint-5", resumed / "checkpoint-5")
    assert (resumed / "checkpoint-5" / "stream_state.json").is_file()
    launch([*two, "--output_dir", str(resumed), "--resume_from_checkpoint", "last"], tmp_path)
    assert_close(double, resumed)


def stream_error(tmp_path, monkeypatch, capsys, *argv) -> str:
    out = tmp_path / "out"
    err = cli_error(
        pretrain.main, [*TINY_RUN, "--streaming", "True", "--output_dir", str(out), *argv], monkeypatch, capsys
    )
    assert err.startswith("minirope-pretrain: error: ")
    assert_no_model(out)
    return err


def test_bad_shards(shards, tmp_path, monkeypatch, capsys):
    folder, _ = shards
    valid = ["--validation_file", str(folder / "valid.txt")]
    assert "matches no file" in stream_error(
        tmp_path, monkeypatch, capsys, "--train_file", str(tmp_path / "none-*.txt"), *valid
    )
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("ROMEO: caf\u00e9\n".encode("latin-1") * 50)
    err = stream_error(tmp_path, monkeypatch, capsys, "--train_file", str(folder / "a-0.txt"), str(latin1), *valid)
    assert str(latin1) in err and "not UTF-8" in err
    no_text = tmp_path / "no-text.jsonl"
    no_text.write_text(json.dumps({"content": "ROMEO: hi"}) + "\n")
    err = stream_error(tmp_path, monkeypatch, capsys, "--train_file", str(no_text), *valid)
    assert f"{no_text} line 1 has no 'text' field" in err and "--text_column" in err
    err = stream_error(
        tmp_path, monkeypatch, capsys, "--train_file", str(folder / "a-0.txt"), *valid, "--max_steps", "0"
    )
    assert "--streaming needs --max_steps" in err


def test_real_process_exit_code_for_a_glob_that_matches_nothing(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "minirope.training.pretrain", "--streaming", "True", "--train_file",
         str(tmp_path / "*.jsonl"), "--output_dir", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 1 and "matches no file" in result.stderr.strip().splitlines()[-1]


def test_sigkill_then_resume_continues_the_stream_from_the_checkpoint(tmp_path):
    """Killed after a checkpoint, the run resumes from the stream position saved in it (accelerate's stateful
    data loader): the first shards are made unreadable before resuming, so re-reading the stream from its
    start would stop with an error; the losses and the final validation loss equal an uninterrupted run's."""
    import random

    rng = random.Random(0)
    words = "the of and to my is that in you not me it with be his your this but he have".split()
    shards = tmp_path / "shards"
    shards.mkdir()
    for shard in range(150):  # 20 short documents per shard
        rows = ["ROMEO:\n" + " ".join(rng.choice(words) for _ in range(8)) + "\n" for _ in range(20)]
        (shards / f"s-{shard:03d}.jsonl").write_text("".join(json.dumps({"text": r}) + "\n" for r in rows))
    (tmp_path / "valid.txt").write_text("ROMEO:\n" + " ".join(rng.choice(words) for _ in range(400)) + "\n")
    # --max_train_samples: more blocks than 200 steps use, so the stream is never read a second time
    run = [*TINY_RUN, "--streaming", "True", "--train_file", str(shards / "s-*.jsonl"), "--validation_file",
           str(tmp_path / "valid.txt"), "--bf16", "False", "--max_steps", "200", "--save_steps", "20",
           "--eval_strategy", "no", "--save_total_limit", "2", "--seed", "7",
           "--max_train_samples", "5000"]  # fmt: skip
    want = pretrain.run([*run, "--output_dir", str(tmp_path / "uninterrupted")])

    out = tmp_path / "killed"
    kill_when_written([sys.executable, "-m", "minirope.training.pretrain", *run, "--output_dir", str(out)],
                      out / "checkpoint-20" / "stream_state.json")  # fmt: skip
    for shard in ("s-000.jsonl", "s-001.jsonl"):  # consumed before any checkpoint: must not be read again
        (shards / shard).write_bytes("caf\u00e9\n".encode("latin-1") * 10)

    got = pretrain.run([*run, "--output_dir", str(out), "--resume_from_checkpoint", "last"])
    relative = abs(got["eval_nats_per_token"] - want["eval_nats_per_token"]) / want["eval_nats_per_token"]
    assert relative <= 1e-4, (got["eval_nats_per_token"], want["eval_nats_per_token"])
    losses = [
        [
            entry["loss"]
            for entry in json.loads((folder / "trainer_state.json").read_text())["log_history"]
            if "loss" in entry
        ]
        for folder in (tmp_path / "uninterrupted", out)
    ]
    assert len(losses[0]) == len(losses[1]) == 100
    for a, b in zip(*losses, strict=True):
        assert abs(a - b) <= 1e-4 * abs(a), (a, b)


def test_streaming_a_dataset_by_name(shards, tmp_path):
    """`--dataset_name` streams the `train` split with `datasets` (here a local folder, as the Hub is offline in CI;
    `load_dataset` resolves both alike) and evaluates on its `validation` split."""
    _, texts = shards
    dataset = tmp_path / "my-dataset"
    dataset.mkdir()
    (dataset / "train.jsonl").write_text("".join(json.dumps({"content": t}) + "\n" for t in texts[:3]))
    (dataset / "validation.jsonl").write_text(json.dumps({"content": texts[3][:20000]}) + "\n")
    out = tmp_path / "out"
    flags = ["--streaming", "True", "--dataset_name", str(dataset), "--text_column", "content"]
    metrics = pretrain.run([*TINY_RUN, *flags, "--output_dir", str(out)])
    assert metrics["eval_bits_per_byte"] > 0 and (out / "model.safetensors").is_file()
