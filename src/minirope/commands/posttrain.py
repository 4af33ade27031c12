"""`minirope-posttrain`: make a trained model better at something asked, with TRL's trainers.

    minirope-posttrain --method grpo --model_name_or_path runs/minirope-shakespeare
    minirope-posttrain --method dpo --model_name_or_path runs/minirope-shakespeare
    minirope-posttrain --method distill --model_name_or_path runs/student --teacher_model_name_or_path runs/teacher

Methods (the training loops are TRL's; `--help` with a `--method` lists that method's TRL config flags):
  grpo     reinforcement learning from a reward (`GRPOTrainer`, its KL term against the starting model): prompts
           from the training plays, `--reward_funcs` (default `scansion_reward`: lines of ten syllables)
  dpo      preference optimization (`DPOTrainer`): `--train_file` of {prompt, chosen, rejected} pairs, or by default
           pairs from the model's own samples ranked by the first reward, written to the output folder
  distill  on-policy distillation (`DistillationTrainer`, TRL's successor of GKD): the student samples completions
           of prompts from the training plays and learns the teacher's next-token distributions on them

Before and after, each run samples the model with fixed settings (temperature 0.8, top_k 50) on the validation plays'
speaker headers and reports the share of lines that scan and the share that are distinct, and the whole-text
validation bits per byte; they go to the output folder (run_summary.json) and its model card.
"""

import importlib.util
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from datasets import Dataset
from transformers import TrainingArguments, set_seed

from minirope.commands import run_cli
from minirope.folders import ModelArguments, check_output, load_causal_lm
from minirope.training.arguments import parse_cli_args
from minirope.training.corpus import BUNDLED_CORPUS, bundled_shards
from minirope.training.data import TextDataArguments, training_blocks, validation_windows
from minirope.training.output import check_previous_run, finish_run, model_card, remove_old_checkpoints
from minirope.training.throughput import training_flops_per_token
from minirope.training.trainer import MiniRopeTrainer
from minirope.training.verse import VerseMeasure, measure_verse

METRIC = "eval_bits_per_byte"


def method_of(argv: list[str]) -> str | None:
    """The value of `--method` in `argv` (`--method grpo` or `--method=grpo`), or None."""
    for index, arg in enumerate(argv):
        if arg == "--method" and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith("--method="):
            return arg.partition("=")[2]
    return None


def parse_args(argv: list[str] | None = None) -> tuple:
    """`PosttrainArguments` and the method's TRL config (`CONFIGS`), from `argv`."""
    from minirope.training.posttraining import CONFIGS, PosttrainArguments

    argv = sys.argv[1:] if argv is None else argv
    config = CONFIGS.get(method_of(argv) or "grpo", CONFIGS["grpo"])
    return parse_cli_args((PosttrainArguments, config), argv)


def validation_bits_per_byte(model, tokenizer) -> float:
    """Whole-text bits per byte of the validation plays, each play in windows of the model's context
    (`minirope.training.metrics`), as `minirope-pretrain` reports it. Writes nothing."""
    windows = validation_windows(bundled_shards("validation"), tokenizer, model.config.max_position_embeddings)
    with tempfile.TemporaryDirectory() as scratch:
        args = TrainingArguments(output_dir=scratch, per_device_eval_batch_size=32, report_to="none")
        trainer = MiniRopeTrainer(model=model, args=args, processing_class=tokenizer, eval_dataset=windows)
        return trainer.evaluate()[METRIC]


@dataclass
class Setup:
    """What a run trains: the model and its tokenizer, the teacher (distill), the rewards (grpo; dpo's own pairs)
    and the training rows (prompts, or preference pairs; None until dpo builds its own)."""

    model: object
    tokenizer: object
    teacher: object | None
    rewards: list
    dataset: Dataset | None


