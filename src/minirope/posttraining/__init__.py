"""Post-training: TRL's trainers (GRPO, DPO, distillation) on a minirope model, for the user's task.

`minirope-posttrain` (`minirope.commands.posttrain`) parses the flags and runs the method's script, each read top to
bottom as TRL's `trl/scripts/*.py` are: `grpo`, `dpo` (with its own pairs from the model's samples when the data
has none), `distill`. The pieces they share have a module each:

    arguments   the command's flags in TRL's script shape: `PosttrainArguments` (TRL's `ScriptArguments` and the
                task: the method, rewards, corpus term, measures; each script extends it), and the method recipes
                `recipes/<method>.yaml` over `recipes/every_method.yaml`, the measured defaults for your data
                (`method_recipe`)
    configs     each method's TRL config with the defaults a CPU run needs, `PosttrainModelConfig` (TRL's
                `ModelConfig`: dtype, attention, LoRA)
    setup       the steps every script takes: a run's parts checked before any work (`prepare`), the measures
                before and the warm start (`start`), what every TRL trainer takes (`trainer_inputs`, with LoRA),
                training and the weights kept after it (`finish`, `final_weights`: best, merged, interpolated)
    trainers    minirope's TRL trainers: the corpus term (`CorpusTerm`) and a LoRA model's rollouts on its merged
                adapter (`MergedRollouts`) mixed into TRL's GRPO, DPO, distillation and SFT trainers
    data        the training rows and the held-out prompts: a `datasets` folder or Hub id and its splits, files,
                as a `Task`; TRL's standard formats
    reward_calls  rewards by name or import path, called as TRL calls them (prompts, completions, completion ids and
                the dataset's columns), checked before training; DPO's pairs from the model's own samples ranked by
                the rewards' sum
    corpus      the language-modelling term's text (ptx), handed to the trainers, and the interpolation of the
                tuned weights with the starting ones (WiSE-FT)
    warm_start  supervised fine-tuning (TRL's SFTTrainer) on demonstrations of the task before the method, with
                the corpus term, or by itself on the rows' answers when the samples all score alike; the
                warm-started model the method's reference
    sizing      the defaults for a model of a released checkpoint's size (fewer, smaller steps and measures),
                read from the recipe `recipes/released_size.yaml`
    measures    what a run bought and cost, before and after: each reward on the held-out prompts (greedy and
                sampled), the share of distinct completions, bits per byte on the validation text
    sampling    the model's completions of held-out prompts, each prompt read once for its samples, sampled on
                the main process and shared; a LoRA model samples on its merged adapter (GRPO's rollouts, the
                measures): the base model's cost
    keep_best   never silently worse: the held-out score every --eval_steps, the best weights kept, one line
                saying what was gained
    report      the folder a run leaves (model or adapter, card, run summary: `write_run`), its before -> after
                line, and how its time went (`TimeSplit`: loading, measures, warm start, method, writing)
    tasks       `Task`, what a run receives: rows, held-out prompts, rewards, demonstrations, its own measures; a
                bundled task is a package of it with one recipe of defaults per method (`--task NAME`, or the
                default task when no data is given), and nothing outside its package knows what is in it

The training loops are TRL's; nothing here is an RL or preference loop of its own. Importing this package imports
nothing heavy; its modules import TRL.
"""
