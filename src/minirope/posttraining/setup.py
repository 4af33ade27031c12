"""The steps every method's script takes (`grpo`, `dpo`, `distill`): `start` (every check before any work in
`prepare`: the model, teacher, rewards, task, corpus term; the measures before; the warm start), `trainer_inputs` and
`attach` (what every TRL trainer takes, and the corpus term and `KeepBest` on it), and `finish` (train, the kept,
merged, interpolated weights in `final_weights`, the measures after, the folder)."""

from dataclasses import dataclass, field

from transformers import set_seed

from minirope.folders import ModelArguments, check_output, load_causal_lm
from minirope.output.folder import begin_writing, check_previous_run, claim
from minirope.output.hub import check_push
from minirope.posttraining.corpus import add_corpus, check_corpus_term, corpus_of, interpolate_weights
from minirope.posttraining.data import check_chat_template, data_task
from minirope.posttraining.keep_best import KeepBest, Selection, held_out_score, weighted_sum
from minirope.posttraining.measures import measure_task
from minirope.posttraining.report import TimeSplit, write_run
from minirope.posttraining.reward_calls import check_rewards, resolve_reward
from minirope.posttraining.sampling import SAMPLING, sample
from minirope.posttraining.sizing import RECIPE, after_warm_start
from minirope.posttraining.tasks import Task, load_task
from minirope.posttraining.warm_start import (
    answer_warm_start,
    demonstrations,
    finish_warm_start,
    kept_folder,
    load_warm_started,
    save_warm_measures,
    saved_warm_start,
    warm_start,
)
from minirope.training.checkpoints import check_resume, resolve_resume, resume_requested
from minirope.training.precision import avoid_cudnn_attention


@dataclass
class Setup:
    """What a run trains: the model and its tokenizer, the teacher (distill), the rewards, the task (`Task`), the
    corpus term (`Corpus`), the warm start (`WarmStart`; None: none), the checkpoint to resume, the model's flags
    (`PosttrainModelConfig`) and the weights the method starts from, kept where `--weight_interpolation` needs them."""

    model: object
    tokenizer: object
    teacher: object | None
    rewards: list
    data: Task
    corpus: object
    warm: object = None
    resume: str | None = None
    model_args: object = None
    start_weights: dict = field(default_factory=dict)
    stages: dict = field(default_factory=dict)  # the values a stage of the run set, by stage (`after_warm_start`)


def start(args, config, model_args, split: TimeSplit) -> tuple[Setup, object, KeepBest | None]:
    """A method's first steps: every check (`prepare`), the measures before (`measure`), the `KeepBest` callback, the
    warm start where the run takes one (`warm_up`); `(run, the measures before, the callback)`."""
    set_seed(config.seed)
    avoid_cudnn_attention(config)  # padded batches
    with split.part("loading"):
        run = prepare(args, config, model_args)
    with split.part("measures"):
        before = measure(run, args, config)
    keep = keep_best_callback(run, args, config, before, split)
    if run.warm:  # it writes the warm-started model into the folder
        begin_writing(config.output_dir, "minirope-posttrain", resuming=run.resume is not None)
    warm_up(run, args, config, before, keep, split)
    if args.weight_interpolation < 1:  # kept only to interpolate with
        run.start_weights = {name: param.detach().clone() for name, param in run.model.named_parameters()}
    return run, before, keep


