"""`minirope-export`: each artifact checked by the client that reads it (transformers without remote code,
onnxruntime, llama.cpp through llama-cpp-python, ExecuTorch's runtime and its LLM runner), on a model trained here
on the bundled plays."""

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import TINY_RUN, left_padded_batch
from llama_cpp_child import llama_cpp
from tokenizers import pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

from minirope import MiniRopeForCausalLM
from minirope.commands import pretrain
from minirope.data.bundled import shakespeare_dataset
from minirope.export import export_executorch, export_gguf, export_llama, export_onnx

pytestmark = pytest.mark.client

# Text a tokenizer can get wrong: newlines and blank lines, apostrophes and contractions, digits, non-ASCII.
TRICKY = [
    "ROMEO:\nBut, soft! what light through yonder window breaks?\n\nJULIET:\nAy me!",
    "I'll ne'er o'erlook't; 'tis true, we've 3 or 33 or 333 ducats.",
    "  two spaces,\tone tab\n\n\n three newlines; café, naïve, Æsop — “quoted” ‘single’ 🦙",
    "WE'LL SEE'T.  \nA verse line's break;  \n\t \n  \nthen 1234567 and 12,345.\r\n",
]


@pytest.fixture(scope="module")
def client_model(tmp_path_factory):
    """A small model trained for 80 steps: hidden 64 (q8_0 needs widths divisible by 32), 4 heads of 16."""
    output_dir = tmp_path_factory.mktemp("client_model")
    flags = dict(zip(TINY_RUN[::2], TINY_RUN[1::2], strict=True))
    flags.update({
        "--hidden_size": "64", "--intermediate_size": "128", "--tokenizer_vocab_size": "512", "--block_size": "64",
        "--max_steps": "80", "--eval_steps": "80", "--save_steps": "80", "--learning_rate": "3e-3",
    })  # fmt: skip
    pretrain.run([*(item for pair in flags.items() for item in pair), "--output_dir", str(output_dir)])
    return output_dir


def validation_text(chars: int = 3000) -> str:
    return shakespeare_dataset()["validation"]["text"][0][:chars]


def test_llama_folder_loads_without_remote_code(client_model, tmp_path):
    output = export_llama(client_model, tmp_path / "llama")
    files = {path.name for path in output.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "README.md"} <= files
    assert not any(name.endswith(".py") for name in files)
    assert json.loads((output / "config.json").read_text())["model_type"] == "llama"
    llama = AutoModelForCausalLM.from_pretrained(output).eval()
    assert type(llama) is LlamaForCausalLM
    ours, tokenizer = MiniRopeForCausalLM.from_pretrained(client_model).eval(), AutoTokenizer.from_pretrained(output)
    text = validation_text(600)
    assert tokenizer(text)["input_ids"] == AutoTokenizer.from_pretrained(client_model)(text)["input_ids"]
    ids = tokenizer(text, return_tensors="pt")["input_ids"][:, :64]
    with torch.no_grad():
        torch.testing.assert_close(llama(ids).logits, ours(ids).logits, rtol=0, atol=1e-4)


def test_onnx_matches_pytorch_for_several_lengths_past_the_context_and_a_padded_batch(client_model, tmp_path):
    onnxruntime = pytest.importorskip("onnxruntime")
    output = export_onnx(client_model, tmp_path / "onnx")
    session = onnxruntime.InferenceSession(str(output / "model.onnx"))
    model = MiniRopeForCausalLM.from_pretrained(client_model).eval()
    vocab = model.config.vocab_size
    past_context = 2 * model.config.max_position_embeddings + 5  # angles are computed in the graph: no limit
    for batch, length in ((1, 1), (1, 7), (3, 33), (2, 64), (1, past_context)):
        ids = torch.randint(3, vocab, (batch, length), generator=torch.Generator().manual_seed(length))
        mask = torch.ones_like(ids)
        (logits,) = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
        with torch.no_grad():
            want = model(ids, attention_mask=mask).logits.numpy()
        assert np.abs(logits - want).max() < 1e-4, (batch, length)
    ids, mask, positions = left_padded_batch(vocab)
    (logits,) = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
    with torch.no_grad():
        want = model(ids, attention_mask=mask, position_ids=positions).logits.numpy()
    real = mask.bool().numpy()
    assert np.abs(logits[real] - want[real]).max() < 1e-4


