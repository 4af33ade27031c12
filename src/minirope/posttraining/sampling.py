"""Sampling the model's completions of held-out prompts, as every measure and DPO's own pairs take them: each prompt
read once for all its samples (`shared_prefill`), on the main process of a distributed run and shared with the
others (`on_main_process`), a LoRA model on its merged adapter (`merged_adapter`), in the run's precision,
with `SAMPLING` or `GREEDY` whatever the folder's generation config says.

A LoRA model samples at its base model's cost: the adapter merged into the base weights while the
model generates (the held-out measures; GRPO's rollouts and distillation's on-policy completions where LoRA has no
dropout, `--lora_dropout 0`) and unmerged before the next gradient.

Unmerged, every LoRA layer of a decoding step runs three matmuls instead of one (the base's, `x @ A.T`, then
`@ B.T`), a dropout and a sum, a few more kernel launches per layer per token: with LoRA on SmolLM2-135M's 210
linear layers a batch-16 rollout took 214-236 ms a token against 161-178 ms for the model without its adapter
(2-core Zen 3, float32; docs/studies/posttrain_speed.md). Merged, the layers compute `x @ (W + s B A).T`, the same
function in one product. Merging and unmerging cost a pass over the adapted weights each (0.4 s each for SmolLM2
there), once per rollout, not per token. TRL does the same (`merge_adapter`, then `unmerge_adapter`) each time it
sends a LoRA model's weights to vLLM.
"""

import functools
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

import torch
from accelerate import PartialState
from accelerate.utils import broadcast_object_list
from datasets import Dataset
from transformers import PreTrainedTokenizerBase
from transformers.cache_utils import DynamicCache
from trl.data_utils import is_conversational

from minirope.compat_minirope import cache_keyword
from minirope.training.precision import run_autocast

SAMPLING = {"do_sample": True, "temperature": 0.8, "top_k": 50, "top_p": 1.0}
GREEDY = {"do_sample": False, "temperature": None, "top_k": None, "top_p": None}
T = TypeVar("T")


@dataclass
class Samples:
    """Completions of prompts: `per_prompt` of each of `prompt_rows`, in order (`completions[i * per_prompt + k]`
    answers `prompt_rows[i]`); `rows` repeats each row once per completion, as TRL hands rows to its rewards."""

    prompt_rows: list[dict]
    per_prompt: int
    completions: list
    completion_ids: list[list[int]]
    ended: list[bool] = field(default_factory=list)  # each completion's: ended by its own end-of-sequence token

    @property
    def cut_share(self) -> float | None:
        """The share of completions cut at the token limit before they ended: replies a reward reads unfinished."""
        return 1 - sum(self.ended) / len(self.ended) if self.ended else None

    @property
    def rows(self) -> Dataset:
        return Dataset.from_list([row for row in self.prompt_rows for _ in range(self.per_prompt)])

    def group(self, index: int) -> tuple[Dataset, list, list[list[int]]]:
        """Prompt `index`'s share, as `rows`, `completions` and `completion_ids` give all prompts': its row once per
        completion, its completions and their token ids."""
        span = slice(index * self.per_prompt, (index + 1) * self.per_prompt)
        rows = Dataset.from_list([self.prompt_rows[index]] * self.per_prompt)
        return rows, self.completions[span], self.completion_ids[span]


def prompt_text(prompt, tokenizer: PreTrainedTokenizerBase) -> str:
    """A prompt as the model reads it: plain text as it is, a conversation through the chat template with the
    assistant's turn opened (as TRL renders conversational prompts)."""
    if isinstance(prompt, str):
        return prompt
    return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)


def on_main_process(work: Callable[..., T]) -> Callable[..., T]:
    """`work` run on the main process, its result sent to every process (`accelerate.utils.broadcast_object_list`);
    run in place with one process. `work` must not wait on the other processes (no collective inside it)."""

    @functools.wraps(work)
    def shared(*args, **kwargs) -> T:
        state = PartialState()
        if state.num_processes == 1:
            return work(*args, **kwargs)
        result = [work(*args, **kwargs) if state.is_main_process else None]
        broadcast_object_list(result, from_process=0)
        return result[0]

    return shared


