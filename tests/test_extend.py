"""minirope-extend and the long-context measures: RoPE scaling configs against transformers' Llama, the
repeated-passage data mix, sliding-window scoring, the repeat test, a tiny extension end to end, bad input."""

import json
import random

import numpy as np
import pytest
import torch
from conftest import llama_twin, random_model, tiny_config
from test_bad_input import assert_no_model, cli_error
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from minirope import MiniRopeForSequenceClassification
from minirope.commands import extend
from minirope.data.blocks import document_windows, insert_repeats
from minirope.rope_scaling import EXTENSIONS, extended_rope
from minirope.training.metrics import IGNORE_INDEX
from minirope.training.repeat_test import repeat_test, repeat_windows

# fmt: off
TINY_EXTEND = [
    "--factor", "4", "--max_steps", "2", "--per_device_train_batch_size", "2", "--max_train_samples", "8",
    "--eval_document_tokens", "200", "--repeat_distances", "8", "40", "--repeat_samples", "2",
    "--logging_steps", "1", "--torch_compile", "False",
]
# fmt: on


@pytest.mark.parametrize("rope_type", list(EXTENSIONS))
def test_extended_config_gives_llamas_logits(rope_type):
    """The fields `minirope-extend` writes mean the same in transformers' LlamaForCausalLM (the oracle), at 4x."""
    config = tiny_config()
    config.update(extended_rope(config, rope_type, 4.0, 4 * config.max_position_embeddings))
    model = random_model(config, attn="eager")
    llama = llama_twin(model)
    assert llama.config.max_position_embeddings == config.max_position_embeddings
    input_ids = torch.randint(3, config.vocab_size, (2, 4 * 32))
    for length in (16, 4 * 32):  # inside the original context, and at the new one
        with torch.no_grad():
            expected = llama(input_ids[:, :length]).logits
            actual = model(input_ids[:, :length]).logits
        torch.testing.assert_close(actual, expected, atol=1e-4, rtol=1e-4)


def test_extended_fields():
    config = tiny_config()  # trained at 32
    yarn = extended_rope(config, "yarn", 4.0, 128)
    assert yarn["max_position_embeddings"] == 128
    assert yarn["rope_parameters"] == {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 32,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
    }
    assert extended_rope(config, "dynamic", 4.0, 128)["max_position_embeddings"] == 32  # rescales past it
    default = extended_rope(config, "default", 4.0, 100)
    assert default == {
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "max_position_embeddings": 100,
    }
    llama3 = extended_rope(config, "llama3", 8.0, 256)["rope_parameters"]
    assert (llama3["low_freq_factor"], llama3["high_freq_factor"], llama3["factor"]) == (1.0, 4.0, 8.0)


def test_insert_repeats_copies_a_passage_in_the_chosen_share_of_blocks():
    blocks = [np.arange(1000 * i, 1000 * i + 256) for i in range(2000)]  # all tokens distinct
    out = [insert_repeats(block, i, fraction=0.25, max_length=64, seed=3) for i, block in enumerate(blocks)]
    changed = 0
    for block, new in zip(blocks, out, strict=True):
        assert len(new) == 256
        diff = np.flatnonzero(new != block).tolist()
        if not diff:
            continue
        changed += 1
        start, length = diff[0], len(diff)
        assert diff == list(range(start, start + length)) and 16 <= length <= 64
        source = new[start] - block[0]  # where the copied passage came from
        assert (new[start : start + length] == block[source : source + length]).all() and source + length <= start
    assert 0.22 < changed / 2000 < 0.28
    again = [insert_repeats(block, i, fraction=0.25, max_length=64, seed=3) for i, block in enumerate(blocks[:50])]
    assert all((a == b).all() for a, b in zip(again, out, strict=False))  # depends on (seed, index) only
    assert all((insert_repeats(b, i, 0.0, 64, seed=3) == b).all() for i, b in enumerate(blocks[:50]))


@pytest.mark.parametrize("stride", [None, 16, 5, 1])
@pytest.mark.parametrize("piece", [101, 7, 1])
def test_sliding_windows_score_every_token_once_with_the_promised_context(stride, piece):
    """Whatever pieces the document's ids come in (whole, or 7 or 1 at a time)."""
    framed = [1, *range(10, 110)]  # the prefix 1, then a 100-token document
    pieces = [framed[start : start + piece] for start in range(0, len(framed), piece)]
    out = list(document_windows(iter(pieces), block_size=32, pad_token_id=0, stride=stride))
    stride = stride or 31
    scored = []
    for number, (window, labels) in enumerate(out):
        assert len(window) == 32
        start = number * stride
        assert [t for t in window if t] == framed[start : start + 32]
        for position, label in enumerate(labels[1:], start=1):  # position 0 is never a target
            if label != IGNORE_INDEX:
                scored.append(label)
                assert number == 0 or position >= 32 - stride  # at least block - stride tokens before it
    assert scored == framed[1:]
    expected_windows = len(range(0, max(1, len(framed) - (32 - stride)), stride))
    assert len(out) == expected_windows


