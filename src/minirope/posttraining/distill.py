"""Distillation on a minirope model, as TRL's `trl/scripts/distillation.py` runs it: the student's own completions of
the task's prompts scored against the teacher's next-token distributions (`--teacher_model_name_or_path`, one
vocabulary with the student's: `setup.check_teacher`), TRL's `DistillationTrainer` with the corpus term and
`KeepBest` where there are rewards to measure, the best weights kept. `minirope-posttrain distill` (or `--method
distill`) parses the flags and calls `post_train`; the steps every method shares are `setup`'s.
"""

from dataclasses import dataclass

from minirope.output.folder import begin_writing
from minirope.posttraining.arguments import PosttrainArguments
from minirope.posttraining.configs import PosttrainDistillationConfig, PosttrainModelConfig
from minirope.posttraining.report import TimeSplit
from minirope.posttraining.setup import attach, finish, start, trainer_inputs
from minirope.posttraining.trainers import MiniRopeDistillationTrainer


@dataclass
class DistillationScriptArguments(PosttrainArguments):
    """`minirope-posttrain distill`'s script arguments: prompts the student completes, no rewards needed (measured
    where given), no warm start by default."""

    card_tag = "distillation"
    advice = ("--learning_rate", "--max_steps", "--max_completion_length")  # what to change when nothing was gained

    def trainer_line(self, summary: dict) -> str:
        return f"TRL's DistillationTrainer from `{summary['teacher']}`"


ARGUMENTS = (DistillationScriptArguments, PosttrainDistillationConfig, PosttrainModelConfig)  # as trl distillation's


def post_train(args, config, model_args, split: TimeSplit) -> dict:
    """Check, measure, warm-start where asked, distill, keep, measure, write: the run summary.

    Raises:
        ValueError, OSError: see `setup.prepare` (the teacher's folder and vocabulary among them); nothing is
            written.
    """
    run, before, keep = start(args, config, model_args, split)
    begin_writing(config.output_dir, "minirope-posttrain", resuming=run.resume is not None)
    distill = MiniRopeDistillationTrainer(teacher_model=run.teacher, **trainer_inputs(run, config, run.data.train))
    return finish(attach(distill, run, args, keep), run, args, before, keep, split)
