"""Bad input: one clear line naming the problem and the fix, a non-zero exit, and no partial output."""

import json
import math
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import TINY_RUN, random_model, tiny_config
from transformers import AutoModelForCausalLM, Trainer

from minirope.commands import finetune, generate, pretrain
from minirope.data.bundled import shakespeare_dataset
from minirope.data.tokenizer import train_tokenizer


def cli_error(main, argv, monkeypatch, capsys) -> str:
    """Run a CLI's `main()` with `argv`; assert a non-zero exit and one error line (the last line of stderr,
    after any progress bars), and return it."""
    monkeypatch.setattr(sys, "argv", ["prog", *argv])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code not in (0, None)
    lines = capsys.readouterr().err.strip().splitlines()
    assert sum("error:" in line for line in lines) == 1, lines[-5:]
    assert "error: " in lines[-1] and "Traceback" not in "".join(lines)
    return lines[-1]


def assert_no_model(folder):
    assert not (folder / "config.json").exists() and not (folder / "model.safetensors").exists()


def text_files(tmp_path, train: bytes, valid: bytes = b"ROMEO:\nSoft!\n\n" * 40):
    (tmp_path / "train.txt").write_bytes(train)
    (tmp_path / "valid.txt").write_bytes(valid)
    return ["--train_file", str(tmp_path / "train.txt"), "--validation_file", str(tmp_path / "valid.txt")]


def pretrain_error(tmp_path, monkeypatch, capsys, *argv) -> str:
    out = tmp_path / "out"
    err = cli_error(pretrain.main, [*TINY_RUN, "--output_dir", str(out), *argv], monkeypatch, capsys)
    assert err.startswith("minirope-pretrain: error: ")
    assert_no_model(out)
    return err


def test_missing_data_file(tmp_path, monkeypatch, capsys):
    missing = str(tmp_path / "nope.txt")
    err = pretrain_error(tmp_path, monkeypatch, capsys, "--train_file", missing, "--validation_file", missing)
    assert "nope.txt does not exist" in err


def test_empty_file(tmp_path, monkeypatch, capsys):
    err = pretrain_error(tmp_path, monkeypatch, capsys, *text_files(tmp_path, b"  \n\n"))
    assert "train.txt is empty" in err


def test_non_utf8_file(tmp_path, monkeypatch, capsys):
    err = pretrain_error(tmp_path, monkeypatch, capsys, *text_files(tmp_path, "Ótelo:\n".encode("latin-1") * 50))
    assert "not UTF-8" in err and "iconv" in err


def test_corpus_shorter_than_one_block(tmp_path, monkeypatch, capsys):
    err = pretrain_error(tmp_path, monkeypatch, capsys, *text_files(tmp_path, b"ROMEO:\nHi.\n"))
    assert "shorter than one block" in err and "--block_size" in err


def test_block_size_longer_than_the_context_is_refused(tmp_path, monkeypatch, capsys):
    err = pretrain_error(tmp_path, monkeypatch, capsys, "--block_size", "64", "--max_position_embeddings", "32")
    assert "--block_size 64 is longer than --max_position_embeddings 32" in err


def test_invalid_model_flags(tmp_path, monkeypatch, capsys):
    err = pretrain_error(tmp_path, monkeypatch, capsys, "--num_attention_heads", "3", "--num_key_value_heads", "3")
    assert "hidden_size (32) must be divisible by num_attention_heads (3)" in err
    assert "--hidden_sise" in cli_error(pretrain.main, ["--hidden_sise", "32"], monkeypatch, capsys)


