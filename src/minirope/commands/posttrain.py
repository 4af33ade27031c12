"""`minirope-posttrain`: make a trained model better at the user's task, with TRL's trainers.

    minirope-posttrain --method grpo --model_name_or_path runs/my-model --dataset_name data/problems \\
        --reward_funcs my_rewards.exact_match
    minirope-posttrain --method dpo --model_name_or_path runs/my-model --train_file pairs.jsonl
    minirope-posttrain --method distill --model_name_or_path runs/student --teacher_model_name_or_path runs/teacher
    minirope-posttrain --method grpo --model_name_or_path runs/minirope-shakespeare   # no data: the verse task

The training loops are TRL's (`GRPOTrainer`, `DPOTrainer`, `DistillationTrainer`); `--help` with a `--method` lists
that method's TRL config flags. The data, the rewards, the warm start (TRL's `SFTTrainer` on demonstrations, before
the method: `--sft_steps`), the corpus term and the measures are `minirope.training.posttraining`'s: before and after
(and after the warm start), each run measures the rewards on held-out prompts (greedy and sampled), the share of
distinct completions and, where there is validation text, its bits per byte; they go to the output folder
(`run_summary.json`) and its model card.
"""

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from datasets import Dataset
from transformers import set_seed

from minirope.commands import run_cli
from minirope.folders import ModelArguments, check_output, load_causal_lm
from minirope.training.checkpoints import check_resume, resolve_resume
from minirope.training.hub import card_name, check_push
from minirope.training.output import check_previous_run, finish_run, model_card, remove_old_checkpoints
from minirope.training.precision import avoid_cudnn_attention
from minirope.training.throughput import training_flops_per_token

METRIC = "eval_bits_per_byte"
PAIRS_FILE = "preference_pairs.jsonl"
METHOD_TAGS = {"grpo": "grpo", "dpo": "dpo", "distill": "distillation"}  # the model card's tag for each method


@dataclass
class Setup:
    """What a run trains: the model and its tokenizer, the teacher (distill), the rewards, the data
    (`TaskData`), the corpus term (`Corpus`) and the warm start (`WarmStart`; None: none)."""

    model: object
    tokenizer: object
    teacher: object | None
    rewards: list
    data: object
    corpus: object
    warm: object = None
    resume: str | None = None


def prepare(args, config) -> Setup:
    """Every check that can fail, before any work: the push (`--push_to_hub`), the output folder, the model, the
    teacher, the rewards, the data, the corpus term, the warm start's demonstrations.

    Raises:
        ValueError, OSError: naming the flag, the folder or the file.
    """
    from minirope.training.posttraining.arguments import VERSE_REJECTED_BY, verse_rewards
    from minirope.training.posttraining.corpus import check_corpus_term, corpus_of
    from minirope.training.posttraining.data import check_chat_template, load_task_data
    from minirope.training.posttraining.rewards import resolve_reward
    from minirope.training.posttraining.warm_start import demonstrations

    check_push(config)
    resume = resolve_resume(config)
    teacher_path = getattr(config, "teacher_model_name_or_path", None)
    if args.method == "distill" and not teacher_path:
        raise ValueError("--method distill needs --teacher_model_name_or_path: the folder of the teacher.")
    if args.sft_train_file and not args.warm_start_steps:
        raise ValueError(f"--sft_train_file is read by a warm start, and --method {args.method} has none here "
                         f"(--sft_steps {args.warm_start_steps}): give --sft_steps N to warm-start on it, or drop "
                         f"--sft_train_file.")  # fmt: skip
    inputs = {"--model_name_or_path": args.model_name_or_path, "--teacher_model_name_or_path": teacher_path}
    check_output(config.output_dir, "--output_dir", inputs)
    data = load_task_data(args, config.seed)
    defaults = verse_rewards(args.method) if data.verse and not args.reward_funcs else {}
    names = args.reward_funcs or list(defaults)
    if not names and (args.method == "grpo" or data.train is None):
        what = "trains on" if args.method == "grpo" else "ranks its own samples by"
        raise ValueError(
            f"--method {args.method} {what} a reward: give --reward_funcs, by name or import path (my_rewards.exact, "
            f"a function (prompts, completions, **columns) -> list[float])."
        )
    rewards = [resolve_reward(name) for name in names]
    if hasattr(config, "reward_weights") and config.reward_weights is None and defaults:
        config.reward_weights = list(defaults.values())  # the verse task's default rewards' weights
    if args.rejected_by is None:
        args.rejected_by = VERSE_REJECTED_BY if defaults else "sum"
    weights = getattr(config, "reward_weights", None)  # distill has none
    if weights is not None and len(weights) != len(rewards):
        raise ValueError(f"--reward_weights: {len(weights)} given for {len(rewards)} rewards ({', '.join(names)}): "
                         f"give one weight per reward.")  # fmt: skip
    corpus = corpus_of(args)
    check_corpus_term(corpus, config)
    warm = demonstrations(args, data.verse) if args.warm_start_steps else None
    model, tokenizer = load_causal_lm(ModelArguments(args.model_name_or_path, config.trust_remote_code, args.revision))
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    check_chat_template(data, tokenizer)
    check_previous_run(config.output_dir, model.config, overwrite=args.overwrite_output_dir, resuming=bool(resume))
    check_resume(resume, model.config, config.max_steps)
    teacher = None
    if teacher_path:
        teacher, teacher_tokenizer = load_causal_lm(ModelArguments(teacher_path, config.trust_remote_code))
        check_teacher(tokenizer, teacher_tokenizer)
    weight = f", weight {corpus.coef}" if corpus.shards else ""
    weight += f" (warm start {corpus.warm_coef})" if corpus.shards and warm else ""
    rows = f"{len(data.train)} training rows, " if data.train is not None else ""
    print(f"[minirope] data: {'the verse task, ' if data.verse else ''}{data.source}; {rows}{len(data.held_out)} "
          f"held-out prompts measured; corpus term: {corpus.source}{weight}")  # fmt: skip
    return Setup(model, tokenizer, teacher, rewards, data, corpus, warm, resume)


