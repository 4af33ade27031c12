"""Documents, not rows: every play is trained on and scored as `tokenizer(play)` tokenizes the whole text."""

import json

import pytest
from conftest import TINY_RUN
from test_bad_input import assert_no_model, cli_error
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from minirope.commands import pretrain
from minirope.data.bundled import bundled_shards, play_shards, shakespeare_dataset
from minirope.data.pipeline import TextDataArguments, tokenize_and_block
from minirope.data.sources import document_texts, training_shards
from minirope.data.tokenizer import train_tokenizer
from minirope.training.metrics import IGNORE_INDEX

BLOCK = 256


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The real bundled corpus, a tokenizer trained on its training plays, and its blocks."""
    raw = shakespeare_dataset()
    tokenizer = train_tokenizer(raw["train"]["text"], vocab_size=4096)
    shards = (bundled_shards("train"), bundled_shards("validation"))
    train, validation = tokenize_and_block(*shards, tokenizer, TextDataArguments(block_size=BLOCK), seed=0)
    return raw, tokenizer, train, validation


def test_corpus_is_one_document_per_play():
    raw = shakespeare_dataset()
    assert raw["train"].num_rows == 34 and raw["validation"].num_rows == 4
    assert raw["validation"]["source"] == ["a-midsummer-night-s-dream", "julius-caesar", "richard-ii", "the-tempest"]
    assert all(text.startswith(text.split(":")[0] + ":\n") for text in raw["validation"]["text"])


def test_training_blocks_are_the_whole_plays_tokenized_as_users_tokenize_them(corpus):
    raw, tokenizer, train, _ = corpus
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    expected = [token for play in raw["train"]["text"] for token in (bos, *tokenizer(play)["input_ids"], eos)]
    stream = [token for block in train["input_ids"] for token in block]
    assert all(len(block) == BLOCK for block in train["input_ids"]) and train["labels"] == train["input_ids"]
    assert len(expected) - BLOCK < len(stream) <= len(expected)  # only the last partial block is dropped
    assert stream == expected[: len(stream)]


def test_validation_windows_score_every_token_of_each_play_once(corpus):
    raw, tokenizer, _, validation = corpus
    plays: list[list[int]] = []
    scored = 0
    for ids, labels in zip(validation["input_ids"], validation["labels"], strict=True):
        real = [token for token, label in zip(ids, labels, strict=True) if label != IGNORE_INDEX]
        if real[0] == tokenizer.bos_token_id:  # a play's first window: <s> then its first tokens
            plays.append(real[1:])
        else:  # later windows start with the previous window's last token, as context only
            assert real[0] == plays[-1][-1]
            plays[-1].extend(real[1:])
        scored += len(real) - 1
    assert [len(play) for play in plays] == [len(tokenizer(text)["input_ids"]) for text in raw["validation"]["text"]]
    assert plays == [tokenizer(text)["input_ids"] for text in raw["validation"]["text"]]
    assert scored == sum(len(play) for play in plays)


def gpt2_style_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE with GPT-2's pre-tokenizer (`ByteLevel` and its own regex: minirope's before 2026-11-24)
    trained on `texts`, with `</s>` as its only special token."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["</s>"], initial_alphabet=alphabet)
    backend.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>")


def test_the_tokenizer_covers_more_text_per_token_than_gpt_2s_regex(corpus):
    """The README's and docs/studies/recipe.md's figures: on the validation plays, minirope's 4096-entry tokenizer
    (Llama 3's regex) covers 3.30 bytes per token, a BPE trained alike with GPT-2's regex 3.00."""
    raw, tokenizer, _, _ = corpus
    gpt2 = gpt2_style_tokenizer(raw["train"]["text"], vocab_size=4096)
    plays = raw["validation"]["text"]
    size = sum(len(play.encode()) for play in plays)
    ours, gpt2s = (size / sum(len(tok(play)["input_ids"]) for play in plays) for tok in (tokenizer, gpt2))
    assert (round(ours, 2), round(gpt2s, 2)) == (3.30, 3.00)


def test_speech_by_speech_tokenization_differs_from_whole_text(corpus):
    """Why documents: with GPT-2's pre-tokenizer (minirope's until 2026-11-24, and GPT-2's family's), a BPE trained
    on speeches (the old pipeline) merges the blank line that ends a speech tokenized alone into one token, which
    whole text, as every client sends it, never produces. (Llama 3's regex, minirope's now, keeps a run of newlines
    whole either way; documents keep every tokenizer's ids those of whole text.)"""
    raw, _, _, _ = corpus
    speeches = [speech + "\n\n" for play in raw["train"]["text"] for speech in play.split("\n\n") if speech]
    tokenizer = gpt2_style_tokenizer(speeches, vocab_size=4096)
    play = raw["validation"]["text"][0]
    play_speeches = [speech + "\n\n" for speech in play.split("\n\n") if speech]
    by_speech = [token for speech in play_speeches for token in tokenizer(speech)["input_ids"]]
    whole = tokenizer(play)["input_ids"]
    blank_line = tokenizer.convert_tokens_to_ids("ĊĊ")
    assert tokenizer.decode(by_speech) == tokenizer.decode(whole) == play
    assert by_speech.count(blank_line) == len(play_speeches) > 100  # after every speech
    assert whole.count(blank_line) == 1  # whole text: only at the very end


def test_a_play_for_fine_tuning_is_two_documents_cut_between_speeches():
    shards = play_shards("the-tempest")
    train, validation = document_texts(shards["train"]), document_texts(shards["validation"])
    assert len(train) == len(validation) == 1
    whole = shakespeare_dataset()["validation"]["text"][3]
    assert train[0] + validation[0] == whole and train[0].endswith("\n\n")


def test_each_text_file_is_one_document(tmp_path):
    paths = []
    for index in range(3):
        paths.append(str(tmp_path / f"part{index}.txt"))
        (tmp_path / f"part{index}.txt").write_text(f"ROMEO:\nPart {index}.\n\nJULIET:\nYes.\n")
    shards = training_shards(TextDataArguments(train_file=paths[:2], validation_file=paths[2:]))
    assert document_texts(shards) == ["ROMEO:\nPart 0.\n\nJULIET:\nYes.\n", "ROMEO:\nPart 1.\n\nJULIET:\nYes.\n"]
    assert [document.name for shard in shards for document in shard.documents()] == paths[:2]


def local_dataset(tmp_path, rows: list) -> str:
    """A dataset folder that `datasets.load_dataset(folder)` reads: train.jsonl and validation.jsonl."""
    folder = tmp_path / "dataset"
    folder.mkdir()
    good = [{"text": "ROMEO:\nBut soft, what light.\n\n" * 20}] * 4
    (folder / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in [*good, *rows]))
    (folder / "validation.jsonl").write_text("".join(json.dumps(row) + "\n" for row in good))
    return str(folder)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"text": ""}, "row 4 tokenizes to no tokens (it is empty): remove it or give it text"),
        ({"text": None}, "row 4 is not text but NoneType: fix or drop that row"),
    ],
)
def test_a_bad_dataset_row_is_named(tmp_path, monkeypatch, capsys, row, message):
    out = tmp_path / "out"
    argv = [*TINY_RUN, "--output_dir", str(out), "--dataset_name", local_dataset(tmp_path, [row])]
    err = cli_error(pretrain.main, argv, monkeypatch, capsys)
    assert err.startswith("minirope-pretrain: error: document ") and message in err
    assert_no_model(out)


def test_a_missing_file_in_a_list_is_named(tmp_path, monkeypatch, capsys):
    (tmp_path / "a.txt").write_text("ROMEO:\nHi.\n\n" * 50)
    a, b = str(tmp_path / "a.txt"), str(tmp_path / "b.txt")
    files = ["--train_file", a, b, "--validation_file", a]
    out = tmp_path / "out"
    err = cli_error(pretrain.main, [*TINY_RUN, "--output_dir", str(out), *files], monkeypatch, capsys)
    assert f"data file {tmp_path / 'b.txt'} does not exist" in err
    assert_no_model(out)
