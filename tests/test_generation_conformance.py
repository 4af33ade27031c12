"""Every generate() mode gives the same tokens as transformers' LlamaForCausalLM with the same weights."""

import pytest
import torch
from conftest import llama_twin, random_model, tiny_config
from transformers import GenerationConfig, TextStreamer
from transformers.generation import ContinuousBatchingConfig

from minirope.data.tokenizer import train_tokenizer

PROMPT = torch.tensor([[5, 17, 33, 8, 61, 5, 17, 33]])


@pytest.fixture(scope="module")
def pair():
    model = random_model(tiny_config("gqa"))
    return model, llama_twin(model)


def generate_both(pair, seed: int = 0, **settings) -> tuple[torch.Tensor, torch.Tensor]:
    model, llama = pair
    settings = {"pad_token_id": 0, **settings}
    torch.manual_seed(seed)
    ours = model.generate(PROMPT, **settings)
    torch.manual_seed(seed)
    theirs = llama.generate(PROMPT, **settings)
    return ours, theirs


@pytest.mark.parametrize(
    "settings",
    [
        dict(do_sample=False, max_new_tokens=20),
        dict(do_sample=True, temperature=0.7, top_k=20, top_p=0.9, max_new_tokens=20),
        dict(do_sample=True, temperature=1.3, max_new_tokens=20),
        dict(do_sample=False, num_beams=3, num_return_sequences=2, max_new_tokens=12),
        dict(do_sample=False, repetition_penalty=1.5, max_new_tokens=20),
        dict(do_sample=False, min_new_tokens=15, max_new_tokens=15),
        dict(do_sample=False, prompt_lookup_num_tokens=3, max_new_tokens=20),
        dict(do_sample=False, cache_implementation="static", max_new_tokens=20),
    ],
    ids=[
        "greedy",
        "top-k-top-p",
        "temperature",
        "beam-search",
        "repetition-penalty",
        "min-max-new-tokens",
        "prompt-lookup",
        "static-cache",
    ],
)
def test_generate_mode_matches_llama(pair, settings):
    ours, theirs = generate_both(pair, **settings)
    assert ours.shape[-1] > PROMPT.shape[-1]
    assert torch.equal(ours, theirs)


def test_exact_modes_equal_plain_greedy(pair):
    greedy, _ = generate_both(pair, do_sample=False, max_new_tokens=20)
    for settings in (dict(prompt_lookup_num_tokens=3), dict(cache_implementation="static")):
        ours, _ = generate_both(pair, do_sample=False, max_new_tokens=20, **settings)
        assert torch.equal(ours, greedy), settings


def test_stops_at_eos_like_llama(pair):
    greedy, _ = generate_both(pair, do_sample=False, max_new_tokens=20)
    eos = int(greedy[0, PROMPT.shape[1] + 4])  # the 5th generated token
    first = (greedy[0, PROMPT.shape[1] :] == eos).nonzero()[0, 0].item()
    ours, theirs = generate_both(pair, do_sample=False, max_new_tokens=20, eos_token_id=eos)
    assert torch.equal(ours, theirs)
    assert ours.shape[1] == PROMPT.shape[1] + first + 1 and ours[0, -1] == eos


def test_assisted_decoding_with_a_smaller_minirope(pair):
    model, llama = pair
    assistant = random_model(tiny_config("gqa", num_hidden_layers=1), seed=7)
    greedy, _ = generate_both(pair, do_sample=False, max_new_tokens=20)
    ours = model.generate(PROMPT, assistant_model=assistant, do_sample=False, max_new_tokens=20, pad_token_id=0)
    theirs = llama.generate(
        PROMPT, assistant_model=llama_twin(assistant), do_sample=False, max_new_tokens=20, pad_token_id=0
    )
    assert torch.equal(ours, greedy) and torch.equal(theirs, greedy)


def test_text_streamer_prints_what_generate_returns(capsys):
    tokenizer = train_tokenizer(["To be, or not to be, that is the question."] * 20, vocab_size=300)
    model = random_model(tiny_config("mha", vocab_size=len(tokenizer)))
    inputs = tokenizer("To be", return_tensors="pt")
    output = model.generate(**inputs, streamer=TextStreamer(tokenizer), do_sample=False, max_new_tokens=12)
    printed = capsys.readouterr().out
    assert printed.rstrip("\n") == tokenizer.decode(output[0]).rstrip("\n")
    assert printed.startswith("To be") and len(printed) > len("To be")


def test_compiled_forward_with_static_cache_matches_eager(pair):
    model, _ = pair
    greedy, _ = generate_both(pair, do_sample=False, max_new_tokens=12)
    compiled = random_model(tiny_config("gqa"))  # same seed: same weights
    compiled.forward = torch.compile(compiled.forward, fullgraph=True, dynamic=False)
    ours = compiled.generate(PROMPT, do_sample=False, max_new_tokens=12, cache_implementation="static", pad_token_id=0)
    assert torch.equal(ours, greedy[:, : ours.shape[1]])


@pytest.mark.parametrize("attn", ["sdpa", "paged|eager"])
def test_continuous_batching_generates_as_llama_and_as_plain_greedy(pair, attn):
    """transformers' continuous batching (`generate_batch`: prompts of different lengths packed into one row, a
    `PagedAttentionCache`, positions given per token; what `transformers serve --continuous-batching` and TRL's
    `use_transformers_continuous_batching` run) gives Llama's tokens, and each prompt's greedy `generate()` tokens."""
    model, _ = pair
    paged = random_model(tiny_config("gqa"), attn=attn)  # same seed: the pair's weights
    prompts = [PROMPT[0].tolist(), [9, 4, 22], [3, 14, 15, 92, 65, 35]]
    config = GenerationConfig(do_sample=False, max_new_tokens=12, pad_token_id=0)
    pages = ContinuousBatchingConfig(page_size=16, num_blocks=16, max_batch_tokens=64)  # sized for the prompts
    ours, theirs = (
        {
            tuple(out.prompt_ids): out.generated_tokens
            for out in each.generate_batch(
                prompts, config, continuous_batching_config=pages, progress_bar=False
            ).values()
        }
        for each in (paged, llama_twin(paged, attn=attn))
    )
    for prompt in prompts:
        greedy = model.generate(torch.tensor([prompt]), generation_config=config)[0, len(prompt) :].tolist()
        assert len(greedy) == 12
        assert ours[tuple(prompt)] == theirs[tuple(prompt)] == greedy