def check_teacher(student_tokenizer, teacher_tokenizer) -> None:
    """TRL's distillation compares the two models' next-token distributions token by token.

    Raises:
        ValueError: the teacher's vocabulary differs from the student's.
    """
    if student_tokenizer.get_vocab() != teacher_tokenizer.get_vocab():
        raise ValueError(
            f"the teacher's tokenizer ({len(teacher_tokenizer)} tokens) is not the student's ({len(student_tokenizer)}"
            f" tokens): distillation needs one vocabulary; give a teacher trained with the student's tokenizer."
        )


def own_preference_pairs(setup: Setup, args, config) -> Dataset:
    """dpo without pairs: pairs from the model's own samples ranked by the rewards' sum (`--reward_weights`), written
    to the output folder (`preference_pairs.jsonl`) for the user to read and reuse.

    Raises:
        ValueError: no prompt's samples differ in reward.
    """
    from minirope.training.posttraining.measures import SAMPLING, sample
    from minirope.training.posttraining.rewards import own_pairs

    samples = sample(setup.model, setup.tokenizer, setup.data.pair_prompts, args.samples_per_prompt,
                     args.eval_max_new_tokens, config.seed, SAMPLING)  # fmt: skip
    pairs = own_pairs(samples, setup.rewards, args.min_reward_margin, config.reward_weights, args.rejected_by)
    if not pairs:
        raise ValueError(f"no preference pairs: no prompt's samples differ in reward by --min_reward_margin "
                         f"{args.min_reward_margin} or more; lower it, raise --samples_per_prompt or --num_prompts, or "
                         f"give preference pairs as data.")  # fmt: skip
    path, dataset = Path(config.output_dir) / PAIRS_FILE, Dataset.from_list(pairs)
    path.parent.mkdir(parents=True, exist_ok=True)
    dataset.to_json(path, lines=True)
    print(f"[minirope] {len(pairs)} preference pairs from the model's own samples: {path}")
    return dataset


