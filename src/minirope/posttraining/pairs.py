"""DPO without preference data: pairs from the model's own samples, ranked by the rewards (`rewards.own_pairs`)."""

from pathlib import Path

from accelerate import PartialState
from datasets import Dataset

from minirope import owned
from minirope.posttraining.reward_calls import own_pairs
from minirope.posttraining.sampling import SAMPLING, sample

PAIRS_FILE = "preference_pairs.jsonl"  # in the output folder, for the user to read and reuse


def own_preference_pairs(setup, args, config) -> Dataset:
    """Pairs from `--samples_per_prompt` samples of each of the run's pair prompts (`TaskData.pair_prompts`), ranked
    by the rewards' sum (`--reward_weights`), a pair kept where the two differ by `--min_reward_margin`, the rejected
    chosen by `--rejected_by`; written to `<output_dir>/preference_pairs.jsonl`.

    Raises:
        ValueError: no prompt's samples differ in reward by the margin (naming the flags to change).
    """
    samples = sample(setup.model, setup.tokenizer, setup.data.pair_prompts, args.samples_per_prompt,
                     args.eval_max_new_tokens, config.seed, SAMPLING, config)  # fmt: skip
    pairs = own_pairs(samples, setup.rewards, args.min_reward_margin, config.reward_weights, args.rejected_by)
    if not pairs:
        raise ValueError(f"no preference pairs: no prompt's samples differ in reward by --min_reward_margin "
                         f"{args.min_reward_margin} or more; lower it, raise --samples_per_prompt or --num_prompts, or "
                         f"give preference pairs as data.")  # fmt: skip
    path, dataset = Path(config.output_dir) / PAIRS_FILE, Dataset.from_list(pairs)
    if PartialState().is_main_process:  # every process ranks the same samples (`sample`): one writes them
        path.parent.mkdir(parents=True, exist_ok=True)
        owned.record(path.parent, "minirope-posttrain", [PAIRS_FILE])  # the run's own, before it is written
        dataset.to_json(path, lines=True)
        print(f"[minirope] {len(pairs)} preference pairs from the model's own samples: {path}")
    return dataset
