"""Documents of any size, streamed: exact ids in pieces, the in-memory path's blocks, bounded memory, a shuffled
stream that resumes exactly (one and two processes, after SIGKILL), and bad shards named."""

import json
import random
import shutil
import subprocess
import sys
from itertools import islice

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import ON_CPU, TINY_RUN
from test_bad_input import assert_no_model, cli_error
from test_data import gpt2_style_tokenizer
from test_distributed import assert_close, launch
from test_resume import kill_when_written
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from minirope.commands import pretrain
from minirope.data import documents
from minirope.data.bundled import shakespeare_plays
from minirope.data.documents import TextFile, Texts
from minirope.data.formats import file_shard
from minirope.data.pipeline import TextDataArguments, block_stream, tokenize_and_block
from minirope.data.sources import training_shards
from minirope.data.stream import BlockStream, shuffled_shards
from minirope.data.tokenizer import PIECE_CHARS, TextPieces, sample_texts, train_tokenizer

# The pre-tokenizer regex of Meta-Llama-3-8B's tokenizer.json (an oracle independent of minirope's copy)
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
    r"\s+(?!\S)|\s+"
)


@pytest.fixture(scope="module")
def plays():
    return list(shakespeare_plays().values())


@pytest.fixture(scope="module")
def tokenizer(plays):
    return train_tokenizer(plays[:6], vocab_size=512)


@pytest.fixture(scope="module")
def shards(tmp_path_factory, plays):
    """Six plays as three .txt shards, the same six as two .jsonl shards, as one .parquet and as a .json array,
    and a validation file."""
    folder = tmp_path_factory.mktemp("shards")
    texts, validation = plays[:6], plays[-1]
    for i, text in enumerate(texts):
        (folder / f"{'a' if i < 3 else 'd'}-{i}.txt").write_text(text, encoding="utf-8")
    for name, rows in (("b-0.jsonl", texts[3:5]), ("b-1.jsonl", texts[5:])):
        (folder / name).write_text("".join(json.dumps({"text": t}) + "\n" for t in rows), encoding="utf-8")
    pq.write_table(pa.table({"text": texts[3:]}), folder / "c.parquet", row_group_size=2)
    (folder / "e.json").write_text(json.dumps([{"text": t} for t in texts[3:]]), encoding="utf-8")
    (folder / "valid.txt").write_text(validation, encoding="utf-8")
    return folder, texts


def stream_of(train_file: list[str], tokenizer, block_size: int = 64, **options) -> BlockStream:
    args = TextDataArguments(train_file=train_file, block_size=block_size)
    return block_stream(training_shards(args, streaming=True), tokenizer, args, seed=0, **options)


def first(stream: BlockStream, count: int) -> list[list[int]]:
    return [item["input_ids"].tolist() for item in islice(stream, count)]


def test_streamed_blocks_equal_the_in_memory_blocks(shards, tokenizer):
    folder, _ = shards
    files = [str(folder / f"{'a' if i < 3 else 'd'}-{i}.txt") for i in range(6)]
    args = TextDataArguments(train_file=files, validation_file=[str(folder / "valid.txt")], block_size=64)
    expected = tokenize_and_block(training_shards(args), [], tokenizer, args, seed=0)[0]["input_ids"]
    assert len(expected) > 1000
    # The same documents as .txt shards given by globs, and as .txt + .jsonl, .parquet or .json records.
    for train_file in (
        [str(folder / "a-*.txt"), str(folder / "d-*.txt")],
        [str(folder / "a-*.txt"), str(folder / "b-*.jsonl")],
        [str(folder / "a-*.txt"), str(folder / "c.parquet")],
        [str(folder / "a-*.txt"), str(folder / "e.json")],
    ):
        blocks = first(stream_of(train_file, tokenizer), len(expected) + 5)
        assert blocks[: len(expected)] == expected, train_file
        assert blocks[len(expected)] == expected[0]  # then the next pass over the documents


def adversarial_text(size: int, seed: int = 0) -> str:
    """Text whose white space takes every form the pre-tokenizers treat specially: runs of spaces, newlines and
    tabs, CRLF, spaces before newlines, contractions, digits, punctuation runs, non-ASCII letters and emoji."""
    rng = random.Random(seed)
    words = ["ROMEO:", "soft", "what's", "light", "we'll", "1234567", "caf\u00e9", "\u00fcber", "\U0001f600", "--",
             "?!", "\u4e2d\u6587", "x", "I'd", "O"]  # fmt: skip
    gaps = [" ", " ", " ", "\n", "  ", "\n\n", " \n", "\t", "\r\n", "   \n\n ", "", "\n \n"]
    parts, total = [], 0
    while total < size:
        part = rng.choice(words) + rng.choice(gaps)
        parts.append(part)
        total += len(part)
    return "".join(parts)


