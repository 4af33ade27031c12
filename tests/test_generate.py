"""The stock generate() works on minirope: the KV cache changes nothing, and Llama generates the same."""

import pytest
import torch
from conftest import llama_twin, random_model, tiny_config


def test_greedy_with_cache_equals_without_cache_and_equals_llama(layout):
    model = random_model(tiny_config(layout))
    llama = llama_twin(model)
    prompt = torch.randint(3, model.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(5))
    # 40 new tokens from a 6-token prompt runs past max_position_embeddings=32: the cos/sin cache grows
    settings = dict(max_new_tokens=40, do_sample=False, min_new_tokens=40, pad_token_id=0)
    cached = model.generate(prompt, use_cache=True, **settings)
    uncached = model.generate(prompt, use_cache=False, **settings)
    from_llama = llama.generate(prompt, use_cache=True, **settings)
    assert cached.shape == (2, 46)
    assert torch.equal(cached, uncached)
    assert torch.equal(cached, from_llama)
    assert len(set(cached[0, 6:].tolist())) > 3  # not a degenerate repetition of one token


def test_left_padded_batch_generates_as_each_prompt_alone():
    model = random_model(tiny_config("gqa"))
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12, 13]]
    batch = torch.tensor([prompts[0], [0, 0, 0, *prompts[1]]])
    mask = torch.tensor([[1] * 6, [0, 0, 0, 1, 1, 1]])
    settings = dict(max_new_tokens=10, do_sample=False, pad_token_id=0)
    together = model.generate(batch, attention_mask=mask, **settings)
    for row, prompt in enumerate(prompts):
        alone = model.generate(torch.tensor([prompt]), **settings)
        assert together[row, -10:].tolist() == alone[0, -10:].tolist()


def test_generate_does_not_rebuild_the_forward_signature_at_every_token(monkeypatch):
    """minirope is registered custom code, for which transformers' generate() reads `inspect.signature(forward)` at
    each step; the signature is computed once per class (`MiniRopeLoadingMixin.__init_subclass__`), not per token."""
    import inspect

    model = random_model(tiny_config())
    built = []
    build = inspect._signature_from_function
    monkeypatch.setattr(inspect, "_signature_from_function", lambda *a, **k: built.append(a[1]) or build(*a, **k))
    model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=20, min_new_tokens=20, do_sample=False, pad_token_id=0)
    assert model.is_remote_code()
    assert sum(getattr(f, "__name__", "") == "forward" for f in built) < 5  # 20 or more without the cache


def test_minirope_generate_says_once_when_the_text_reaches_past_the_trained_context(tiny_pretrained, capsys):
    """A prompt and new tokens past `max_position_embeddings` (32 for the tiny model) get one notice on stderr, with
    the trained length and `minirope-extend`; text that fits gets none (issue 46)."""
    from minirope.commands import generate

    base = ["--model", str(tiny_pretrained), "--measured_matmuls", "False", "--do_sample", "False"]
    generate.run([*base, "--prompt", "ROMEO:", "--max_new_tokens", "4"])
    assert "[minirope] the prompt" not in capsys.readouterr().err
    generate.run([*base, "--prompt", "ROMEO: " * 20, "--max_new_tokens", "4"])
    notices = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[minirope] the prompt")]
    assert len(notices) == 1 and "past the 32 this model was trained on" in notices[0]
    assert "minirope-extend" in notices[0]


def test_minirope_generate_chat_prints_the_reply_alone_as_the_template_and_generate_give_it(tiny_pretrained, capsys):
    """`--chat --system`: the conversation through the tokenizer's chat template, the assistant's turn opened; what is
    printed is `generate()`'s greedy continuation of that text, decoded without special tokens, and nothing of the
    prompt or the template. Without a template, --chat is one line naming the fix; --system without --chat too."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from minirope.commands import generate

    messages = [{"role": "system", "content": "Speak verse."}, {"role": "user", "content": "Who goes there?"}]
    tokenizer = AutoTokenizer.from_pretrained(tiny_pretrained)
    model = AutoModelForCausalLM.from_pretrained(tiny_pretrained).eval()
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    inputs = tokenizer(text, add_special_tokens=False, return_tensors="pt")
    out = model.generate(**inputs, max_new_tokens=6, do_sample=False)
    reply = tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    generate.run(["--model", str(tiny_pretrained), "--measured_matmuls", "False", "--do_sample", "False", "--chat",
                  "--system", "Speak verse.", "--prompt", "Who goes there?", "--max_new_tokens", "6"])  # fmt: skip
    printed = capsys.readouterr().out
    assert printed.strip() == reply.strip() and "Who goes there?" not in printed and "Speak verse." not in printed
    with pytest.raises(ValueError, match="--system is a chat message: pass --chat too"):
        generate.run(["--model", str(tiny_pretrained), "--prompt", "x", "--system", "Speak verse."])