def prepare(args, config, model_args) -> Setup:
    """Every check that can fail, before any work: the push (`--push_to_hub`), the output folder, the flags that
    cannot go together, the model, the teacher, the rewards (called once on two samples), the data, the corpus term,
    the warm start's demonstrations.

    Raises:
        ValueError, OSError: naming the flag, the folder or the file.
    """
    teacher_path = getattr(config, "teacher_model_name_or_path", None)
    inputs = {"--model_name_or_path": model_args.model_name_or_path, "--teacher_model_name_or_path": teacher_path}
    check_output(config.output_dir, "--output_dir", inputs)
    check_push(config)
    check_flags(args, config, model_args)
    claim(config.output_dir, args.overwrite_output_dir, resume_requested(config))
    resume = resolve_resume(config)
    data = data_task(args) if args.task is None else load_task(args.task, args, config.seed)
    args.check_task(data)  # the method's own: GRPO needs rewards, DPO them for its own pairs
    names = args.reward_funcs or []
    rewards = [resolve_reward(name, data.rewards) for name in names]
    weights = config.reward_weights
    if weights is not None and len(weights) != len(rewards):
        raise ValueError(f"--reward_weights: {len(weights)} given for {len(rewards)} rewards ({', '.join(names)}): "
                         f"give one weight per reward.")  # fmt: skip
    corpus = corpus_of(args, model_args.model_name_or_path)
    check_corpus_term(corpus, config)
    warm = demonstrations(args, data) if args.warm_start_steps else None
    trust, kwargs, revision = config.trust_remote_code, model_args.init_kwargs(), model_args.model_revision
    model, tokenizer = load_causal_lm(ModelArguments(model_args.model_name_or_path, trust, revision), **kwargs)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    check_chat_template(data, tokenizer)
    check_previous_run(config.output_dir, model.config, overwrite=args.overwrite_output_dir, resuming=bool(resume))
    check_resume(resume, model.config, config.max_steps)
    teacher = None
    if teacher_path:
        teacher, teacher_tokenizer = load_causal_lm(ModelArguments(teacher_path, trust), **kwargs)
        check_teacher(tokenizer, teacher_tokenizer)
    probe = sample(model, tokenizer, data.held_out.select(range(1)), 2, 16, config.seed, SAMPLING, config)
    check_rewards(rewards, probe.rows, probe.completions, probe.completion_ids)
    weight = f", weight {corpus.coef}" if corpus.shards else ""
    weight += f" (warm start {corpus.warm_coef})" if corpus.shards and warm else ""
    if args.recipe:
        flags = " ".join(f"--{name} {' '.join(map(str, value)) if isinstance(value, list) else value}"
                         for name, value in args.recipe.items())  # fmt: skip
        print(f"[minirope] task {args.task}: defaults from its recipe {args.recipe_path}: {flags} (a flag given "
              f"wins)")  # fmt: skip
    if args.sized:
        flags = " ".join(f"--{name} {value}" for name, value in args.sized.items())
        print(f"[minirope] defaults sized for a model of {model.num_parameters() / 1e6:.1f}M parameters: {flags} "
              f"(a flag given wins; minirope.posttraining.sizing)")  # fmt: skip
    rows = f"{len(data.train)} training rows, " if data.train is not None else ""
    print(f"[minirope] task: {data.name}, {data.source}; {rows}{len(data.held_out)} "
          f"held-out prompts measured; corpus term: {corpus.source}{weight}")  # fmt: skip
    return Setup(model, tokenizer, teacher, rewards, data, corpus, warm, resume, model_args)


def check_flags(args, config, model_args) -> None:
    """The flags that cannot go together.

    Raises:
        ValueError: `--sft_train_file` without a warm start; `--merge_lora False` (the adapter saved alone, for the
            model given) with a warm start or `--weight_interpolation`.
    """
    if args.sft_train_file and not args.warm_start_steps:
        raise ValueError(f"--sft_train_file is read by a warm start, and --method {args.method} has none here "
                         f"(--sft_steps {args.warm_start_steps}): give --sft_steps N to warm-start on it, or drop "
                         f"--sft_train_file.")  # fmt: skip
    if model_args.saves_adapter and args.warm_start_steps:
        raise ValueError(f"--merge_lora False saves the LoRA adapter alone, for the model of --model_name_or_path, "
                         f"and the warm start (--sft_steps {args.warm_start_steps}) changes that model first: drop "
                         f"--merge_lora False (the merged weights are saved), or give --sft_steps 0.")  # fmt: skip
    if model_args.saves_adapter and args.weight_interpolation < 1:
        raise ValueError("--weight_interpolation mixes the saved weights with the starting ones, and --merge_lora "
                         "False saves the adapter alone: drop one of the two.")  # fmt: skip


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


