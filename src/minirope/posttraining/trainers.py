"""minirope's TRL trainers: TRL's `GRPOTrainer`, `DPOTrainer` and `DistillationTrainer` (and the warm start's
`SFTTrainer`) with the two things minirope adds to their steps, as mixins, and minirope's output folder (`OwnFolder`).

- `CorpusTerm`: the corpus term (`--lm_coef`, `minirope.posttraining.corpus`). TRL offers no hook for an auxiliary
  loss (its `aux_loss` is a mixture-of-experts router's), so it adds its own backward pass after the host trainer's
  public `training_step`, divided by the gradient-accumulation steps of the optimizer step: the term's gradient is
  the mean over the step's micro-batches, whatever the host does with its own loss (TRL 1.16's GRPO and distillation
  scale theirs inside `compute_loss`, DPO leaves it to the Trainer). `tests/test_posttrain.py` checks that
  accumulation 1 and 2 give the same update. The blocks come shuffled, from a data loader prepared by the trainer's
  accelerator (each process its share); `lm_loss` is logged with TRL's metrics (`_metrics`, TRL's own store).
- `MergedRollouts`: a LoRA model's completions sampled on its merged adapter (`sampling.merged_adapter`). TRL has
  no public hook around its generation, so this is the one override of a private TRL method,
  `_generate_single_turn`; `tests/test_posttrain.py` fails when a TRL release renames it or stops calling it.
"""

import torch
from torch.utils.data import DataLoader
from trl import DistillationTrainer, DPOTrainer, GRPOTrainer, SFTTrainer

from minirope.output.folder import OwnFolder
from minirope.posttraining.sampling import merged_adapter


class CorpusTerm:
    """A TRL trainer mixin: after the host's `training_step`, a backward pass of `lm_coef` times the mean
    language-modelling loss of a batch of corpus blocks, divided by the step's gradient-accumulation count."""

    corpus_batches = None

    def set_corpus(self, blocks: torch.Tensor, lm_coef: float, lm_batch_size: int, seed: int) -> None:
        """Mix `blocks` (`(N, T)` int64) into each update with weight `lm_coef`, `lm_batch_size` blocks a micro-batch,
        reshuffled every pass (seeded)."""
        generator = torch.Generator().manual_seed(seed)
        loader = DataLoader(blocks, batch_size=lm_batch_size, shuffle=True, drop_last=True, generator=generator)
        self.lm_coef, self.corpus_loader = lm_coef, self.accelerator.prepare_data_loader(loader)
        self.corpus_batches = self.next_batches()

    def next_batches(self):
        while True:
            yield from self.corpus_loader

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        if self.corpus_batches is None:
            return loss
        batch = next(self.corpus_batches)
        with self.compute_loss_context_manager():
            lm_loss = model(input_ids=batch, labels=batch).loss
        self.accelerator.backward(self.lm_coef * lm_loss / self.current_gradient_accumulation_steps)
        # every process's loss (gather_for_metrics would drop some as the last batch of an evaluation)
        self._metrics["train"]["lm_loss"].append(self.accelerator.gather(lm_loss.detach()).mean().item())
        return loss


class MergedRollouts:
    """A mixin for TRL's `GRPOTrainer` and `DistillationTrainer`: each batch of completions generated with the adapter
    merged (`merged_adapter`: with `--lora_dropout 0`), where TRL generates them with transformers (not with vLLM,
    which merges by itself)."""

    def _generate_single_turn(self, *args, **kwargs):
        if self.use_vllm:
            return super()._generate_single_turn(*args, **kwargs)
        with merged_adapter(self.model):
            return super()._generate_single_turn(*args, **kwargs)


class MiniRopeGRPOTrainer(OwnFolder, CorpusTerm, MergedRollouts, GRPOTrainer):
    """TRL's `GRPOTrainer`, with the corpus term of `CorpusTerm`, a LoRA model's rollouts on its merged adapter
    (`MergedRollouts`) and minirope's output folder."""


class MiniRopeDPOTrainer(OwnFolder, CorpusTerm, DPOTrainer):
    """TRL's `DPOTrainer`, with the corpus term of `CorpusTerm` and minirope's output folder."""


class MiniRopeDistillationTrainer(OwnFolder, CorpusTerm, MergedRollouts, DistillationTrainer):
    """TRL's `DistillationTrainer`, with the corpus term of `CorpusTerm`, a LoRA student's completions on its merged
    adapter (`MergedRollouts`) and minirope's output folder."""


class MiniRopeSFTTrainer(CorpusTerm, SFTTrainer):
    """TRL's `SFTTrainer` (the warm start), with the corpus term of `CorpusTerm`."""