def pre_tokenized_tokenizers(plays):
    """A GPT-2-style byte-level BPE (`ByteLevel` with its own regex: minirope's tokenizers before 2026-11-24), and
    a SentencePiece-style one (a normalizer that prepends and replaces spaces) that cannot be cut exactly."""
    texts = [plays[0], adversarial_text(20_000)]
    spiece = Tokenizer(models.BPE())
    spiece.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    spiece.train_from_iterator(texts, trainer=trainers.BpeTrainer(vocab_size=600, special_tokens=["</s>"]))
    gpt2 = gpt2_style_tokenizer(texts, vocab_size=600)
    return gpt2, PreTrainedTokenizerFast(tokenizer_object=spiece, eos_token="</s>")


def test_the_tokenizer_pre_tokenizes_as_llama_3(plays):
    """minirope's tokenizer splits text exactly as Meta-Llama-3's `tokenizer.json` does (its regex, copied above
    from that file, then byte-level without a regex), so a verse line's last comma and its newline are one token."""
    tokenizer = train_tokenizer([plays[0]], 600)
    oracle = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    for text in (adversarial_text(20_000, seed=3), plays[1][:20_000]):
        assert tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str(text) == oracle.pre_tokenize_str(text)
    assert ",\u010a" in tokenizer.tokenize("my desires,\nLike to")  # one token; GPT-2's regex splits it: ",", "\u010a"


def test_a_document_in_pieces_has_the_ids_of_the_whole_document(plays, tokenizer, tmp_path, monkeypatch):
    """`tokenizer(document)` is the oracle: a 3 MB document read from a file in 1 MiB chunks and cut into 64k
    pieces, and a 200 kB one cut into ~200-character pieces, give exactly its ids, for minirope's byte-level BPE
    (Llama 3's regex) and a GPT-2-style one; a tokenizer whose pieces would differ is detected and tokenizes
    documents whole."""
    big = adversarial_text(3_000_000, seed=1)
    (tmp_path / "big.txt").write_text(big, encoding="utf-8")
    gpt2, spiece = pre_tokenized_tokenizers(plays)
    for tok, exact in ((tokenizer, True), (gpt2, True), (spiece, False)):
        pieces = TextPieces(tok)
        assert pieces.exact is exact
        chunks = list(pieces.pieces(TextFile(tmp_path / "big.txt").read()))
        assert "".join(chunks) == big and len(chunks) == (46 if exact else 1)
        assert [i for chunk in chunks for i in pieces.encode(chunk)] == tok(big)["input_ids"]
        small_pieces = TextPieces(tok, piece_chars=200)
        small = adversarial_text(200_000, seed=2)
        chunks = list(small_pieces.pieces(iter([small[i : i + 1000] for i in range(0, len(small), 1000)])))
        assert len(chunks) > (500 if exact else 0)
        assert [i for chunk in chunks for i in pieces.encode(chunk)] == tok(small)["input_ids"]


def test_a_non_utf8_byte_deep_in_a_large_document_is_named_with_its_offset(tmp_path):
    """The file is read in 1 MiB chunks: a character cut by a chunk boundary is fine, a bad byte is named exactly."""
    text = "a" * (documents.CHUNK_BYTES - 1) + "\u00e9" + "b" * 2_000_000  # the 2-byte character straddles the cut
    data = bytearray(text.encode("utf-8"))
    data[2_500_001] = 0xFF
    (tmp_path / "big.txt").write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"big.txt is not UTF-8 text \(byte 0xff at offset 2500001\)"):
        list(TextFile(tmp_path / "big.txt").read())