def shared_prefill(model, inputs: dict, per_prompt: int) -> dict:
    """`generate()`'s inputs for `per_prompt` completions of each of a batch of left-padded prompts, each prompt read
    once: its tokens but the last go through the model into a `DynamicCache` (positions from the attention mask, as
    `generate()` counts them), the cache is repeated `per_prompt` times (`Cache.batch_repeat_interleave`) and
    `generate()` continues from it: the prompts' prefill costs `1 / per_prompt` of `num_return_sequences`'s, and the
    tokens are the same (transformers' prompt reuse, "Re-use cache to continue generation"; SmolLM2-135M-Instruct,
    32 prompts sampled 8 times: 53.7 -> 36.8 s on a 2-core Zen 3, every token equal).

    `inputs`: the tokenizer's `input_ids` and `attention_mask`, `(B, T)`; returns them `(B * per_prompt, T)`, row `i`
    of the batch repeated at rows `i * per_prompt ... (i + 1) * per_prompt - 1` (as `num_return_sequences` orders
    them), with the cache under transformers' keyword for it (`cache_keyword`). With one completion a prompt, or
    one-token prompts, the inputs with `num_return_sequences` as they are."""
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    if per_prompt == 1 or ids.shape[1] < 2:
        return {**inputs, "num_return_sequences": per_prompt}
    cache = DynamicCache(config=model.config)
    positions = (mask[:, :-1].cumsum(-1) - 1).clamp(min=0)
    model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], position_ids=positions, use_cache=True, logits_to_keep=1,
          **cache_keyword(cache))  # fmt: skip
    cache.batch_repeat_interleave(per_prompt)
    repeated = {"input_ids": ids, "attention_mask": mask}
    return {**{name: tensor.repeat_interleave(per_prompt, dim=0) for name, tensor in repeated.items()},
            **cache_keyword(cache)}  # fmt: skip


def end_of_sequence_ids(model, tokenizer) -> set[int]:
    """The tokens that end a completion: the generation config's `eos_token_id` (one or a list, as TRL reads them)
    and the tokenizer's."""
    configured = model.generation_config.eos_token_id
    configured = configured if isinstance(configured, list) else [configured]
    return {token for token in [*configured, tokenizer.eos_token_id] if token is not None}


@on_main_process
@torch.no_grad()
def sample(
    model,
    tokenizer,
    rows: Dataset,
    per_prompt: int,
    max_new_tokens: int,
    seed: int,
    settings: dict,
    run=None,
    batch: int = 256,
) -> Samples:
    """`per_prompt` completions of each row's `prompt` with `generate()` and `settings` (`SAMPLING` or `GREEDY`),
    seeded, in the precision the run trains in (`run`: the method's TRL config, whose bf16 or fp16 applies under
    autocast as in its trainer's forward; None: float32; `run_autocast`); prompts go left-padded, as many at a time
    as make at most `batch` sequences, each read once for all its completions (`shared_prefill`). A completion ends
    at its first end-of-sequence token, which its token ids keep and its text (decoded without special tokens) does
    not; conversational prompts get conversational completions (`[{"role": "assistant", "content": text}]`): all as
    TRL's `GRPOTrainer` gives them to rewards. On a CPU with native bf16 matmuls (2-core Zen 5), a bf16 run's
    measures take 0.5-0.75x float32's time on SmolLM2 (docs/studies/posttrain_speed.md).

    A LoRA model samples on its merged adapter (`merged_adapter`). On several processes (DDP: `accelerate launch`,
    torchrun) the main process samples and every process gets its samples (`on_main_process`): every process scores
    the same completions and takes the same decisions from them, and the sampling is not repeated on each."""
    model.eval()
    torch.manual_seed(seed)
    prompt_rows = rows.to_list()
    with merged_adapter(model), run_autocast(run, model.device.type):
        ids, ended = completion_ids(model, tokenizer, prompt_rows, per_prompt, max_new_tokens, settings, batch)
    texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
    conversational = bool(prompt_rows) and is_conversational(prompt_rows[0])
    completions = [[{"role": "assistant", "content": text}] for text in texts] if conversational else texts
    return Samples(prompt_rows, per_prompt, completions, ids, ended)


