"""A post-training run's parts, checked before any work and put together: `prepare` (the model, teacher, rewards,
data, corpus term and warm start), `build_trainer` (the method's TRL trainer, with LoRA, the corpus term and
`KeepBest`), `final_weights` (the kept, merged, interpolated weights) and `measure`."""

from dataclasses import dataclass

from minirope.folders import ModelArguments, check_output, load_causal_lm
from minirope.output.folder import check_previous_run, claim
from minirope.output.hub import check_push
from minirope.posttraining.corpus import (
    TRAINERS,
    add_corpus,
    check_corpus_term,
    corpus_of,
    interpolate_weights,
)
from minirope.posttraining.data import check_chat_template, data_task
from minirope.posttraining.keep_best import KeepBest, Selection, held_out_score, weighted_sum
from minirope.posttraining.measures import SAMPLING, SIGNAL_SAMPLES, measure_task, sample
from minirope.posttraining.reward_calls import check_rewards, resolve_reward
from minirope.posttraining.sizing import after_warm_start
from minirope.posttraining.tasks import Task, load_task
from minirope.posttraining.time_split import TimeSplit
from minirope.posttraining.warm_start import (
    answer_warm_start,
    demonstrations,
    kept_folder,
    load_warm_started,
    save_warm_measures,
    saved_warm_start,
    warm_start,
)
from minirope.training.checkpoints import check_resume, resolve_resume, resume_requested

CUT_SHARE = 0.25  # of the held-out samples cut at the token limit: from here `check_cut` warns of a gameable reward