class CopyModel(torch.nn.Module):
    """Predicts token t as token t - lag, with certainty: a perfect copier over a known distance."""

    def __init__(self, lag: int, vocab: int) -> None:
        super().__init__()
        self.lag, self.vocab = lag, vocab
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids):
        # logits[:, t] predicts token t + 1, which repeats token t + 1 - lag
        source = torch.roll(input_ids, self.lag - 1, dims=1)
        logits = torch.nn.functional.one_hot(source, self.vocab).float() * 30.0
        return type("Output", (), {"logits": logits})


def test_repeat_test_scores_the_repeat_against_the_first_occurrence():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = [f"w{i}" for i in range(200)]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["<s>", "</s>", *words])}, unk_token="<s>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>")
    rng = random.Random(0)
    documents = [" ".join(rng.choice(words) for _ in range(600)) for _ in range(2)]
    ids = tokenizer(documents, add_special_tokens=False)["input_ids"]
    windows = repeat_windows(ids, distance=50, passage_tokens=20, samples=4, prefix=0)
    assert windows.shape == (4, 1 + 20 + 50 + 20)
    assert torch.equal(windows[:, 1:21], windows[:, 71:91]) and (windows[:, 0] == 0).all()
    for distance in (10, 50):
        copier = CopyModel(lag=20 + distance, vocab=len(tokenizer))
        (result,) = repeat_test(copier, tokenizer, documents, (distance,), passage_tokens=20, samples=4)
        assert result["ratio"] < 0.01 and result["first_bits_per_byte"] > 1
        assert result["window_tokens"] == 1 + 40 + distance
        wrong = CopyModel(lag=20 + distance + 1, vocab=len(tokenizer))  # off by one: copies nothing
        assert repeat_test(wrong, tokenizer, documents, (distance,), passage_tokens=20, samples=4)[0]["ratio"] > 0.5


def test_tiny_extension_end_to_end(tiny_pretrained, tmp_path, monkeypatch, capsys):
    out = tmp_path / "extended"
    summary = extend.run(
        ["--model_name_or_path", str(tiny_pretrained), "--rope_type", "yarn", *TINY_EXTEND, "--output_dir", str(out)]
    )
    assert summary["steps"] == 2 and summary["block_size"] == 128 and summary["train_tokens"] == 2 * 2 * 128
    for when in ("before", "after"):
        for size in (32, 128):
            assert summary[f"{when}_{size}_bits_per_byte"] > 0
        assert [row["distance"] for row in summary[f"repeat_{when}"]] == [8, 40]
    config = json.loads((out / "config.json").read_text())
    assert config["max_position_embeddings"] == 128
    assert config["rope_parameters"]["rope_type"] == "yarn"
    assert config["rope_parameters"]["original_max_position_embeddings"] == 32
    # The saved folder, loaded by transformers' Llama with the same config fields, gives the same logits.
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    llama_config = LlamaConfig(
        **{k: v for k, v in config.items() if k not in ("architectures", "auto_map", "model_type")}
    )
    llama = LlamaForCausalLM(llama_config).eval()
    llama.load_state_dict(model.state_dict(), strict=True)
    input_ids = torch.randint(3, config["vocab_size"], (1, 128))
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids).logits, llama(input_ids).logits, atol=1e-4, rtol=1e-4)
    assert json.loads((out / "run_summary.json").read_text())["rope_type"] == "yarn"
    # Extending the extended folder again is refused (its factor would compound): extend the base instead.
    again = tmp_path / "again"
    err = cli_error(extend.main, ["--model_name_or_path", str(out), "--output_dir", str(again)], monkeypatch, capsys)
    assert "already scaled" in err and not again.exists()


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--factor", "1"], "--factor must be > 1"),
        (["--factor", "0.5"], "--factor must be > 1"),
        (["--block_size", "200"], "--block_size 200 is beyond factor x the trained context"),
        (["--rope_type", "ntk"], "--rope_type 'ntk' is not one of"),
        (["--rope_type", "longrope"], "--rope_type 'longrope' is not one of"),
    ],
)
def test_bad_flags(tiny_pretrained, tmp_path, monkeypatch, capsys, argv, expected):
    out = tmp_path / "out"
    err = cli_error(
        extend.main,
        ["--model_name_or_path", str(tiny_pretrained), *TINY_EXTEND, *argv, "--output_dir", str(out)],
        monkeypatch,
        capsys,
    )
    assert err.startswith("minirope-extend: error: ") and expected in err, err
    assert not out.exists()


def test_a_folder_that_is_not_a_causal_lm(tmp_path, monkeypatch, capsys):
    classifier = tmp_path / "classifier"
    MiniRopeForSequenceClassification(tiny_config(num_labels=3)).save_pretrained(classifier)
    out = tmp_path / "out"
    err = cli_error(
        extend.main, ["--model_name_or_path", str(classifier), "--output_dir", str(out)], monkeypatch, capsys
    )
    assert "MiniRopeForSequenceClassification, not a causal LM" in err
    err = cli_error(
        extend.main, ["--model_name_or_path", str(tmp_path / "nothing"), "--output_dir", str(out)], monkeypatch, capsys
    )
    assert "nothing': it does not exist" in err
    assert_no_model(out) and not out.exists()
