"""TRL: `SFTTrainer` fine-tunes a minirope folder given by its path, as in the README, and saves a folder
that reloads (with minirope installed, and as remote code); `GRPOTrainer` samples through transformers' continuous
batching."""

import pytest
import torch
from datasets import Dataset
from test_docs import length_reward
from transformers import AutoModelForCausalLM

from minirope.data.bundled import shakespeare_dataset

pytestmark = pytest.mark.client


def test_sft_trainer_trains_from_a_folder_path_and_saves_a_folder_that_reloads(tiny_pretrained, tmp_path):
    trl = pytest.importorskip("trl")
    play = shakespeare_dataset()["validation"]["text"][0]
    speeches = [speech for speech in play.split("\n\n") if len(speech) > 40][:64]
    config = trl.SFTConfig(
        output_dir=str(tmp_path / "sft"),
        max_steps=8,
        per_device_train_batch_size=8,
        learning_rate=1e-3,
        max_length=32,
        logging_steps=2,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,  # TRL's default is bf16; float32 is the fast precision on CPUs without AVX-512 BF16
        model_init_kwargs={"trust_remote_code": True},
    )
    trainer = trl.SFTTrainer(
        model=str(tiny_pretrained), args=config, train_dataset=Dataset.from_dict({"text": speeches})
    )
    before = {name: param.detach().clone() for name, param in trainer.model.named_parameters()}
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 4 and all(torch.isfinite(torch.tensor(losses)))
    assert any(not torch.equal(before[name], param) for name, param in trainer.model.named_parameters())

    trainer.save_model(str(tmp_path / "saved"))
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "saved", trust_remote_code=True).eval()
    trained = trainer.model.state_dict()
    for name, param in reloaded.state_dict().items():
        assert torch.equal(param, trained[name]), name
    assert (tmp_path / "saved" / "modeling_minirope.py").is_file()  # still loads where minirope is not installed


def test_grpo_trainer_samples_through_transformers_continuous_batching(tiny_pretrained, tmp_path):
    """TRL's `use_transformers_continuous_batching`: the rollouts come from `generate_batch` (a paged cache, positions
    given per token), which minirope's forward used to reject; GRPO then trains on them."""
    trl = pytest.importorskip("trl")
    prompts = ["To be, or not", "Who's there?", "My lord, I", "Good night, sweet"]
    config = trl.GRPOConfig(
        output_dir=str(tmp_path / "grpo"),
        max_steps=2,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        use_transformers_continuous_batching=True,
        transformers_continuous_batching_config={"num_blocks": 16, "page_size": 16},  # unsized: the RAM's half
        model_init_kwargs={"trust_remote_code": True},
    )
    trainer = trl.GRPOTrainer(
        model=str(tiny_pretrained),
        reward_funcs=length_reward,
        args=config,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
    )
    before = {name: param.detach().clone() for name, param in trainer.model.named_parameters()}
    trainer.train()
    lengths = [
        entry["completions/mean_length"] for entry in trainer.state.log_history if "completions/mean_length" in entry
    ]
    assert len(lengths) == 2 and all(length > 0 for length in lengths)
    assert any(not torch.equal(before[name], param) for name, param in trainer.model.named_parameters())
