"""Post-training: TRL's trainers (GRPO, DPO, distillation) on a minirope model, for the user's task.

`minirope-posttrain` (`minirope.commands.posttrain`) is a thin verb over this room; each piece has its module:

    arguments   the command's flags: the method, the data (TRL's `ScriptArguments` names), the rewards, the corpus
                term and the measures, and each method's TRL config with the defaults measured for a CPU
    data        the training rows and the held-out prompts: a `datasets` folder or Hub id and its splits, files,
                or (nothing given) the verse task's prompts from the bundled plays; TRL's standard formats
    rewards     rewards by name or import path, called as TRL calls them (prompts, completions, completion ids and
                the dataset's columns), checked before training; DPO's pairs from the model's own samples ranked by
                the rewards' sum
    corpus      the language-modelling term on the user's pretraining text (ptx), mixed into TRL's updates, and
                the interpolation of the tuned weights with the starting ones (WiSE-FT)
    warm_start  supervised fine-tuning (TRL's SFTTrainer) on demonstrations of the task before the method, with
                the corpus term; the warm-started model the method's reference
    measures    what a run bought and cost, before and after: each reward on the held-out prompts (greedy and
                sampled), the share of distinct completions, bits per byte on the validation text
    verse       the showcase task used when no data is given: prompts from the plays, its demonstrations (the
                plays cut to their iambic lines), lines that scan and are iambic

The training loops are TRL's; nothing here is an RL or preference loop of its own. Importing this package imports
nothing heavy; its modules import TRL.
"""