def measure(setup: Setup, args, config):
    """The measures of the model now (`measure_task`), printed."""
    measured = measure_task(setup.model, setup.tokenizer, setup.data.held_out, setup.rewards, args, config,
                            setup.corpus.validation, setup.data.measure)  # fmt: skip
    sampled = f" ({measured.sampled_prompts} sampled)" if measured.sampled_prompts < measured.prompts else ""
    print(f"[minirope] {measured.prompts} held-out prompts{sampled}, in {measured.precision}: {measured.line()}")
    return measured


def held_out_value(measures, config) -> float:
    """The score `KeepBest` compares: the greedy means of `measures` (`measure`'s), weighted by `--reward_weights`."""
    return weighted_sum(measures.greedy, config.reward_weights)


def keep_best_callback(setup: Setup, args, config, before, split: TimeSplit) -> KeepBest | None:
    """The `KeepBest` callback of the run: the held-out score of the rewards (weighted by `--reward_weights`), greedy,
    every `--eval_steps`, its time counted to the measures of `split`; the starting model's score taken from the
    `before` measures (the same completions). None without rewards (DPO on preference pairs, distillation without
    --reward_funcs): nothing to score by."""
    if not setup.rewards:
        return None
    weights = config.reward_weights
    held_out, tokens = setup.data.held_out, args.eval_max_new_tokens

    def score(model) -> float:  # in the method's precision (`config`), as its trainer computes
        return held_out_score(model, setup.tokenizer, held_out, setup.rewards, weights, tokens, config.seed, config)

    keep = KeepBest(split.timed(score), config.eval_steps, keep_last=args.keep_last)
    # a LoRA run starts from the adapter's first weights (B = 0: the model as it was), taken when training begins: no
    # copy of the base model is kept (full weights keep every trainable parameter)
    keep.start(held_out_value(before, config), None if setup.model_args.use_peft else setup.model)
    keep.resume(setup.resume)
    return keep


def warm_up(setup: Setup, args, config, before, keep: KeepBest | None, split: TimeSplit) -> None:
    """The warm start, where the run takes one (`--sft_steps`, a task recipe's, or by itself on the rows' answers:
    `answer_warm_start`): `setup.model` becomes the warm-started model, measured (`setup.warm.measured`), offered to
    `keep` as step 0, and the sized defaults for after a warm start applied (`sizing.after_warm_start`). A resumed run
    whose warm start is done (`saved_warm_start`) takes its model and measures from `<output_dir>/_warm_start`
    instead of training it again."""
    saved = saved_warm_start(config.output_dir, setup.resume)
    setup.warm = saved or setup.warm or answer_warm_start(setup, args, before)
    if not setup.warm:
        return
    if saved:
        folder = kept_folder(config.output_dir)
        setup.model = load_warm_started(folder, config, setup.model_args)
        print(f"[minirope] warm start: the resumed run's ({saved.steps} steps of SFT on {saved.source}), read from "
              f"{folder}: {saved.measured.line()}")  # fmt: skip
    else:
        with split.part("warm start"):
            setup.model = warm_start(setup, args, config)
        print(f"[minirope] warm start: {setup.warm.steps} steps of SFT on {setup.warm.source}")
        with split.part("measures"):
            setup.warm.measured = measure(setup, args, config)
        save_warm_measures(config.output_dir, setup.warm)
    if keep is not None:  # a LoRA run keeps no copy of a model: the adapter's start is taken when training begins
        keep.warm_started(
            held_out_value(setup.warm.measured, config), None if setup.model_args.use_peft else setup.model
        )
    if changes := after_warm_start(args, config):
        setup.stages["after_warm_start"] = changes
        flags = " ".join(f"--{name} {value}" for name, value in changes.items())
        print(f"[minirope] after the warm start: {flags} (the stage after_warm_start of {RECIPE})")