def prepare(args, config) -> Setup:
    """Every check that can fail, before any work: the output folder, the model, the teacher, the rewards, the data.

    Raises:
        ValueError, OSError: naming the flag, the folder or the file.
    """
    from minirope.training import posttraining as post

    teacher_path = getattr(config, "teacher_model_name_or_path", None)
    if args.method == "distill" and not teacher_path:
        raise ValueError("--method distill needs --teacher_model_name_or_path: the folder of the teacher.")
    inputs = {"--model_name_or_path": args.model_name_or_path, "--teacher_model_name_or_path": teacher_path}
    check_output(config.output_dir, "--output_dir", inputs)
    model, tokenizer = load_causal_lm(ModelArguments(args.model_name_or_path, config.trust_remote_code))
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    check_previous_run(config.output_dir, model.config, overwrite=args.overwrite_output_dir, resuming=False)
    teacher = None
    if teacher_path:
        teacher, teacher_tokenizer = load_causal_lm(ModelArguments(teacher_path, config.trust_remote_code))
        post.check_teacher(tokenizer, teacher_tokenizer)
    rewards = [post.resolve_reward(name) for name in args.reward_funcs] if args.method != "distill" else []
    if args.method == "dpo":
        dataset = post.read_pairs(args.train_file) if args.train_file else None
    else:
        dataset = post.prompt_dataset(args, config.seed)
    return Setup(model, tokenizer, teacher, rewards, dataset)


def own_preference_pairs(setup: Setup, args, config) -> Dataset:
    """dpo without --train_file: pairs from the model's own samples ranked by the first reward, written to the output
    folder (`preference_pairs.jsonl`) for the user to read and reuse.

    Raises:
        ValueError: no prompt's samples differ in reward.
    """
    from minirope.training import posttraining as post

    prompts = post.training_prompts(args.num_prompts, config.seed)
    pairs = post.own_pairs(setup.model, setup.tokenizer, prompts, args.samples_per_prompt, setup.rewards[0],
                           config.seed, args.eval_max_new_tokens, args.min_reward_margin)  # fmt: skip
    if not pairs:
        raise ValueError(f"no preference pairs: no prompt's samples differ in reward by --min_reward_margin "
                         f"{args.min_reward_margin} or more; lower it, raise --samples_per_prompt or --num_prompts, or "
                         f"give --train_file.")  # fmt: skip
    path = Path(config.output_dir) / post.PAIRS_FILE
    post.write_jsonl(path, pairs)
    print(f"[minirope] {len(pairs)} preference pairs from the model's own samples: {path}")
    return Dataset.from_list(pairs)


def run(argv: list[str] | None = None) -> dict:
    """Parse `argv`, post-train, save, and return the summary (verse measure and bits per byte before and after).

    Raises:
        ValueError, OSError: bad flags, model or teacher folder, rewards or data; nothing is written.
    """
    if importlib.util.find_spec("trl") is None:
        raise ValueError("minirope-posttrain runs TRL's trainers: install them with `pip install minirope[trl]`.")
    from minirope.training import posttraining as post

    args, config = parse_args(argv)
    set_seed(config.seed)
    setup = prepare(args, config)
    before = measure(setup.model, setup.tokenizer, args, config)
    post.check_rewards(setup.rewards, [sample["completion"] for sample in before[0].samples])
    if setup.dataset is None:
        setup.dataset = own_preference_pairs(setup, args, config)

    start_weights = (  # kept only to interpolate with
        {name: param.detach().clone() for name, param in setup.model.named_parameters()}
        if args.weight_interpolation < 1
        else {}
    )
    method_kwargs = {"grpo": {"reward_funcs": setup.rewards}, "distill": {"teacher_model": setup.teacher}}
    trainer = post.TRAINERS[args.method](
        model=setup.model,
        args=config,
        train_dataset=setup.dataset,
        processing_class=setup.tokenizer,
        **method_kwargs.get(args.method, {}),
    )
    if args.lm_coef:
        data_args = TextDataArguments(block_size=setup.model.config.max_position_embeddings)
        blocks = training_blocks(bundled_shards("train"), setup.tokenizer, data_args, config.seed)
        trainer.set_corpus(blocks.with_format("torch")[:]["input_ids"], args.lm_coef, args.lm_batch_size)
    remove_old_checkpoints(config.output_dir)
    train_metrics = trainer.train().metrics
    post.interpolate_weights(trainer.model, start_weights, args.weight_interpolation)
    after = measure(trainer.model, setup.tokenizer, args, config)
    return report(trainer, args, before, after, train_metrics)