def test_legacy_onnx_exporter_gets_as_far_as_llamas(client_model, tmp_path):
    """The TorchScript-based exporter (`dynamo=False`) must meet minirope's model exactly as it meets Llama's."""
    pytest.importorskip("onnx")
    from minirope.convert import to_llama

    model = MiniRopeForCausalLM.from_pretrained(client_model).eval()
    ids = torch.randint(3, model.config.vocab_size, (1, 8))
    outcomes = []
    for name, candidate in (("minirope", model), ("llama", to_llama(model))):
        candidate.config.use_cache = False
        try:
            torch.onnx.export(candidate, (ids,), str(tmp_path / f"{name}.onnx"), dynamo=False)
            outcomes.append("exported")
        except Exception as error:  # compared, not hidden: both must stop at the same point
            outcomes.append(type(error).__name__)
    assert outcomes[0] == outcomes[1], outcomes
    print("legacy exporter:", dict(zip(("minirope", "llama"), outcomes, strict=True)))


# --- llama.cpp, through llama-cpp-python (it builds llama.cpp from source at install), in a child process ---

# llama.cpp and torch sum float32 products in different orders: logits agree within this (and do, measured ~1e-5).
LOGITS_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def gguf_f32(client_model, tmp_path_factory):
    return export_gguf(client_model, tmp_path_factory.mktemp("gguf") / "model-f32.gguf", "f32")


def test_llama_cpp_tokenizes_as_the_hf_tokenizer(client_model, gguf_f32):
    tokenizer = AutoTokenizer.from_pretrained(client_model)
    texts = [*TRICKY, validation_text()]
    calls = [("tokenize", text, False, False) for text in texts] + [("tokenize", "ROMEO:", True, False), ("specials",)]
    *tokenized, with_bos, specials = llama_cpp(gguf_f32, calls, n_ctx=2048)
    for text, ids in zip(texts, tokenized, strict=True):
        assert ids == tokenizer(text)["input_ids"], text[:40]
    # add_bos as the HF tokenizer does it: minirope's tokenizer adds no special token to text
    assert with_bos == tokenizer("ROMEO:")["input_ids"]
    assert specials == [tokenizer.bos_token_id, tokenizer.eos_token_id]


def with_pre_tokenizer(client_model, folder, pre_tokenizer):
    """A copy of `client_model` whose tokenizer pre-tokenizes with `pre_tokenizer` (same vocabulary and merges)."""
    shutil.copytree(client_model, folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.save_pretrained(folder)
    return folder


def test_gguf_names_the_pre_tokenizer_and_llama_cpp_follows_it(client_model, gguf_f32, tmp_path):
    """minirope's tokenizer (Llama 3's regex) is `llama-bpe`; a folder trained before 2026-11-24 (GPT-2's regex)
    is `gpt-2`, and llama.cpp tokenizes it as its HF tokenizer does; any other pre-tokenizer is refused."""
    import gguf

    def pre(path):
        field = gguf.GGUFReader(path).fields["tokenizer.ggml.pre"]
        return bytes(field.parts[field.data[0]]).decode()

    assert pre(gguf_f32) == "llama-bpe"
    old = with_pre_tokenizer(client_model, tmp_path / "gpt2", pre_tokenizers.ByteLevel(add_prefix_space=False))
    path = export_gguf(old, tmp_path / "gpt2.gguf", "f32")
    assert pre(path) == "gpt-2"
    tokenizer, texts = AutoTokenizer.from_pretrained(old), [*TRICKY, validation_text()]
    tokenized = llama_cpp(path, [("tokenize", text, False, False) for text in texts], n_ctx=2048)
    for text, ids in zip(texts, tokenized, strict=True):
        assert ids == tokenizer(text)["input_ids"], text[:40]
    text = validation_text()  # the two regexes give different ids (",\n" is one token of minirope's)
    assert tokenizer(text)["input_ids"] != AutoTokenizer.from_pretrained(client_model)(text)["input_ids"]
    other = with_pre_tokenizer(client_model, tmp_path / "other", pre_tokenizers.Whitespace())
    with pytest.raises(ValueError, match="not a byte-level BPE with GPT-2's or Llama 3's pre-tokenizer"):
        export_gguf(other, tmp_path / "other.gguf")
    assert not (tmp_path / "other.gguf").exists()


def test_llama_cpp_logits_match_minirope(client_model, gguf_f32):
    model = MiniRopeForCausalLM.from_pretrained(client_model).eval()
    tokenizer = AutoTokenizer.from_pretrained(client_model)
    ids = [tokenizer.bos_token_id, *tokenizer(validation_text(400))["input_ids"]][:64]
    (theirs,) = llama_cpp(gguf_f32, [("scores", ids)])
    with torch.no_grad():
        ours = model(torch.tensor([ids])).logits[0].numpy()
    assert np.abs(np.array(theirs) - ours).max() < LOGITS_TOLERANCE  # every position, not only the last


SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "rope_theta": 10000.0},
    "llama3": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16, "rope_theta": 10000.0},
}  # fmt: skip