def run(argv: list[str] | None = None) -> dict:
    """Parse `argv`, post-train, save, and return the summary (the measures before and after).

    Raises:
        ValueError, OSError: bad flags, model or teacher folder, rewards or data; nothing is written.
    """
    if importlib.util.find_spec("trl") is None:
        raise ValueError("minirope-posttrain runs TRL's trainers: install them with `pip install minirope[trl]`.")
    from minirope.training.posttraining.arguments import parse_args
    from minirope.training.posttraining.corpus import TRAINERS, add_corpus, interpolate_weights
    from minirope.training.posttraining.keep_best import Selection
    from minirope.training.posttraining.measures import SAMPLING, sample
    from minirope.training.posttraining.rewards import check_rewards

    args, config = parse_args(argv)
    set_seed(config.seed)
    avoid_cudnn_attention(config)  # padded batches
    setup = prepare(args, config)
    probe = sample(setup.model, setup.tokenizer, setup.data.held_out.select(range(1)), 2, 16, config.seed, SAMPLING)
    check_rewards(setup.rewards, probe.rows, probe.completions, probe.completion_ids)
    before = measure(setup, args, config)
    keep = keep_best(setup, args, config, before)
    warm_folder = None
    if setup.warm:
        from minirope.training.posttraining.warm_start import warm_start

        setup.model, warm_folder = warm_start(setup.model, setup.tokenizer, setup.warm, setup.corpus, args, config)
        print(f"[minirope] warm start: {args.warm_start_steps} steps of SFT on {setup.warm.source}")
        setup.warm.measured = measure(setup, args, config)
    train = setup.data.train if setup.data.train is not None else own_preference_pairs(setup, args, config)
    start_weights = (  # kept only to interpolate with
        {name: param.detach().clone() for name, param in setup.model.named_parameters()}
        if args.weight_interpolation < 1
        else {}
    )
    if args.revision != "main" and not warm_folder:  # TRL loads the reference model (DPO, GRPO with a KL term) again
        # from the model's id (after a warm start: its local folder)
        config.model_init_kwargs = {**(config.model_init_kwargs or {}), "revision": args.revision}
    method_kwargs = {"grpo": {"reward_funcs": setup.rewards}, "distill": {"teacher_model": setup.teacher}}
    trainer = TRAINERS[args.method](
        model=setup.model,
        args=config,
        train_dataset=train,
        processing_class=setup.tokenizer,
        **method_kwargs.get(args.method, {}),
    )
    if warm_folder:
        warm_folder.cleanup()  # the trainer has read its reference model from it
    add_corpus(trainer, setup.corpus, setup.corpus.coef, args, config.seed)
    if keep is not None:
        trainer.add_callback(keep)
    if setup.resume is None:
        remove_old_checkpoints(config.output_dir)
    train_metrics = trainer.train(resume_from_checkpoint=setup.resume).metrics
    selection = (
        keep.restore_best(trainer.model) if keep else Selection(kept_step=trainer.state.global_step, keep_last=True)
    )
    interpolate_weights(trainer.model, start_weights, args.weight_interpolation)
    setup.model = trainer.model
    after = measure(setup, args, config)
    return report(trainer, setup, args, before, after, train_metrics, selection)


def keep_best(setup: Setup, args, config, before):
    """The `KeepBest` callback of the run: the held-out score of the rewards (weighted by `--reward_weights`), greedy,
    every `--eval_steps`; the starting model's score taken from the `before` measures (the same completions). None
    without rewards (DPO on preference pairs, distillation without --reward_funcs): nothing to score by."""
    from minirope.training.posttraining.keep_best import KeepBest, held_out_score, weighted_sum

    if not setup.rewards:
        return None
    weights = getattr(config, "reward_weights", None)
    held_out, tokens = setup.data.held_out, args.eval_max_new_tokens
    keep = KeepBest(
        lambda model: held_out_score(model, setup.tokenizer, held_out, setup.rewards, weights, tokens, config.seed),
        config.eval_steps,
        keep_last=args.keep_last,
    )
    keep.start(setup.model, weighted_sum(before.greedy, weights))
    keep.resume(setup.resume)
    return keep


def measure(setup: Setup, args, config):
    """The measures of the model now (`measure_task`), printed."""
    from minirope.training.posttraining.measures import measure_task

    measured = measure_task(setup.model, setup.tokenizer, setup.data.held_out, setup.rewards, args, config,
                            setup.corpus.validation, setup.data.verse)  # fmt: skip
    print(f"[minirope] {measured.prompts} held-out prompts: {measured.line()}")
    return measured


def teacher_flops(trainer) -> float:
    """The teacher's compute in model FLOPs: a forward pass (a third of `training_flops_per_token`, PaLM counting) over
    every prompt and completion token the student trained on (TRL's `num_input_tokens_seen`), at the context of the
    sequences it scored: the mean prompt length of the training rows plus `--max_completion_length`, at most the
    teacher's `max_position_embeddings`."""
    from minirope.training.posttraining.measures import prompt_text

    teacher = trainer.teacher_model.config
    prompts = trainer.train_dataset["prompt"]
    tokens = [len(trainer.processing_class(prompt_text(p, trainer.processing_class))["input_ids"]) for p in prompts]
    length = min(round(sum(tokens) / len(tokens)) + trainer.args.max_completion_length, teacher.max_position_embeddings)
    return trainer.state.num_input_tokens_seen * training_flops_per_token(teacher, length) / 3