def test_output_dir_holding_a_different_model(tiny_pretrained, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    shutil.copytree(tiny_pretrained, out)  # a folder minirope wrote (its marker); a lone config.json is the user's
    argv = [*TINY_RUN, "--output_dir", str(out), "--hidden_size", "48", "--intermediate_size", "96"]
    err = cli_error(pretrain.main, argv, monkeypatch, capsys)
    assert "already holds a different model (hidden_size 32, this run 48)" in err and "--overwrite_output_dir" in err
    assert json.loads((out / "config.json").read_text())["hidden_size"] == 32  # untouched
    pretrain.run([*argv, "--overwrite_output_dir", "True", "--max_steps", "1"])
    assert json.loads((out / "config.json").read_text())["hidden_size"] == 48


def test_tokenizer_larger_than_the_model_vocabulary(tiny_pretrained, tmp_path, monkeypatch, capsys):
    folder = tmp_path / "mismatched"
    AutoModelForCausalLM.from_pretrained(tiny_pretrained).save_pretrained(folder)  # vocab 320
    texts = shakespeare_dataset()["train"]["text"][:3000]
    train_tokenizer(texts, vocab_size=400).save_pretrained(folder)
    argv = ["--model_name_or_path", str(folder), "--play", "the-tempest", "--output_dir", str(tmp_path / "out")]
    err = cli_error(finetune.main, argv, monkeypatch, capsys)
    assert "the tokenizer has 400 tokens but the model's vocab_size is 320" in err
    assert_no_model(tmp_path / "out")


def test_token_ids_outside_the_vocabulary():
    model = random_model(tiny_config("mha"))
    for bad in (97, -1):
        with pytest.raises(ValueError, match=rf"token id {bad}, outside the vocabulary \[0, 97\)"):
            model(torch.tensor([[5, bad, 6]]))


def test_nan_loss_stops_training_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch, capsys):
    real_step = Trainer.training_step

    def step(self, *args, **kwargs):  # the loss turns NaN at step 5
        loss = real_step(self, *args, **kwargs)
        return loss * math.nan if self.state.global_step >= 4 else loss

    monkeypatch.setattr(Trainer, "training_step", step)
    out = tmp_path / "out"
    argv = [*TINY_RUN, "--output_dir", str(out), "--save_steps", "2", "--max_steps", "8"]
    err = cli_error(pretrain.main, argv, monkeypatch, capsys)
    assert "loss became nan at step 5" in err and "checkpoint-4" in err and "--learning_rate" in err
    assert_no_model(out)
    weights = AutoModelForCausalLM.from_pretrained(out / "checkpoint-4").state_dict()
    assert all(torch.isfinite(tensor).all() for tensor in weights.values())


def test_truncated_safetensors_and_pickle_only_folders(tmp_path, monkeypatch, capsys):
    model = random_model(tiny_config("mha"))
    model.save_pretrained(tmp_path / "truncated")
    weights = tmp_path / "truncated" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(OSError, match="truncated or corrupt"):
        AutoModelForCausalLM.from_pretrained(tmp_path / "truncated")
    err = cli_error(generate.main, ["--model", str(tmp_path / "truncated"), "--prompt", "x"], monkeypatch, capsys)
    assert "truncated or corrupt" in err

    model.save_pretrained(tmp_path / "pickle")
    (tmp_path / "pickle" / "model.safetensors").unlink()
    torch.save(model.state_dict(), tmp_path / "pickle" / "pytorch_model.bin")
    with pytest.raises(OSError, match="holds only pickle weights"):
        AutoModelForCausalLM.from_pretrained(tmp_path / "pickle")


def test_real_process_exit_code(tmp_path):
    missing = str(tmp_path / "nope.txt")
    result = subprocess.run(
        [sys.executable, "-m", "minirope.commands.pretrain", "--train_file", missing, "--validation_file", missing],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("minirope-pretrain: error: data file")


def test_a_commands_error_is_its_first_line_without_torchaos_startup_noise():
    """transformers' model import imports torchao, which logs about its own optional kernels and enums on every
    start: kept out of a command's process (`minirope.startup_noise`), so a bad input's line is the command's first;
    `-W default` (asking for warnings) shows them again; a program that imports minirope is left as it was."""
    import importlib.util

    command = ["-m", "minirope.commands.posttrain", "--model", "m", "--method", "ppo"]
    result = subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert result.stderr.splitlines()[0].startswith("minirope-posttrain: error: --method 'ppo'"), result.stderr
    if importlib.util.find_spec("torchao") is not None:
        shown = subprocess.run([sys.executable, "-W", "default", *command], capture_output=True, text=True, timeout=300)
        assert "torchao" in shown.stderr.splitlines()[0], shown.stderr
    # a program of the user's that imports minirope keeps its loggers as it set them: the filters are a command's
    names = "'torchao', 'torch.utils._pytree'"
    library = f"import logging, minirope; print([len(logging.getLogger(n).filters) for n in ({names})])"
    imported = subprocess.run([sys.executable, "-c", library], capture_output=True, text=True, timeout=300)
    assert imported.stdout.split("\n")[-2] == "[0, 0]", imported.stderr