@pytest.mark.parametrize("rope_type", SCALINGS)
def test_llama_cpp_applies_the_rope_scaling(client_model, tmp_path, rope_type):
    """Scaled RoPE survives the trip: llama.cpp's logits equal minirope's at every position up to 4x the
    (pretended) original context, for each scaling GGUF can express."""
    model = MiniRopeForCausalLM.from_pretrained(client_model)
    model.config.rope_parameters = SCALINGS[rope_type]
    model.save_pretrained(tmp_path / "scaled")
    AutoTokenizer.from_pretrained(client_model).save_pretrained(tmp_path / "scaled")
    scaled = MiniRopeForCausalLM.from_pretrained(tmp_path / "scaled").eval()
    ids = torch.randint(3, scaled.config.vocab_size, (64,), generator=torch.Generator().manual_seed(0)).tolist()
    (theirs,) = llama_cpp(export_gguf(tmp_path / "scaled", tmp_path / "scaled.gguf"), [("scores", ids)])
    with torch.no_grad():
        ours = scaled(torch.tensor([ids])).logits[0].numpy()
        unscaled = MiniRopeForCausalLM.from_pretrained(client_model).eval()(torch.tensor([ids])).logits[0].numpy()
    assert np.abs(np.array(theirs) - ours).max() < LOGITS_TOLERANCE
    assert np.abs(unscaled - ours).max() > 1e-2  # the scaling changes the function: the check above can fail


def decided_steps(scores: tuple[torch.Tensor, ...], margin: float) -> int:
    """How many greedy steps from the start have a top-two logit gap above `margin`: the steps whose token another
    implementation, within `margin` of these logits, must pick alike (after the first close call, paths may part)."""
    for step, logits in enumerate(scores):
        top_two = logits[0].topk(2).values
        if top_two[0] - top_two[1] <= margin:
            return step
    return len(scores)


@pytest.mark.parametrize("prompt", ["ROMEO:\n", "KING HENRY:\nOnce more unto the breach", "\n\nFirst Citizen:\n"])
def test_llama_cpp_greedy_generation_is_token_identical(client_model, gguf_f32, prompt):
    """Greedy decoding in llama.cpp picks minirope's tokens at every step whose top-two gap exceeds twice the
    logits tolerance (all 64 here, on the CPUs measured; a close call on another CPU ends the comparison there)."""
    model = MiniRopeForCausalLM.from_pretrained(client_model).eval()
    tokenizer = AutoTokenizer.from_pretrained(client_model)
    prompt_ids = tokenizer(prompt)["input_ids"]
    want = model.generate(
        torch.tensor([prompt_ids]), max_new_tokens=64, min_new_tokens=64, do_sample=False,
        output_scores=True, return_dict_in_generate=True,
    )  # fmt: skip
    decided = decided_steps(want.scores, 2 * LOGITS_TOLERANCE)
    (got,) = llama_cpp(gguf_f32, [("greedy", prompt_ids, 64)], n_ctx=128)
    assert decided >= 32, f"only {decided} of 64 steps have a clear greedy choice: the comparison would be weak"
    assert got[:decided] == want.sequences[0, len(prompt_ids) :].tolist()[:decided]


