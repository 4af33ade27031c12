"""Chat: the tokenizer's template and assistant mask, conversational fine-tuning (minirope-finetune and TRL), and the
model behind the real OpenAI-compatible servers (`transformers serve`, llama.cpp's), talked to with the `openai`
client. Servers bind to 127.0.0.1 and are stopped before each test ends."""

import contextlib
import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import torch
from llama_cpp_child import llama_cpp
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from minirope import MiniRopeConfig, MiniRopeForCausalLM
from minirope.commands import finetune
from minirope.data.blocks import IGNORE_INDEX
from minirope.data.bundled import shakespeare_conversations, shakespeare_dataset
from minirope.data.chat import conversation_features
from minirope.export import export_gguf, export_llama
from minirope.tokenizer_format import CHAT_TOKENS, RESERVED_TOKENS

HAMLET = [
    {"role": "system", "content": "HAMLET"},
    {"role": "user", "content": "Who's there?"},
    {"role": "assistant", "content": "Nay, answer me: stand, and unfold yourself."},
    {"role": "user", "content": "Long live the king!"},
    {"role": "assistant", "content": "Bernardo?"},
]
QUESTION = HAMLET[:2]
MAX_TOKENS = 16


def write_conversations(path, rows) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


# --- the template ---


def test_the_template_renders_zephyr_turns_with_single_token_role_markers(tiny_pretrained):
    tokenizer = AutoTokenizer.from_pretrained(tiny_pretrained)
    text = tokenizer.apply_chat_template(HAMLET[:3], tokenize=False)
    assert text == (
        "<|system|>\nHAMLET</s>\n<|user|>\nWho's there?</s>\n<|assistant|>\nNay, answer me: stand, and unfold yourself."
        "</s>\n"
    )
    prompt = tokenizer.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|user|>\nWho's there?</s>\n<|assistant|>\n")
    for marker in CHAT_TOKENS:
        assert len(tokenizer(marker, add_special_tokens=False)["input_ids"]) == 1
        assert marker in tokenizer.all_special_tokens
    with pytest.raises(Exception, match="unknown role tool"):
        tokenizer.apply_chat_template([{"role": "tool", "content": "42"}], tokenize=False)


