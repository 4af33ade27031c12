"""DPO on a minirope model, as TRL's `trl/scripts/dpo.py` runs it: the task's preference pairs, or pairs of the
model's own samples ranked by the rewards (`own_preference_pairs`), TRL's `DPOTrainer` with the corpus term and
`KeepBest`, the best weights kept. `minirope-posttrain dpo` (or `--method dpo`) parses the flags and calls
`post_train`; the steps every method shares are `setup`'s.
"""

from dataclasses import dataclass, field
from pathlib import Path

from accelerate import PartialState
from datasets import Dataset

from minirope import owned
from minirope.output.folder import begin_writing
from minirope.posttraining.arguments import PosttrainArguments
from minirope.posttraining.configs import PosttrainDPOConfig, PosttrainModelConfig
from minirope.posttraining.report import TimeSplit
from minirope.posttraining.reward_calls import REJECTED_BY, own_pairs
from minirope.posttraining.sampling import SAMPLING, sample
from minirope.posttraining.setup import attach, finish, start, trainer_inputs
from minirope.posttraining.trainers import MiniRopeDPOTrainer

OWN_PAIR_PROMPTS = 4096  # --num_prompts' default for the prompts of its own pairs
PAIRS_FILE = "preference_pairs.jsonl"  # in the output folder, for the user to read and reuse


@dataclass
class DPOScriptArguments(PosttrainArguments):
    """`minirope-posttrain dpo`'s script arguments: preference rows, or prompts whose own samples it ranks into pairs
    by the rewards (then needed), and a run on those may warm-start on the rows' answers."""

    card_tag = "dpo"
    advice = ("--learning_rate", "--num_train_epochs", "--samples_per_prompt")  # what to change when nothing gained
    answer_warm_start = True
    takes_pairs = True
    num_prompts: int | None = field(
        default=None,
        metadata={
            "help": "At most this many training prompts. Default: every row of a preference file; for own pairs "
            f"the first {OWN_PAIR_PROMPTS} prompts; a bundled task's recipe sets its own."
        },
    )
    samples_per_prompt: int | None = field(
        default=None,
        metadata={"help": "Own pairs: samples of each prompt ranked into one. Default: recipes/dpo.yaml's."},
    )
    min_reward_margin: float | None = field(
        default=None,
        metadata={
            "help": "Own pairs: keep a prompt's best and worst samples as a pair only when their rewards differ "
            "by at least this (for a reward in [0, 1] that counts a reply's lines, 0.5 keeps a chosen with two of "
            "three lines rewarded against a rejected with none). Default: recipes/dpo.yaml's."
        },
    )
    rejected_by: str | None = field(
        default=None,
        metadata={
            "help": "Own pairs: the sample a pair rejects, against the best by the rewards' sum: `sum`, the "
            "worst by the sum, or `first_reward`, the worst by the first of --reward_funcs (ties to the lower sum). "
            "Default: recipes/dpo.yaml's, or the --task recipe's with its own rewards.",
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.samples_per_prompt is not None and self.samples_per_prompt < 2:
            raise ValueError(f"--samples_per_prompt must be >= 2 to rank a pair, got {self.samples_per_prompt}: e.g. 8")
        if self.rejected_by is not None and self.rejected_by not in REJECTED_BY:
            raise ValueError(f"--rejected_by {self.rejected_by!r} is not one of {', '.join(REJECTED_BY)}.")

    @property
    def prompt_limit(self) -> int | None:
        """`--num_prompts`, or for its own pairs' prompts `OWN_PAIR_PROMPTS`."""
        return self.num_prompts if self.num_prompts is not None else OWN_PAIR_PROMPTS

    def check_task(self, task) -> None:
        if task.train is None:  # no preference rows: pairs of its own samples, ranked by the rewards
            self.require_rewards("ranks its own samples by")

    def trainer_line(self, summary: dict) -> str:
        return "TRL's DPOTrainer"

    def rejected_by_used(self, task) -> str | None:
        return self.rejected_by if task.train is None else None


ARGUMENTS = (DPOScriptArguments, PosttrainDPOConfig, PosttrainModelConfig)  # TrlParser's, as trl dpo's


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


def post_train(args, config, model_args, split: TimeSplit) -> dict:
    """Check, measure, warm-start, build the pairs where the data has none, train with DPO, keep, measure, write: the
    run summary.

    Raises:
        ValueError, OSError: see `setup.prepare` and `own_preference_pairs`; nothing is written.
    """
    run, before, keep = start(args, config, model_args, split)
    begin_writing(config.output_dir, "minirope-posttrain", resuming=run.resume is not None)
    pairs = run.data.train if run.data.train is not None else own_preference_pairs(run, args, config)
    dpo = MiniRopeDPOTrainer(**trainer_inputs(run, config, pairs))
    return finish(attach(dpo, run, args, keep), run, args, before, keep, split)
