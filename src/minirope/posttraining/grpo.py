"""GRPO on a minirope model, as TRL's `trl/scripts/grpo.py` runs it: the task's prompts and rewards, TRL's
`GRPOTrainer` with the corpus term and `KeepBest`, the best weights kept. `minirope-posttrain grpo` (or `--method
grpo`) parses the flags and calls `post_train`; the steps every method shares are `setup`'s.

Before any GRPO step the run checks that the rewards give the method something to learn from (`check_signal`) and
warns when a reward can be gamed by replies that never end (`check_cut`).
"""

from dataclasses import dataclass, field

from minirope.output.folder import begin_writing
from minirope.posttraining.arguments import PosttrainArguments
from minirope.posttraining.configs import PosttrainGRPOConfig, PosttrainModelConfig
from minirope.posttraining.measures import SIGNAL_SAMPLES
from minirope.posttraining.report import TimeSplit
from minirope.posttraining.reward_calls import reward_name
from minirope.posttraining.setup import attach, finish, start, trainer_inputs
from minirope.posttraining.trainers import MiniRopeGRPOTrainer

CUT_SHARE = 0.25  # of the held-out samples cut at the token limit: from here `check_cut` warns of a gameable reward
OVERLONG = "soft_overlong_punishment_reward"  # the name of TRL's `get_soft_overlong_punishment` reward


@dataclass
class GRPOScriptArguments(PosttrainArguments):
    """`minirope-posttrain grpo`'s script arguments, as `trl/scripts/grpo.py`'s `GRPOScriptArguments`: the rewards are
    needed, and a run may warm-start on the rows' answers."""

    card_tag = "grpo"
    advice = ("--learning_rate", "--max_steps", "--num_generations")  # what to change when nothing was gained
    answer_warm_start = True
    require_reward_spread: bool = field(
        default=True,
        metadata={
            "help": "Refuse to train when every held-out prompt's sampled completions score alike (GRPO learns "
            "only from the differences within a prompt's group, so its steps would change nothing); False trains "
            "anyway."
        },
    )

    def check_task(self, task) -> None:
        self.require_rewards("trains on")

    def trainer_line(self, summary: dict) -> str:
        return f"TRL's GRPOTrainer with {', '.join(summary['reward_funcs'])}"


ARGUMENTS = (GRPOScriptArguments, PosttrainGRPOConfig, PosttrainModelConfig)  # TrlParser's, as trl grpo's


def post_train(args, config, model_args, split: TimeSplit) -> dict:
    """Check, measure, warm-start, train with GRPO, keep, measure, write: the run summary.

    Raises:
        ValueError, OSError: see `setup.prepare` and `check_signal`; nothing is written.
    """
    run, before, keep = start(args, config, model_args, split)
    starting = run.warm.measured if run.warm else before  # the measures of what GRPO starts from
    check_signal(starting, args, warm_started=bool(run.warm))
    check_cut(starting, run.rewards, run.data.cut_by_design)
    begin_writing(config.output_dir, "minirope-posttrain", resuming=run.resume is not None)
    grpo = MiniRopeGRPOTrainer(reward_funcs=run.rewards, **trainer_inputs(run, config, run.data.train))
    return finish(attach(grpo, run, args, keep), run, args, before, keep, split)


def check_signal(measured, args, warm_started: bool = False) -> None:
    """GRPO's advantage is a completion's reward against the other completions of its prompt: a group whose
    completions all score alike teaches nothing (TRL's `frac_reward_zero_std`). From the measures just taken
    (`TaskMeasure.alike_share`, the `--num_generations_eval` samples of each held-out prompt, when there are at
    least `SIGNAL_SAMPLES`), print the share of such prompts when at least half are, before any GRPO step.

    Prompts whose samples all score full credit are solved, not failing (`TaskMeasure.solved_share`): when every
    held-out prompt is, the run says the task is already solved there.

    Raises:
        ValueError: every held-out prompt's samples score alike (unless `--require_reward_spread False`, or after a
            warm start, whose model is not to be lost), naming the flags that give the run something to learn from,
            or saying that the model already solves every held-out prompt.
    """
    share = measured.alike_share
    if share is None or (measured.samples_per_prompt or 0) < SIGNAL_SAMPLES:
        return
    if share == 1 and measured.solved_share == 1 and args.require_reward_spread and not warm_started:
        raise ValueError(
            f"already solved on the held-out prompts: every sample of each of the {measured.sampled_prompts} prompts "
            f"sampled scores full credit ({measured.samples_per_prompt} samples each), so GRPO has nothing to learn "
            f"and nothing to gain by these rewards; give harder prompts or a stricter reward (--require_reward_spread "
            f"False trains anyway). Nothing was written."
        )
    if share == 1 and args.require_reward_spread and not warm_started:
        raise ValueError(
            f"GRPO would have nothing to learn from: every held-out prompt's {measured.samples_per_prompt} sampled "
            f"completions score alike by the rewards ({measured.sampled_prompts} prompts sampled; GRPO learns from the "
            f"differences within a prompt's group), so no step would change the model. Give the model a start on the "
            f"task (a `solution` column in the rows, or --sft_train_file with prompt/completion rows of answers and "
            f"--sft_steps N), a reward with partial "
            f"credit, or more --num_generations and a higher --temperature; --require_reward_spread False trains "
            f"anyway. Nothing was written."
        )
    if share >= 0.5:
        solved = f" ({measured.solved_share:.0%} solved: every sample right)" if measured.solved_share else ""
        print(f"[minirope] {share:.0%} of the held-out prompts' samples all score alike{solved}: GRPO learns only from "
              f"the other prompts' groups (TRL logs the share of such groups as frac_reward_zero_std)")  # fmt: skip


def check_cut(measured, rewards: list, cut_by_design: bool) -> None:
    """Print a line when at least `CUT_SHARE` of the held-out samples reach the token limit unfinished
    (`TaskMeasure.cut_share`) and no reward among `rewards` punishes them: a reward that reads a cut reply (its last
    number, say) can be gamed by replies that never end. On docs/pretrained.md's largest-of-three task, SmolLM2's
    samples were half cut at 32 tokens, and GRPO learned to restate the question at length (0 % on other problems)
    until TRL's overlong punishment (DAPO, Eq. 13; `OVERLONG`, its reward's name) joined the rewards. A task may cut
    its completions by design (`Task.cut_by_design`)."""
    share = measured.cut_share
    guarded = any(reward_name(reward) == OVERLONG for reward in rewards)
    if cut_by_design or guarded or share is None or share < CUT_SHARE:
        return
    print(f"[minirope] {share:.0%} of the held-out samples reach the {measured.max_new_tokens}-token limit "
          f"unfinished: a reward that reads a cut reply can be gamed by replies that never end; TRL's overlong "
          f"punishment as a second reward (trl.rewards.get_soft_overlong_punishment, docs/pretrained.md) or a larger "
          f"--max_completion_length guards against it")  # fmt: skip