def completion_ids(
    model, tokenizer, prompt_rows: list[dict], per_prompt: int, max_new_tokens: int, settings: dict, batch: int
) -> tuple[list[list[int]], list[bool]]:
    """`sample`'s token ids, each completion's up to and including its first end-of-sequence token, and
    whether it has one (False: cut at `max_new_tokens`)."""
    eos = end_of_sequence_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    ids, ended = [], []
    try:
        step = max(1, batch // per_prompt)
        for first in range(0, len(prompt_rows), step):
            prompts = [prompt_text(row["prompt"], tokenizer) for row in prompt_rows[first : first + step]]
            inputs = tokenizer(prompts, return_tensors="pt", padding=True).to(model.device)
            out = model.generate(**shared_prefill(model, inputs, per_prompt), **settings, max_new_tokens=max_new_tokens,
                                 pad_token_id=pad)  # fmt: skip
            for row in out[:, inputs["input_ids"].shape[1] :].tolist():
                end = next((place for place, token in enumerate(row) if token in eos), None)
                ids.append(row if end is None else row[: end + 1])
                ended.append(end is not None)
    finally:
        tokenizer.padding_side = side
    return ids, ended


def lora_layers(model) -> list:
    """`model`'s LoRA layers (peft's `LoraLayer`s); none for a model without them."""
    from peft.tuners.lora import LoraLayer

    return [module for module in model.modules() if isinstance(module, LoraLayer)]


def lora_base_weights(model) -> list[torch.Tensor]:
    """The base weights under `model`'s LoRA layers."""
    return [layer.get_base_layer().weight for layer in lora_layers(model)]


def mergeable(model) -> bool:
    """Whether merging `model`'s adapter leaves its base weights as they were after unmerging, up to float32
    rounding: a peft model whose adapted base weights are plain float32 tensors.

    Not for bf16 or float16 weights, where adding the adapter's small update and taking it away again rounds at a
    relative 2**-9 or 2**-11 each time and the base would drift over a run; not for quantized ones (QLoRA: the
    merge would round the update into the quantization), nor for weights sharded by FSDP (DTensors) or DeepSpeed
    ZeRO-3 (placeholders), which peft cannot merge in place."""
    if not hasattr(model, "merge_adapter"):
        return False
    weights = lora_base_weights(model)
    return bool(weights) and all(
        type(weight.data) is torch.Tensor and weight.dtype == torch.float32 and weight.numel() > 0 for weight in weights
    )


def dropped_out(model) -> bool:
    """Whether `model`'s LoRA layers apply dropout now: in training mode with a `lora_dropout` above 0."""
    return model.training and any(
        not isinstance(dropout, torch.nn.Identity)
        for layer in lora_layers(model)
        for dropout in layer.lora_dropout.values()
    )


@contextmanager
def merged_adapter(model):
    """While the block runs, `model`'s LoRA adapter merged into its base weights (peft's `merge_adapter`); unmerged
    after it, an exception included (`unmerge_adapter`). A model that is not `mergeable` runs as it is, and so does
    one whose LoRA layers apply dropout now (`dropped_out`: TRL's rollouts run in training mode, so with a
    `lora_dropout` above 0 they sample from dropped-out adapters, which a merged model cannot do; sampling without
    that dropout changed what GRPO learned: on docs/pretrained.md's largest-of-three task with SmolLM2, seeds 1 and 2
    gained +7.5 and +18.5 points on 200 other problems against +38.0 and +25.5 with it).

    Merged, the model computes the same function (a product of the summed weight instead of the sum of the matmuls:
    float32 rounding differences only; the greedy tokens of SmolLM2-135M with a random adapter were all equal).
    After unmerging, each base weight is back within float32 rounding of where it was (relative 1.3e-7 after 200
    merges of a moving adapter on SmolLM2).
    """
    if not mergeable(model) or dropped_out(model):
        yield model
        return
    model.merge_adapter()
    try:
        yield model
    finally:
        model.unmerge_adapter()