def test_the_stream_resumes_exactly_from_any_block(shards, tokenizer, tmp_path, plays):
    """From the position saved after any block (JSON round trip), the stream continues with the same blocks:
    across shards of every kind, mid-document (byte offsets into .txt files), mid-window and across passes, with
    and without the shuffle window."""
    folder, _ = shards
    small = tmp_path / "small.txt"
    small.write_text(plays[7][:3000])
    files = [str(folder / "a-0.txt"), str(small), str(folder / "b-1.jsonl"), str(folder / "c.parquet")]
    for shuffle in (0, 64):
        stream = stream_of(files, tokenizer, shuffle_shards=shuffle > 0, shuffle_buffer=shuffle, keep_states=100_000)
        stream.pieces.piece_chars = 500  # many pieces: positions inside documents
        reference = first(stream, 4000)
        states = list(stream.states)
        assert states[-1]["count"] == 4000 and stream.state_at(1234) == states[1233]
        passes = {json.dumps(state)[:40] for state in states}
        assert len(passes) > 1
        for count in (1, 2, 63, 64, 65, 700, 1999, 3990):
            resumed = stream_of(files, tokenizer, shuffle_shards=shuffle > 0, shuffle_buffer=shuffle)
            resumed.pieces.piece_chars = 500
            resumed.load_state_dict(json.loads(json.dumps(states[count - 1])))
            assert first(resumed, 10) == reference[count : count + 10], (shuffle, count)
    assert first(stream_of(files, tokenizer, shuffle_buffer=64), 64) != reference[:64]  # shuffled
    assert sorted(map(tuple, first(stream_of(files, tokenizer, shuffle_buffer=64), 64))) == sorted(
        map(tuple, first(stream_of(files, tokenizer), 64))
    )  # a window holds the same blocks, in another order


MEASURE_RSS = """
import resource, sys
from itertools import islice
from transformers import AutoTokenizer
from minirope.data.stream import BlockStream, shuffled_shards
from minirope.data.documents import TextFile
tokenizer = AutoTokenizer.from_pretrained(sys.argv[2])
stream = BlockStream([TextFile(sys.argv[1])], tokenizer, block_size=256, shuffle_buffer=256)
for _ in islice(stream, 2000):
    pass
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""


def test_memory_of_the_data_path_does_not_grow_with_the_document(plays, tokenizer, tmp_path):
    """2,000 blocks read from a 1 MB and from a 120 MB one-document file: the same peak memory (a process each);
    whole-document tokenization took several GB for 50 MB. The tokenizer sample stops at its size, too."""
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    peaks = {}
    for size in (1, 120):
        path = tmp_path / f"{size}MB.txt"
        with open(path, "w", encoding="utf-8") as file:
            while file.tell() < size * 1_000_000:
                file.write(plays[0])
        result = subprocess.run([sys.executable, "-c", MEASURE_RSS, str(path), str(tmp_path / "tokenizer")],
                                capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
        peaks[size] = int(result.stdout.split()[-1])
    assert peaks[120] < peaks[1] + 40, peaks  # MB
    sample = sum(len(text.encode()) for text in sample_texts([TextFile(tmp_path / "120MB.txt")], 3_000_000))
    assert 3_000_000 <= sample <= 3_000_000 + 4 * PIECE_CHARS


@pytest.mark.slow  # two processes (~35 s); test_distributed.py checks two against one on blocks in memory
def test_tiny_streaming_pretraining_runs_and_two_processes_match_one(shards, tmp_path):
    """Two processes under torchrun: each reads the shuffled stream and keeps its half of every global batch, so
    no block is trained twice and the losses equal one process with the same global batch; resumed from a
    checkpoint's stream position, the 2 processes end where the uninterrupted run ends."""
    folder, _ = shards
    run = [*TINY_RUN, "--streaming", "True", "--train_file", str(folder / "a-*.txt"), "--validation_file",
           str(folder / "valid.txt"), "--bf16", "False", "--max_steps", "10", "--eval_strategy", "no",
           "--save_steps", "5", "--save_total_limit", "3", "--logging_steps", "1", "--seed", "1",
           "--max_train_samples", "1000", "--shuffle_buffer_size", "64"]  # fmt: skip
    single, double, resumed = tmp_path / "single", tmp_path / "double", tmp_path / "resumed"
    two = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "minirope.commands.pretrain",
           *run, "--per_device_train_batch_size", "4"]  # fmt: skip
    launch([sys.executable, "-m", "minirope.commands.pretrain", *run, "--per_device_train_batch_size", "8",
            "--output_dir", str(single)], tmp_path)  # fmt: skip
    launch([*two, "--output_dir", str(double)], tmp_path)
    assert_close(single, double)
    summary = json.loads((double / "run_summary.json").read_text())
    assert summary["processes"] == 2 and summary["train_tokens"] == 10 * 8 * 32
    shutil.copytree(double / "checkpoint-5", resumed / "checkpoint-5")
    position = json.loads((resumed / "checkpoint-5" / "stream_state.json").read_text())
    assert position["count"] == 5 * 8  # the blocks the 5 steps trained on, not those read ahead
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
    latin1.write_bytes(b"ROMEO:\n" * 50 + "caf\u00e9\n".encode("latin-1"))
    err = stream_error(tmp_path, monkeypatch, capsys, "--train_file", str(folder / "a-0.txt"), str(latin1), *valid)
    assert f"{latin1} is not UTF-8 text (byte 0xe9 at offset 353)" in err
    no_text = tmp_path / "no-text.jsonl"
    no_text.write_text(json.dumps({"content": "ROMEO: hi"}) + "\n")
    err = stream_error(tmp_path, monkeypatch, capsys, "--train_file", str(no_text), *valid)
    assert f"{no_text} line 1 has no 'text' field" in err and "--text_column" in err
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for name in ("a.txt", "b.csv", "c.txt", "d.md"):
        (mixed / name).write_text("ROMEO:\nHi.\n")
    err = stream_error(tmp_path, monkeypatch, capsys, "--train_file", str(mixed / "*"), *valid)
    assert f"data file {mixed / 'b.csv'} is not .txt, .jsonl, .json, .parquet" in err
    err = stream_error(
        tmp_path, monkeypatch, capsys, "--train_file", str(folder / "a-0.txt"), *valid, "--max_steps", "0"
    )
    assert "--max_steps must be > 0" in err