def measure(model, tokenizer, args, config) -> tuple[VerseMeasure, float]:
    """The verse measure (`measure_verse`) and the validation bits per byte of `model`, printed."""
    verse = measure_verse(model, tokenizer, args.eval_prompts, args.eval_samples_per_prompt, args.eval_max_new_tokens,
                          seed=config.seed)  # fmt: skip
    bits = validation_bits_per_byte(model, tokenizer)
    print(f"[minirope] {verse.lines} sampled lines: {verse.scan_share:.1%} scan, {verse.distinct_share:.1%} distinct; "
          f"validation {bits:.4f} bits/byte")  # fmt: skip
    return verse, bits


@dataclass
class Side:
    verse: VerseMeasure
    bits: float


def teacher_flops(trainer, args) -> float:
    """The teacher's compute in model FLOPs: a forward pass (a third of `training_flops_per_token`, PaLM counting) over
    every prompt and completion token the student trained on (TRL's `num_input_tokens_seen`), at the context of the
    sequences it scored (prompt + `--max_completion_length`, at most its `max_position_embeddings`)."""
    teacher = trainer.teacher_model.config
    length = min(trainer.args.max_completion_length + 16, teacher.max_position_embeddings)
    return trainer.state.num_input_tokens_seen * training_flops_per_token(teacher, length) / 3


def report(trainer, args, before, after, train_metrics: dict) -> dict:
    """Write the folder (model, tokenizer, card, metrics, summary, samples) and print the before -> after line."""
    before, after = Side(*before), Side(*after)
    config = trainer.args
    steps, base = trainer.state.global_step, args.model_name_or_path
    summary = {
        "base_model": base,
        "method": args.method,
        "teacher": getattr(config, "teacher_model_name_or_path", None),
        "reward_funcs": args.reward_funcs if args.method != "distill" else [],
        "steps": steps,
        "learning_rate": config.learning_rate,
        "batch_size": config.per_device_train_batch_size,
        "beta": getattr(config, "beta", None),
        "lm_coef": args.lm_coef,
        "weight_interpolation": args.weight_interpolation,
        "train_seconds": round(train_metrics.get("train_runtime", 0.0), 1),
        "tokens_seen": trainer.state.num_input_tokens_seen,
        "teacher_model_flops": teacher_flops(trainer, args) if args.method == "distill" else 0,
        "before": {**before.verse.as_dict(), "validation_bits_per_byte": before.bits},
        "after": {**after.verse.as_dict(), "validation_bits_per_byte": after.bits},
        "samples": [
            {"prompt": b["prompt"], "before": b["completion"], "after": a["completion"]}
            for b, a in zip(before.verse.samples, after.verse.samples, strict=True)
        ],
    }
    what = {"grpo": f"TRL's GRPOTrainer with {', '.join(args.reward_funcs)}", "dpo": "TRL's DPOTrainer",
            "distill": f"TRL's DistillationTrainer from `{summary['teacher']}`"}[args.method]  # fmt: skip
    how_trained = (
        f"Post-trained from `{base}` with `minirope-posttrain` ({what}): {steps} steps, lr {config.learning_rate}, "
        f"corpus loss weight {args.lm_coef}, weight interpolation {args.weight_interpolation}. Sampled lines of the "
        f"validation speakers that scan (ten syllables by CMUdict): "
        f"{before.verse.scan_share:.1%} before, {after.verse.scan_share:.1%} after ({after.verse.lines} lines, "
        f"{after.verse.distinct_share:.1%} distinct); validation bits per byte {before.bits:.4f} before, "
        f"{after.bits:.4f} after."
    )
    card = model_card(Path(config.output_dir).name, trainer.model.config,
                      {METRIC: after.bits}, BUNDLED_CORPUS, how_trained, base_model=base)  # fmt: skip
    line = (
        f"lines that scan {before.verse.scan_share:.1%} -> {after.verse.scan_share:.1%}, distinct "
        f"{before.verse.distinct_share:.1%} -> {after.verse.distinct_share:.1%}, validation bits/byte "
        f"{before.bits:.4f} -> {after.bits:.4f} in {steps} steps, {summary['train_seconds']:.0f} s; written to "
        f"{config.output_dir}/"
    )
    eval_metrics = {f"before_{METRIC}": before.bits, METRIC: after.bits}
    finish_run(trainer, train_metrics=train_metrics, eval_metrics=eval_metrics, card=card, summary=summary,
               lines=[line])  # fmt: skip
    return summary


def main() -> None:
    run_cli("minirope-posttrain", run)


if __name__ == "__main__":
    main()