def trainer_inputs(run: Setup, config, train) -> dict:
    """The keyword arguments every method's TRL trainer takes: the model, `config`, the `train` rows, the tokenizer and
    a LoRA adapter under `--use_peft` (TRL's `get_peft_config`). With `--model_revision`, the reference model TRL loads
    again from the model's id (DPO, GRPO with a KL term; it takes the model's dtype and attention itself) is loaded at
    that revision; after a warm start it is the warm-started folder's."""
    from trl import get_peft_config

    revision = run.model_args.model_revision
    if revision != "main" and not run.warm:
        config.model_init_kwargs = {**(config.model_init_kwargs or {}), "revision": revision}
    return {"model": run.model, "args": config, "train_dataset": train, "processing_class": run.tokenizer,
            "peft_config": get_peft_config(run.model_args)}  # fmt: skip


def attach(trainer, run: Setup, args, keep: KeepBest | None):
    """`trainer` with the run's corpus term (`add_corpus`) and the `keep` callback."""
    add_corpus(trainer, run.corpus, run.corpus.coef, args, trainer.args.seed)
    if keep is not None:
        trainer.add_callback(keep)
    return trainer


def finish(trainer, run: Setup, args, before, keep: KeepBest | None, split: TimeSplit) -> dict:
    """A method's last steps: train (resuming `run.resume`), keep the best weights (`final_weights`), measure them,
    write the folder (`report.write_run`); the run summary."""
    with split.part("method"):
        train_metrics = trainer.train(resume_from_checkpoint=run.resume).metrics
    selection = final_weights(trainer, keep, run, args)
    with split.part("measures"):
        after = measure(run, args, trainer.args)
    summary = write_run(trainer, run, args, before, after, train_metrics, selection, split)
    finish_warm_start(trainer.args.output_dir)
    return summary


def starting_model(setup: Setup, trust_remote_code: bool):
    """The model the run was given (`--model_name_or_path`, its dtype and attention), read again from where it came:
    a LoRA run keeps no copy of it in memory."""
    args = setup.model_args
    model, _ = load_causal_lm(ModelArguments(args.model_name_or_path, trust_remote_code, args.model_revision),
                              **args.init_kwargs())  # fmt: skip
    return model


def final_weights(trainer, keep: KeepBest | None, setup: Setup, args) -> Selection:
    """After training: the best-scoring weights put back (`KeepBest`; the last without rewards or with
    `--keep_last`), a LoRA adapter merged (unless `--merge_lora False`), the weights interpolated with the start
    (`--weight_interpolation`); `setup.model` becomes the model to save. The selection made."""
    selection = Selection(kept_step=trainer.state.global_step, keep_last=True) if keep is None else None
    if keep is not None and keep.fits(trainer.model):  # every weight, or a LoRA adapter's
        selection = keep.restore_best(trainer.model)
    if setup.model_args.use_peft and setup.model_args.merge_lora:
        trainer.model = trainer.model.merge_and_unload()
    if selection is None:  # kept weights named for the whole model (a checkpoint of an earlier version): into it
        selection = keep.restore_best(trainer.model)
    # LoRA after a warm start that gained nothing: the model given, read again from disk (no copy was kept)
    if (setup.model_args.use_peft and selection.kept_step == 0 and setup.warm and selection.before is None
            and not selection.keep_last):  # fmt: skip
        trainer.model = starting_model(setup, trainer.args.trust_remote_code).to(trainer.model.device)
    if selection.kept_step != 0:  # the starting (or warm-started) weights kept: nothing to interpolate towards
        interpolate_weights(trainer.model, setup.start_weights, args.weight_interpolation)
    elif args.weight_interpolation < 1:
        print(f"[minirope] --weight_interpolation {args.weight_interpolation} not applied: the folder keeps the "
              f"starting weights (step 0), which interpolation would mix with the warm start's")  # fmt: skip
    setup.model = trainer.model
    return selection
