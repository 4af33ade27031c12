"""DPO on a minirope model, as TRL's `trl/scripts/dpo.py` runs it: the task's preference pairs, or pairs of the
model's own samples ranked by the rewards (`pairs.own_preference_pairs`), TRL's `DPOTrainer` with the corpus term and
`KeepBest`, the best weights kept. `minirope-posttrain dpo` (or `--method dpo`) parses the flags and calls
`post_train`; the steps every method shares are `setup`'s.
"""

from minirope.output.folder import begin_writing
from minirope.posttraining.pairs import own_preference_pairs
from minirope.posttraining.setup import attach, finish, start, trainer_inputs
from minirope.posttraining.time_split import TimeSplit
from minirope.posttraining.trainers import MiniRopeDPOTrainer


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