@dataclass
class Setup:
    """What a run trains: the model and its tokenizer, the teacher (distill), the rewards, the task (`Task`), the
    corpus term (`Corpus`), the warm start (`WarmStart`; None: none), the checkpoint to resume and the model's
    flags (`PosttrainModelConfig`)."""

    model: object
    tokenizer: object
    teacher: object | None
    rewards: list
    data: Task
    corpus: object
    warm: object = None
    resume: str | None = None
    model_args: object = None


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
    names = args.reward_funcs or []
    if not names and (args.method == "grpo" or data.train is None):
        what = "trains on" if args.method == "grpo" else "ranks its own samples by"
        raise ValueError(
            f"--method {args.method} {what} a reward: give --reward_funcs, by name or import path (my_rewards.exact, "
            f"a function (prompts, completions, **columns) -> list[float])."
        )
    rewards = [resolve_reward(name, data.rewards) for name in names]
    weights = getattr(config, "reward_weights", None)  # distill has none
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
        ValueError: distillation without a teacher; `--sft_train_file` without a warm start; `--merge_lora False`
            (the adapter saved alone, for the model given) with a warm start or `--weight_interpolation`.
    """
    if args.method == "distill" and not getattr(config, "teacher_model_name_or_path", None):
        raise ValueError("--method distill needs --teacher_model_name_or_path: the folder of the teacher.")
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


def check_signal(measured, args, warm_started: bool = False) -> None:
    """GRPO's advantage is a completion's reward against the other completions of its prompt: a group whose
    completions all score alike teaches nothing (TRL's `frac_reward_zero_std`). From the measures just taken
    (`TaskMeasure.alike_share`, the `--eval_samples_per_prompt` samples of each held-out prompt, when there are at
    least `SIGNAL_SAMPLES`), print the share of such prompts when at least half are, before any GRPO step.

    Prompts whose samples all score full credit are solved, not failing (`TaskMeasure.solved_share`): when every
    held-out prompt is, the run says the task is already solved there.

    Raises:
        ValueError: every held-out prompt's samples score alike (unless `--require_reward_spread False`, or after a
            warm start, whose model is not to be lost), naming the flags that give the run something to learn from,
            or saying that the model already solves every held-out prompt.
    """
    share = measured.alike_share
    if args.method != "grpo" or share is None or args.eval_samples_per_prompt < SIGNAL_SAMPLES:
        return
    if share == 1 and measured.solved_share == 1 and args.require_reward_spread and not warm_started:
        raise ValueError(
            f"already solved on the held-out prompts: every sample of each of the {measured.sampled_prompts} prompts "
            f"sampled scores full credit ({args.eval_samples_per_prompt} samples each), so GRPO has nothing to learn "
            f"and nothing to gain by these rewards; give harder prompts or a stricter reward (--require_reward_spread "
            f"False trains anyway). Nothing was written."
        )
    if share == 1 and args.require_reward_spread and not warm_started:
        raise ValueError(
            f"GRPO would have nothing to learn from: every held-out prompt's {args.eval_samples_per_prompt} sampled "
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


def check_cut(measured, args, cut_by_design: bool) -> None:
    """Print a line when at least `CUT_SHARE` of the held-out samples reach the token limit unfinished
    (`TaskMeasure.cut_share`), for GRPO on a user's task: a reward that reads a cut reply (its last number, say) can
    be gamed by replies that never end. On docs/pretrained.md's largest-of-three task, SmolLM2's samples were half cut
    at 32 tokens, and GRPO learned to restate the question at length (0 % on other problems) until TRL's overlong
    punishment (DAPO, Eq. 13) joined the rewards. A task may cut its completions by design (`Task.cut_by_design`)."""
    share = measured.cut_share
    if args.method != "grpo" or cut_by_design or share is None or share < CUT_SHARE:
        return
    print(f"[minirope] {share:.0%} of the held-out samples reach the {measured.max_new_tokens}-token limit "
          f"unfinished: a reward that reads a cut reply can be gamed by replies that never end; TRL's overlong "
          f"punishment as a second reward (trl.rewards.get_soft_overlong_punishment, docs/pretrained.md) or a larger "
          f"--max_completion_length guards against it")  # fmt: skip


def held_out_value(measures, config) -> float:
    """The score `KeepBest` compares: the greedy means of `measures` (`measure`'s), weighted by `--reward_weights`."""
    return weighted_sum(measures.greedy, getattr(config, "reward_weights", None))  # distill has no weights


def keep_best_callback(setup: Setup, args, config, before, split: TimeSplit) -> KeepBest | None:
    """The `KeepBest` callback of the run: the held-out score of the rewards (weighted by `--reward_weights`), greedy,
    every `--eval_steps`, its time counted to the measures of `split`; the starting model's score taken from the
    `before` measures (the same completions). None without rewards (DPO on preference pairs, distillation without
    --reward_funcs): nothing to score by."""
    if not setup.rewards:
        return None
    weights = getattr(config, "reward_weights", None)
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
        flags = " ".join(f"--{name} {value}" for name, value in changes.items())
        print(f"[minirope] after the warm start: {flags} (minirope.posttraining.sizing.AFTER_WARM_START)")


def build_trainer(setup: Setup, args, config, train, keep: KeepBest | None):
    """The method's TRL trainer (`TRAINERS`: with minirope's corpus term and model card) on `train`, with a LoRA
    adapter under `--use_peft` (TRL's `get_peft_config`) and the `keep` callback. With `--model_revision`, the
    reference model TRL loads again from the model's id (DPO, GRPO with a KL term; it takes the model's dtype and
    attention itself) is loaded at that revision; after a warm start it is the warm-started folder's."""
    from trl import get_peft_config

    revision = setup.model_args.model_revision
    if revision != "main" and not setup.warm:
        config.model_init_kwargs = {**(config.model_init_kwargs or {}), "revision": revision}
    method_kwargs = {"grpo": {"reward_funcs": setup.rewards}, "distill": {"teacher_model": setup.teacher}}
    trainer = TRAINERS[args.method](
        model=setup.model,
        args=config,
        train_dataset=train,
        processing_class=setup.tokenizer,
        peft_config=get_peft_config(setup.model_args),
        **method_kwargs.get(args.method, {}),
    )
    add_corpus(trainer, setup.corpus, setup.corpus.coef, args, config.seed)
    if keep is not None:
        trainer.add_callback(keep)
    return trainer


def starting_model(setup: Setup, trust_remote_code: bool):
    """The model the run was given (`--model_name_or_path`, its dtype and attention), read again from where it came:
    a LoRA run keeps no copy of it in memory."""
    args = setup.model_args
    model, _ = load_causal_lm(ModelArguments(args.model_name_or_path, trust_remote_code, args.model_revision),
                              **args.init_kwargs())  # fmt: skip
    return model


def final_weights(trainer, keep: KeepBest | None, setup: Setup, args, start_weights: dict) -> Selection:
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
        interpolate_weights(trainer.model, start_weights, args.weight_interpolation)
    elif args.weight_interpolation < 1:
        print(f"[minirope] --weight_interpolation {args.weight_interpolation} not applied: the folder keeps the "
              f"starting weights (step 0), which interpolation would mix with the warm start's")  # fmt: skip
    setup.model = trainer.model
    return selection
