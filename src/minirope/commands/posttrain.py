"""`minirope-posttrain`: make a trained model better at the user's task, with TRL's trainers.

    minirope-posttrain --method grpo --model_name_or_path runs/my-model --dataset_name data/problems \\
        --reward_funcs my_rewards.exact_match
    minirope-posttrain --method dpo --model_name_or_path runs/my-model --train_file pairs.jsonl
    minirope-posttrain --method distill --model_name_or_path runs/student --teacher_model_name_or_path runs/teacher
    minirope-posttrain --method grpo --model_name_or_path runs/my-model --dataset_name data/problems \\
        --reward_funcs my_rewards.exact_match --use_peft --lora_r 8      # a LoRA adapter, merged on save
    minirope-posttrain --config grpo.yaml                                # TRL's YAML file of flags
    minirope-posttrain --method grpo --model_name_or_path runs/minirope-shakespeare   # no data: the verse task
    minirope-posttrain dpo --model_name_or_path runs/my-model --train_file pairs.jsonl  # the method as a subcommand

The flags are TRL's scripts' (`trl grpo`): `TrlParser((ScriptArguments, the method's config, ModelConfig))`, with
minirope's task flags in `PosttrainArguments` (a `ScriptArguments`) and `--method`; `--help` with a `--method` lists
that method's TRL config flags. The training loops are TRL's (`GRPOTrainer`, `DPOTrainer`, `DistillationTrainer`).
The data, the rewards, the warm start (TRL's `SFTTrainer` on demonstrations, before the method: `--sft_steps`), the
corpus term, the measures and the kept weights are `minirope.posttraining`'s: before and after (and after
the warm start), each run measures the rewards on held-out prompts (greedy and sampled), the share of distinct
completions and, where there is validation text, its bits per byte; they go to the output folder
(`run_summary.json`) and its model card.
"""

import importlib.util

from transformers import set_seed

from minirope.commands import run_cli
from minirope.output.folder import begin_writing
from minirope.training.heap import trimmed_training
from minirope.training.precision import avoid_cudnn_attention, precision_name


def run(argv: list[str] | None = None) -> dict:
    """Parse `argv`, post-train, save, and return the summary (the measures before and after, the kept step).

    Raises:
        ValueError, OSError: bad flags, model or teacher folder, rewards or data; nothing is written.
    """
    if importlib.util.find_spec("trl") is None:
        raise ValueError("minirope-posttrain runs TRL's trainers: install them with `pip install minirope[trl]`.")
    from minirope.posttraining.parsing import parse_args
    from minirope.posttraining.time_split import TimeSplit

    split = TimeSplit()
    args, config, model_args = parse_args(argv)
    print(f"[minirope] {config.precision_line or f'precision: {precision_name(config)} (--bf16/--fp16 given)'}")
    with trimmed_training(config.device.type == "cpu", args.heap_trim_seconds):
        return post_train(args, config, model_args, split)


def post_train(args, config, model_args, split) -> dict:
    """`run`'s work once the flags are parsed: load, measure, warm start, train, keep, measure, write."""
    from minirope.posttraining.pairs import own_preference_pairs
    from minirope.posttraining.report import write_run
    from minirope.posttraining.setup import (
        build_trainer,
        check_cut,
        check_signal,
        final_weights,
        keep_best_callback,
        measure,
        prepare,
        warm_up,
    )
    from minirope.posttraining.warm_start import finish_warm_start

    set_seed(config.seed)
    avoid_cudnn_attention(config)  # padded batches
    with split.part("loading"):
        setup = prepare(args, config, model_args)
    with split.part("measures"):
        before = measure(setup, args, config)
    keep = keep_best_callback(setup, args, config, before, split)
    if setup.warm:  # it writes the warm-started model into the folder
        begin_writing(config.output_dir, "minirope-posttrain", resuming=setup.resume is not None)
    warm_up(setup, args, config, before, keep, split)
    starting = setup.warm.measured if setup.warm else before  # the measures of what the method starts from
    check_signal(starting, args, warm_started=bool(setup.warm))
    check_cut(starting, args, setup.data.cut_by_design)
    begin_writing(config.output_dir, "minirope-posttrain", resuming=setup.resume is not None)
    train = setup.data.train if setup.data.train is not None else own_preference_pairs(setup, args, config)
    start_weights = (  # kept only to interpolate with
        {name: param.detach().clone() for name, param in setup.model.named_parameters()}
        if args.weight_interpolation < 1
        else {}
    )
    trainer = build_trainer(setup, args, config, train, keep)
    with split.part("method"):
        train_metrics = trainer.train(resume_from_checkpoint=setup.resume).metrics
    selection = final_weights(trainer, keep, setup, args, start_weights)
    with split.part("measures"):
        after = measure(setup, args, config)
    summary = write_run(trainer, setup, args, before, after, train_metrics, selection, split)
    finish_warm_start(config.output_dir)
    return summary


def main() -> None:
    run_cli("minirope-posttrain", run)


if __name__ == "__main__":
    main()