def test_labels_are_the_assistant_turns_and_their_eos_token_by_token(tiny_pretrained):
    tokenizer = AutoTokenizer.from_pretrained(tiny_pretrained)
    features = conversation_features(HAMLET, tokenizer, block_size=1000)
    rendered = tokenizer.apply_chat_template(HAMLET, return_dict=True, return_assistant_tokens_mask=True)
    assert features["input_ids"] == rendered["input_ids"]
    assert [label != IGNORE_INDEX for label in features["labels"]] == [bool(m) for m in rendered["assistant_masks"]]
    # independent oracle: each assistant content tokenized alone, then eos, in order, and nothing else
    expected = []
    for turn in HAMLET:
        if turn["role"] == "assistant":
            expected += tokenizer(turn["content"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert [label for label in features["labels"] if label != IGNORE_INDEX] == expected
    assert conversation_features(HAMLET, tokenizer, block_size=10)["labels"] == features["labels"][:10]


# --- conversational fine-tuning ---


@pytest.fixture(scope="module")
def conversations(tmp_path_factory):
    folder = tmp_path_factory.mktemp("conversations")
    train = write_conversations(folder / "train.jsonl", shakespeare_conversations("train", max_chars=60)[:96])
    validation = write_conversations(folder / "valid.jsonl", shakespeare_conversations("validation", 60)[:24])
    return train, validation


def conversation_run(base, output_dir, conversations, *extra):
    train, validation = conversations
    return finetune.run([
        "--model_name_or_path", str(base), "--output_dir", str(output_dir), "--train_file", train,
        "--validation_file", validation, "--num_train_epochs", "3", "--per_device_train_batch_size", "8",
        "--learning_rate", "3e-3", "--torch_compile", "False", *extra,
    ])  # fmt: skip


def test_conversational_finetune_lowers_the_assistant_loss_and_saves_the_template(
    tiny_pretrained, conversations, tmp_path
):
    result = conversation_run(tiny_pretrained, tmp_path, conversations)
    assert result["after"]["eval_nats_per_token"] < result["before"]["eval_nats_per_token"]
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert tokenizer.chat_template == AutoTokenizer.from_pretrained(tiny_pretrained).chat_template
    assert len(tokenizer) == len(AutoTokenizer.from_pretrained(tiny_pretrained))  # the markers were there already
    model = AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=True)
    ids = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    assert model.generate(**ids, max_new_tokens=4, do_sample=False).shape[1] > ids["input_ids"].shape[1]


def test_a_dataset_with_a_messages_column_fine_tunes_as_conversations(tiny_pretrained, conversations, tmp_path):
    dataset = tmp_path / "dataset"  # a local `datasets` folder: train.jsonl and validation.jsonl
    dataset.mkdir()
    for path, split in zip(conversations, ("train", "validation"), strict=True):
        (dataset / f"{split}.jsonl").write_text(open(path).read())
    result = finetune.run([
        "--model_name_or_path", str(tiny_pretrained), "--output_dir", str(tmp_path / "out"), "--dataset_name",
        str(dataset), "--max_steps", "4", "--per_device_train_batch_size", "8", "--torch_compile", "False",
    ])  # fmt: skip
    files = conversation_run(tiny_pretrained, tmp_path / "files", conversations, "--max_steps", "4")
    assert result["before"]["eval_nats_per_token"] == pytest.approx(files["before"]["eval_nats_per_token"])  # same rows
    assert result["after"]["eval_nats_per_token"] < result["before"]["eval_nats_per_token"]


# SmolLM2-135M-Instruct's template (ChatML, as its GGUF carries it): no {% generation %} markers
CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# the same rendering with transformers' markers around each assistant message: the oracle of its mask
CHATML_MARKED = CHATML.replace(
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}",
    "{{'<|im_start|>' + message['role'] + '\n'}}{% if message['role'] == 'assistant' %}{% generation %}"
    "{{ message['content'] + '<|im_end|>\n' }}{% endgeneration %}{% else %}{{ message['content'] + '<|im_end|>\n' }}"
    "{% endif %}",
)