def report(trainer, setup: Setup, args, before, after, train_metrics: dict, selection) -> dict:
    """Write the folder (model, tokenizer, card, metrics, summary, samples) and print the before -> after line."""
    from minirope.training.posttraining.keep_best import score_name
    from minirope.training.posttraining.rewards import reward_name

    config, warm = trainer.args, setup.warm
    steps, base = trainer.state.global_step, args.model_name_or_path
    gained = selection.line(score_name([reward_name(reward) for reward in setup.rewards],
                                       getattr(config, "reward_weights", None)))  # fmt: skip

    summary = {
        "base_model": base,
        "method": args.method,
        "data": setup.data.source,
        "task": "verse" if setup.data.verse else "user data",
        "training_data": setup.corpus.trained_on,
        "teacher": getattr(config, "teacher_model_name_or_path", None),
        "reward_funcs": [reward_name(reward) for reward in setup.rewards],
        "reward_weights": getattr(config, "reward_weights", None),
        "rejected_by": args.rejected_by if args.method == "dpo" and setup.data.train is None else None,
        "steps": steps,
        "learning_rate": config.learning_rate,
        "batch_size": config.per_device_train_batch_size,
        "gradient_accumulation_steps": config.gradient_accumulation_steps,
        "beta": getattr(config, "beta", None),
        "corpus_term": {"source": setup.corpus.source, "lm_coef": setup.corpus.coef if setup.corpus.shards else 0.0},
        "weight_interpolation": args.weight_interpolation,
        "warm_start": {
            "steps": args.warm_start_steps,
            "data": warm.source,
            "learning_rate": args.sft_learning_rate,
            "batch_size": args.sft_batch_size,
            "lm_coef": setup.corpus.warm_coef if setup.corpus.shards else 0.0,
            "after": warm.measured.as_dict(),
        }
        if warm
        else None,  # fmt: skip
        "train_seconds": round(train_metrics.get("train_runtime", 0.0), 1),
        "tokens_seen": trainer.state.num_input_tokens_seen,
        "teacher_model_flops": teacher_flops(trainer) if args.method == "distill" else 0,
        "before": before.as_dict(),
        "after": after.as_dict(),
        "kept": selection.as_dict(),
        "gained": gained,
        "samples": [{"before": b, "after": a} for b, a in zip(before.samples, after.samples, strict=True)],
    }
    what = {"grpo": f"TRL's GRPOTrainer with {', '.join(summary['reward_funcs'])}", "dpo": "TRL's DPOTrainer",
            "distill": f"TRL's DistillationTrainer from `{summary['teacher']}`"}[args.method]  # fmt: skip
    warmed = (
        f" after a warm start ({args.warm_start_steps} steps of TRL's SFTTrainer on "
        f"{warm.source}, lr {args.sft_learning_rate}, corpus term weight {summary['warm_start']['lm_coef']}; then: "
        f"{warm.measured.line()})"
        if warm
        else ""
    )
    how_trained = (
        f"Post-trained from `{base}` with `minirope-posttrain` ({what}){warmed} on {summary['data']}: {steps} steps, "
        f"lr {config.learning_rate}, corpus term: {setup.corpus.source} (weight {summary['corpus_term']['lm_coef']}), "
        f"weight interpolation {args.weight_interpolation}. Measured on {after.prompts} held-out prompts, before: "
        f"{before.line()}; after: {after.line()}. Held-out score measured every --eval_steps ({config.eval_steps}): "
        f"{gained}."
    )
    eval_metrics = {f"before_{METRIC}": before.bits_per_byte, METRIC: after.bits_per_byte}
    eval_metrics = {key: value for key, value in eval_metrics.items() if value is not None}
    methods = (METHOD_TAGS[args.method], "trl", *(["sft"] if warm else []))
    card = model_card(card_name(config), trainer.model.config, eval_metrics, setup.data.source, how_trained,
                      base_model=base, methods=methods)  # fmt: skip
    seconds = summary["train_seconds"]
    line = f"{before.line()} -> {after.line()} in {steps} steps, {seconds:.0f} s; written to {config.output_dir}/"
    finish_run(trainer, train_metrics=train_metrics, eval_metrics=eval_metrics, card=card, summary=summary,
               lines=[line, gained])  # fmt: skip
    return summary


def main() -> None:
    run_cli("minirope-posttrain", run)


if __name__ == "__main__":
    main()