def test_real_process_exit_code_for_a_glob_that_matches_nothing(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "minirope.commands.pretrain", "--streaming", "True", "--train_file",
         str(tmp_path / "*.jsonl"), "--output_dir", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 1 and "matches no file" in result.stderr.strip().splitlines()[-1]


def test_sigkill_then_resume_continues_the_shuffled_stream_from_the_checkpoint(tmp_path):
    """Killed after a checkpoint, the run resumes from the stream position saved in it: the shards read before
    that position are made unreadable before resuming, so re-reading the stream from its start would stop with an
    error; the losses and the final validation loss equal an uninterrupted run's. The stream is shuffled (shard
    order and a window of blocks)."""
    rng = random.Random(0)
    words = "the of and to my is that in you not me it with be his your this but he have".split()
    shards = tmp_path / "shards"
    shards.mkdir()
    for shard in range(150):  # 20 short documents per shard
        rows = ["ROMEO:\n" + " ".join(rng.choice(words) for _ in range(8)) + "\n" for _ in range(20)]
        (shards / f"s-{shard:03d}.jsonl").write_text("".join(json.dumps({"text": r}) + "\n" for r in rows))
    (tmp_path / "valid.txt").write_text("ROMEO:\n" + " ".join(rng.choice(words) for _ in range(400)) + "\n")
    run = [*TINY_RUN, *ON_CPU, "--streaming", "True", "--train_file", str(shards / "s-*.jsonl"), "--validation_file",
           str(tmp_path / "valid.txt"), "--bf16", "False", "--max_steps", "200", "--save_steps", "20",
           "--eval_strategy", "no", "--save_total_limit", "2", "--seed", "7", "--shuffle_buffer_size", "16",
           "--max_train_samples", "5000"]  # fmt: skip
    want = pretrain.run([*run, "--output_dir", str(tmp_path / "uninterrupted")])

    out = tmp_path / "killed"
    kill_when_written([sys.executable, "-m", "minirope.commands.pretrain", *run, "--output_dir", str(out)],
                      out / "checkpoint-20" / "trainer_state.json")  # fmt: skip
    window_start = json.loads((out / "checkpoint-20" / "stream_state.json").read_text())["window"]
    assert window_start["epoch"] == 0 and window_start["shard"] >= 2
    files = sorted(shards.glob("*.jsonl"))
    # the shards read before the checkpoint: not needed again in this pass
    for index in shuffled_shards(len(files), seed=7, epoch=0)[: window_start["shard"]]:
        files[index].write_bytes("caf\u00e9\n".encode("latin-1") * 10)
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


def test_shards_read_from_any_document(shards):
    folder, texts = shards
    shard = Texts(["a b", "c d", "e"], ["x0", "x1", "x2"], "x")
    assert [document.name for document in shard.documents(1)] == ["x1", "x2"]
    assert "".join(next(shard.documents(1)).read(2)) == "d"
    for name in ("b-0.jsonl", "c.parquet", "e.json"):
        second = list(file_shard(str(folder / name), "text").documents())[1]
        rest = list(file_shard(str(folder / name), "text").documents(second.locator))
        assert "".join(rest[0].read(0)) == texts[4] and len(rest) == (1 if name == "b-0.jsonl" else 2)
