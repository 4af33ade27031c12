"""`minirope-posttrain`: make a trained model better at the user's task, with TRL's trainers.

    minirope-posttrain --method grpo --model_name_or_path runs/my-model --dataset_name data/problems \\
        --reward_funcs my_rewards.exact_match
    minirope-posttrain --method dpo --model_name_or_path runs/my-model --train_file pairs.jsonl
    minirope-posttrain --method distill --model_name_or_path runs/student --teacher_model_name_or_path runs/teacher
    minirope-posttrain --method grpo --model_name_or_path runs/my-model --dataset_name data/problems \\
        --reward_funcs my_rewards.exact_match --use_peft --lora_r 8      # a LoRA adapter, merged on save
    minirope-posttrain --config grpo.yaml                                # TRL's YAML file of flags
    minirope-posttrain --method grpo --model_name_or_path runs/minirope-shakespeare   # no data: the bundled task
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

import importlib
import json
from collections import Counter

from minirope.commands import run_cli
from minirope.training.heap import trimmed_training
from minirope.training.precision import precision_name


def run(argv: list[str] | None = None) -> dict:
    """Parse `argv` (TRL's `TrlParser`: `posttraining.parsing`), then run the method's script (`posttraining.grpo`,
    `.dpo`, `.distill`: check, measure, train, keep, write); the summary (the measures before and after, the kept step).

    Raises:
        ValueError, OSError: bad flags, model or teacher folder, rewards or data; nothing is written.
    """
    from minirope.posttraining.parsing import parse_args
    from minirope.posttraining.report import TimeSplit, settings

    split = TimeSplit()
    args, config, model_args = parse_args(argv)
    effective = settings(args, config, model_args)
    if args.print_settings:  # the run's settings, and nothing run
        print(json.dumps({"method": args.method, "task": args.task, "recipe": args.recipe_path, "settings": effective},
                         indent=1))  # fmt: skip
        return {}
    print(f"[minirope] {config.precision_line or f'precision: {precision_name(config)} (--bf16/--fp16 given)'}")
    sources = Counter(item["source"] for item in effective.values())
    print(f"[minirope] flags beside TRL's defaults, by source: {', '.join(f'{n} {s}' for s, n in sources.items())} "
          f"(each in run_summary.json, `settings`)")  # fmt: skip
    script = importlib.import_module(f"minirope.posttraining.{args.method}")  # grpo, dpo or distill
    with trimmed_training(config.device.type == "cpu"):
        return script.post_train(args, config, model_args, split)


def main() -> None:
    run_cli("minirope-posttrain", run)


if __name__ == "__main__":
    main()