def test_a_released_template_without_markers_trains_on_its_assistant_turns(tiny_pretrained, conversations, tmp_path):
    """A template without `{% generation %}` markers (SmolLM2's ChatML) has its assistant turns found by rendering
    the conversation turn by turn: the mask equals transformers' own for the same template with the markers, and a
    fine-tune with such a template trains (the folder keeps it)."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_pretrained)
    assert CHATML_MARKED != CHATML
    tokenizer.chat_template = CHATML
    found = conversation_features(HAMLET, tokenizer, 512)
    tokenizer.chat_template = CHATML_MARKED
    want = conversation_features(HAMLET, tokenizer, 512)
    assert found == want
    trained = tokenizer.decode([token for token in found["labels"] if token != IGNORE_INDEX])
    assert trained == "Nay, answer me: stand, and unfold yourself.<|im_end|>\nBernardo?<|im_end|>\n"
    folder = tmp_path / "terse"  # a template as short as the tiny model's 32-token context needs, no markers
    shutil.copytree(tiny_pretrained, folder)
    terse = "{% for m in messages %}{{ m['role'][0] + ':' + m['content'] + '\n' }}{% endfor %}"
    (folder / "chat_template.jinja").write_text(terse + "{% if add_generation_prompt %}a:{% endif %}")
    result = conversation_run(folder, tmp_path / "out", conversations)
    assert result["after"]["eval_nats_per_token"] < result["before"]["eval_nats_per_token"]
    assert AutoTokenizer.from_pretrained(tmp_path / "out").chat_template.startswith(terse)


def test_a_template_whose_start_changes_with_later_turns_is_refused(tiny_pretrained, conversations, tmp_path):
    folder = tmp_path / "foreign"
    shutil.copytree(tiny_pretrained, folder)
    (folder / "chat_template.jinja").write_text(
        "{{ messages | length }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    with pytest.raises(ValueError, match="renders a conversation's start differently .* add {% generation %} markers"):
        conversation_run(folder, tmp_path / "out", conversations)
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def folder_without_markers(tiny_pretrained, tmp_path_factory):
    """A model folder whose tokenizer predates the chat template: bos, eos, pad, bytes and merges only."""
    folder = tmp_path_factory.mktemp("no_markers")
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<s>", "</s>", "<pad>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    backend.train_from_iterator(shakespeare_dataset()["train"]["text"][:2], trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    model = MiniRopeForCausalLM.from_pretrained(tiny_pretrained)
    assert model.config.vocab_size == len(tokenizer) == 320
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("lora", [False, True])
def test_a_folder_without_the_markers_gets_them_and_its_embeddings_grow(
    folder_without_markers, conversations, tmp_path, lora
):
    extra = ["--lora", "--learning_rate", "1e-2"] if lora else []
    result = conversation_run(folder_without_markers, tmp_path, conversations, *extra)
    assert result["after"]["eval_nats_per_token"] < result["before"]["eval_nats_per_token"]
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert len(tokenizer) == 323 and tokenizer.convert_tokens_to_ids(CHAT_TOKENS) == [320, 321, 322]
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert model.config.vocab_size == 323
    base = AutoModelForCausalLM.from_pretrained(folder_without_markers).get_input_embeddings().weight
    new_rows = model.get_input_embeddings().weight[320:]
    assert not torch.allclose(new_rows, base.mean(0).expand_as(new_rows))  # trained, not left at the initial mean


def test_trl_sft_trainer_trains_on_assistant_tokens_only(tiny_pretrained, tmp_path):
    trl = pytest.importorskip("trl")
    from datasets import Dataset

    rows = shakespeare_conversations("train", 60)[:32]
    config = trl.SFTConfig(
        output_dir=str(tmp_path),
        max_steps=4,
        per_device_train_batch_size=8,
        learning_rate=1e-3,
        max_length=32,
        assistant_only_loss=True,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        model_init_kwargs={"trust_remote_code": True},
    )
    trainer = trl.SFTTrainer(model=str(tiny_pretrained), args=config, train_dataset=Dataset.from_list(rows))
    tokenizer = trainer.processing_class
    batch = next(iter(trainer.get_train_dataloader()))
    for ids, labels in zip(batch["input_ids"], batch["labels"], strict=True):
        kept = [int(token) for token, label in zip(ids, labels, strict=True) if label != IGNORE_INDEX]
        assert kept and tokenizer.convert_tokens_to_ids("<|assistant|>") not in kept
        assert tokenizer.convert_tokens_to_ids("<|user|>") not in kept
    trainer.train()
    assert all(torch.isfinite(torch.tensor(e["loss"])) for e in trainer.state.log_history if "loss" in e)


# --- served: transformers serve (the Llama export) and llama.cpp's server (the GGUF), with the openai client ---


@pytest.fixture(scope="module")
def chat_model(tiny_pretrained, tmp_path_factory):
    """Random weights behind the trained tokenizer and template, as a minirope folder, its Llama export and its GGUF.

    Greedy answers differ from prompt to prompt; the special and single-byte tokens get logit 0, so an answer is
    whole characters, which every server decodes alike."""
    folder = tmp_path_factory.mktemp("chat_model")
    tokenizer = AutoTokenizer.from_pretrained(tiny_pretrained)
    config = MiniRopeConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    model = MiniRopeForCausalLM(config)
    with torch.no_grad():  # never the special or single-byte tokens: merges only, which decode to whole characters
        model.lm_head.weight[:RESERVED_TOKENS] = 0
    model.save_pretrained(folder / "minirope")
    tokenizer.save_pretrained(folder / "minirope")
    export_llama(folder / "minirope", folder / "llama")
    export_gguf(folder / "minirope", folder / "model.gguf", "f32")
    return folder


def expected(folder, chat: bool) -> str:
    """`model.generate`, greedy, on the chat prompt or the plain prompt: what every server must answer."""
    model = AutoModelForCausalLM.from_pretrained(folder / "minirope").eval()
    tokenizer = AutoTokenizer.from_pretrained(folder / "minirope")
    if chat:
        ids = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    else:
        ids = tokenizer("ROMEO:\n", return_tensors="pt")
    output = model.generate(**ids, max_new_tokens=MAX_TOKENS, do_sample=False)
    return tokenizer.decode(output[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def server(command: list[str], ready: str, log_path, timeout: float = 120):
    """Start `command` (a server on 127.0.0.1), wait until GET `ready` answers, and stop it on exit."""
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + timeout
            while True:
                with contextlib.suppress(OSError):
                    urllib.request.urlopen(ready, timeout=2)
                    break
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{command[:3]} did not start: {log_path.read_text()[-2000:]}")
                time.sleep(0.5)
            yield
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def ask(port: int, model: str, **extra_body) -> dict:
    """The three calls a chat client makes, greedy: chat, chat streamed, completion (`extra_body`: a server's own
    request fields)."""
    from openai import OpenAI

    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
    greedy = {"model": model, "max_tokens": MAX_TOKENS, "temperature": 0.0}
    greedy |= {"extra_body": extra_body} if extra_body else {}
    chat = client.chat.completions.create(messages=QUESTION, **greedy)
    stream = client.chat.completions.create(messages=QUESTION, stream=True, **greedy)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    completion = client.completions.create(prompt="ROMEO:\n", **greedy)
    return {
        "chat": chat.choices[0].message.content,
        "stream": streamed,
        "completion": completion.choices[0].text,
        "prompt_tokens": chat.usage.prompt_tokens if chat.usage else None,
    }


def check_answers(answers: dict, folder) -> None:
    want_chat, want_completion = expected(folder, chat=True), expected(folder, chat=False)
    assert want_chat and want_completion and want_chat != want_completion  # the checks below can fail
    assert answers["chat"] == want_chat
    assert answers["stream"] == want_chat
    assert answers["completion"] == want_completion


@pytest.mark.client
@pytest.mark.parametrize("continuous_batching", [False, True])
def test_transformers_serve_answers_the_llama_export_as_generate_does(chat_model, tmp_path, continuous_batching):
    pytest.importorskip("fastapi")
    port = free_port()
    command = [sys.executable, "-m", "transformers.cli.transformers", "serve", str(chat_model / "llama")]
    command += ["--host", "127.0.0.1", "--port", str(port), "--device", "cpu"]
    command += ["--continuous-batching"] if continuous_batching else []
    with server(command, f"http://127.0.0.1:{port}/health", tmp_path / "serve.log"):
        answers = ask(port, str(chat_model / "llama"))
    check_answers(answers, chat_model)


@pytest.mark.client
def test_llama_cpp_server_answers_the_gguf_as_generate_does(chat_model, tmp_path):
    pytest.importorskip("llama_cpp.server")
    port = free_port()
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(chat_model / "model.gguf")]
    command += ["--host", "127.0.0.1", "--port", str(port), "--n_ctx", "256"]
    with server(command, f"http://127.0.0.1:{port}/v1/models", tmp_path / "llama-server.log"):
        answers = ask(port, "model", repeat_penalty=1.0)  # llama-cpp-python's server defaults to 1.1: not greedy
    check_answers(answers, chat_model)
    tokenizer = AutoTokenizer.from_pretrained(chat_model / "minirope")
    prompt = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, return_dict=True)["input_ids"]
    assert answers["prompt_tokens"] == len(prompt)  # the same prompt, tokenized alike


@pytest.mark.client
def test_the_gguf_carries_the_template_and_llama_cpp_renders_the_same_prompt(chat_model):
    pytest.importorskip("llama_cpp")
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    (template,) = llama_cpp(chat_model / "model.gguf", [("metadata", "tokenizer.chat_template")], n_ctx=256)
    assert "endgeneration" not in template and "<|assistant|>" in template  # a tag only transformers knows
    formatter = Jinja2ChatFormatter(template, eos_token="</s>", bos_token="<s>")
    tokenizer = AutoTokenizer.from_pretrained(chat_model / "minirope")
    for messages in (QUESTION, HAMLET):
        want = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert formatter(messages=messages).prompt == want