@pytest.mark.parametrize(("outtype", "bound"), [("f16", 0.01), ("q8_0", 0.1), ("q4_0", 0.5)])
def test_llama_cpp_runs_f16_q8_0_and_q4_0(client_model, tmp_path, outtype, bound):
    """Lower precision: last-position logits stay within `bound` of float32 (measured: see README)."""
    path = export_gguf(client_model, tmp_path / f"model-{outtype}.gguf", outtype)
    tokenizer = AutoTokenizer.from_pretrained(client_model)
    ids = [tokenizer.bos_token_id, *tokenizer(validation_text(400))["input_ids"]][:64]
    (theirs,) = llama_cpp(path, [("scores", ids)])
    with torch.no_grad():
        ours = MiniRopeForCausalLM.from_pretrained(client_model).eval()(torch.tensor([ids])).logits[0, -1].numpy()
    difference = np.abs(np.array(theirs[-1]) - ours).max()
    print(f"{outtype}: max |logit difference| at the last position = {difference:.4f}")
    assert 0 < difference < bound


def test_a_crash_in_llama_cpp_fails_one_test_and_the_suite_goes_on(tmp_path):
    """The child process is what keeps a native crash out of pytest: a file that is no GGUF at all is refused by
    llama.cpp with an error (a failed test, not a dead run)."""
    path = tmp_path / "not.gguf"
    path.write_bytes(b"GGUF" + bytes(60))
    with pytest.raises(pytest.fail.Exception, match="llama.cpp ended with"):
        llama_cpp(path, [("specials",)])


def test_q8_0_export_on_an_amx_cpu_says_what_llama_cpp_may_do_and_what_to_use(
    client_model, tmp_path, monkeypatch, capsys
):
    from minirope.commands import export

    monkeypatch.setattr(export, "cpu_has_amx", lambda: True)
    export.run(["--model", str(client_model), "--format", "gguf", "--output", str(tmp_path / "q8.gguf"), "--outtype",
                "q8_0"])  # fmt: skip
    note = capsys.readouterr().err
    assert "llama.cpp#20824" in note and "--outtype f16" in note and "-mno-amx-int8" in note
    export.run(["--model", str(client_model), "--format", "gguf", "--output", str(tmp_path / "f16.gguf"), "--outtype",
                "f16"])  # fmt: skip
    assert "AMX" not in capsys.readouterr().err  # f16 weights never take llama.cpp's AMX path
    monkeypatch.undo()
    assert export.cpu_has_amx() == (" amx_int8" in open("/proc/cpuinfo").read())


def test_export_refuses_what_it_cannot_write(client_model, tmp_path):
    export_llama(client_model, tmp_path / "out")
    with pytest.raises(FileExistsError, match="--overwrite"):
        export_llama(client_model, tmp_path / "out")
    with pytest.raises(ValueError, match="outtype"):
        export_gguf(client_model, tmp_path / "x.gguf", "q4_k")
    assert not (tmp_path / "x.gguf").exists()
    dynamic = tmp_path / "dynamic"
    model = MiniRopeForCausalLM.from_pretrained(client_model)
    model.config.rope_parameters = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    model.save_pretrained(dynamic)
    AutoTokenizer.from_pretrained(client_model).save_pretrained(dynamic)
    with pytest.raises(ValueError, match="dynamic"):
        export_gguf(dynamic, tmp_path / "dynamic.gguf")
    assert not (tmp_path / "dynamic.gguf").exists()
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith(".")] == []  # no scratch left
    result = subprocess.run(
        [sys.executable, "-m", "minirope.commands.export", "--model", str(tmp_path / "missing"), "--format", "llama",
         "--output", str(tmp_path / "never")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 1 and "minirope-export: error:" in result.stderr
    assert not (tmp_path / "never").exists()


@pytest.fixture(scope="module")
def executorch_f32(client_model, tmp_path_factory):
    pytest.importorskip("executorch")
    return export_executorch(client_model, tmp_path_factory.mktemp("executorch") / "f32")


def runner_text(folder, prompt: str, max_new_tokens: int) -> str:
    """Greedy text from ExecuTorch's own LLM runner (C++ tokenizer, prefill, KV cache; temperature 0)."""
    from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner

    runner = TextLLMRunner(str(folder / "model.pte"), str(folder / "tokenizer.json"))
    pieces = []
    config = GenerationConfig(echo=False, max_new_tokens=max_new_tokens, temperature=0.0)
    runner.generate(prompt, config, token_callback=pieces.append)
    return "".join(pieces)


@pytest.mark.parametrize("prompt", ["ROMEO:\n", "KING HENRY:\nOnce more unto the breach", "\n\nFirst Citizen:\n"])
def test_executorch_runner_generates_generates_greedy_text(client_model, executorch_f32, prompt):
    model = MiniRopeForCausalLM.from_pretrained(client_model).eval()
    tokenizer = AutoTokenizer.from_pretrained(client_model)
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    want = model.generate(ids, max_new_tokens=40, min_new_tokens=40, do_sample=False)[0, ids.shape[1] :]
    assert runner_text(executorch_f32, prompt, 40) == tokenizer.decode(want)


def test_executorch_logits_match_pytorch_and_the_cache_end_is_refused(client_model, executorch_f32, capfd):
    """ExecuTorch's runtime on the `.pte`: prefill and one cached step within 1e-4 of PyTorch; a position past the
    static cache and a prompt longer than it are refused (the runtime and the runner each name the limit)."""
    from executorch.runtime import Runtime

    model = MiniRopeForCausalLM.from_pretrained(client_model).eval()
    length = model.config.max_position_embeddings
    assert json.loads((executorch_f32 / "config.json").read_text())["max_position_embeddings"] == length
    forward = Runtime.get().load_program(executorch_f32 / "model.pte").load_method("forward")
    ids = torch.tensor([AutoTokenizer.from_pretrained(client_model)(validation_text(400))["input_ids"][:20]])
    prefill = forward.execute([ids[:, :19], torch.arange(19)])[0]
    step = forward.execute([ids[:, 19:], torch.tensor([19])])[0]
    with torch.no_grad():
        want = model(ids).logits
    torch.testing.assert_close(torch.cat([prefill, step], dim=1), want, rtol=0, atol=1e-4)
    with pytest.raises(RuntimeError):
        forward.execute([ids[:, :1], torch.tensor([length])])
    assert f"Index {length} is out of bounds" in capfd.readouterr().err
    with pytest.raises(RuntimeError, match="Generation failed"):
        runner_text(executorch_f32, "ROMEO:\n" * length, 4)
    assert f"max_context_len {length}, Max seq length exceeded" in capfd.readouterr().err


@pytest.mark.slow  # 29 s on a 2-core Zen 4: in `make test-slow`, to keep the default run under 15 minutes
def test_executorch_8da8w_is_smaller_and_stays_close(client_model, executorch_f32, tmp_path):
    """int8 weights and dynamic int8 activations (torchao, XNNPACK): a smaller file whose last-position logits stay
    near float32's, refused outtypes name the choices."""
    from executorch.runtime import Runtime

    quantized = export_executorch(client_model, tmp_path / "8da8w", outtype="8da8w", max_cache_len=48)
    assert (quantized / "model.pte").stat().st_size < 0.75 * (executorch_f32 / "model.pte").stat().st_size
    ids = torch.tensor([AutoTokenizer.from_pretrained(client_model)(validation_text(400))["input_ids"][:40]])
    logits = (
        Runtime.get().load_program(quantized / "model.pte").load_method("forward").execute([ids, torch.arange(40)])[0]
    )
    with torch.no_grad():
        want = MiniRopeForCausalLM.from_pretrained(client_model).eval()(ids).logits
    difference = (logits[0, -1] - want[0, -1]).abs().max().item()
    print(f"8da8w: max |logit difference| at the last position = {difference:.4f}")
    assert 0 < difference < 0.1  # measured 0.02
    with pytest.raises(ValueError, match="not one of f32, 8da8w"):
        export_executorch(client_model, tmp_path / "q4", outtype="q4_0")
    assert not (tmp_path / "q4").exists()
