"""The rows a post-training run trains on and the prompts it is measured on, in TRL's standard formats.

- grpo, distill: prompt-only rows, `{"prompt": "What is 37 + 48?"}` or conversational
  `{"prompt": [{"role": "user", "content": ...}]}`; every other column (a `solution`, say) is kept and reaches the
  rewards as a keyword argument, as in TRL.
- dpo: preference rows, `{"prompt", "chosen", "rejected"}`, or with an implicit prompt `{"chosen", "rejected"}`
  (TRL extracts the shared start); without data, pairs from the model's own ranked samples
  (`minirope.posttraining.reward_calls.own_pairs`).

They come from `--dataset_name` (a folder saved by `datasets`, a folder of data files or a Hub id, with
`--dataset_config`, `--dataset_train_split`, `--dataset_test_split`, as `trl grpo` takes them), from TRL's dataset
mixture (`--datasets`, read by `trl.get_dataset`) or from `--train_file`/`--validation_file`. The held-out prompts are
the test split's; without one, the first `--test_split_size` rows (a share, or a number of rows) are held out and never
trained on (`minirope.data.pipeline.hold_out`; TRL's mixture would split at random, a new held-out set each run).
They make the run's `Task` (`data_task`); with no data at all, the run takes a bundled task
(`minirope.posttraining.tasks`).
"""

from pathlib import Path

from datasets import Dataset, load_dataset
from transformers import PreTrainedTokenizerBase
from trl import DatasetMixtureConfig, get_dataset
from trl.data_utils import is_conversational, maybe_extract_prompt

from minirope.data.documents import expand_files
from minirope.data.pipeline import first_rows, hold_out
from minirope.data.sources import open_dataset
from minirope.folders import first_line
from minirope.posttraining.arguments import PosttrainArguments
from minirope.posttraining.tasks import Task

PAIR_COLUMNS = ("chosen", "rejected")
BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
DEFAULT_TEST_SPLIT = PosttrainArguments.__dataclass_fields__["dataset_test_split"].default  # absent: a share held out
USER_DATA = "user data"  # the task's name


def data_task(args: PosttrainArguments) -> Task:
    """The run's `Task` from its data flags (see the module doc).

    Raises:
        ValueError, FileNotFoundError: a missing dataset, file or split, a row format the method does not take,
            or too few rows to hold out.
    """
    splits, source = load_splits(args)
    train = splits["train"]
    # dpo takes preference rows, or prompts whose own samples it ranks into pairs
    pairs = args.takes_pairs and any(column in train.column_names for column in PAIR_COLUMNS)
    check_columns(train, pairs, args, f"{source} {args.dataset_train_split}")
    held_out = splits.get("test")
    if held_out is None:
        flag = "--train_file" if args.train_file else "--datasets" if args.datasets else f"--dataset_name {source}"
        split = hold_out(train, args.test_split_size, "rows", flag)  # a share, or a number of rows
        train, held_out = split["train"], split["validation"]
    else:
        check_columns(held_out, pairs, args, f"{source} {args.dataset_test_split}")
    held_out = first_rows(prompts_of_pairs(held_out) if pairs else held_out, args.eval_prompts)
    if pairs:
        return Task(USER_DATA, source, held_out, train=train)
    prompts = first_rows(train, args.prompt_limit)
    if args.takes_pairs:  # pairs of its own samples of the prompts
        if len(prompts) < len(train):
            print(f"[minirope] dpo's own pairs: the first {len(prompts)} of {len(train)} training prompts are sampled "
                  f"(--num_prompts)")  # fmt: skip
        return Task(USER_DATA, source, held_out, pair_prompts=prompts, rows=train)
    return Task(USER_DATA, source, held_out, train=prompts, rows=train)


def mixture_entry(dataset) -> str:
    """A `--datasets` entry (TRL's `DatasetConfig`) in words: its path, configuration name and data files'
    names (`json (problems.jsonl)`)."""
    files = dataset.data_files or []
    files = [files] if isinstance(files, str) else list(files.values()) if isinstance(files, dict) else files
    details = [dataset.name] if dataset.name else []
    details += [Path(str(file)).name for file in files]
    return f"{dataset.path} ({', '.join(details)})" if details else dataset.path


def load_splits(args: PosttrainArguments) -> tuple[dict[str, Dataset], str]:
    """`({"train": rows[, "test": rows]}, name)` from `--dataset_name` and its splits, or from the files.

    Raises:
        ValueError, FileNotFoundError: naming the dataset, file or split.
    """
    if args.datasets:  # TRL's mixture, with the held-out rows minirope's (`data_task`)
        mixture = get_dataset(DatasetMixtureConfig(datasets=args.datasets))
        return {"train": mixture["train"]}, ", ".join(map(mixture_entry, args.datasets))
    if args.train_file:
        files = {"train": expand_files(args.train_file, flag="--train_file")}
        if args.validation_file:
            files["test"] = expand_files(args.validation_file, flag="--validation_file")
        return {split: read_files(paths) for split, paths in files.items()}, ", ".join(
            Path(path).name for path in files["train"]
        )
    dataset = open_dataset(args.dataset_name, args.dataset_config, instead="--train_file")
    name = args.dataset_name + (f" ({args.dataset_config})" if args.dataset_config else "")
    if args.dataset_train_split not in dataset:
        raise ValueError(
            f"--dataset_name {name} has no split {args.dataset_train_split!r} (splits: {', '.join(dataset)}): pass "
            f"--dataset_train_split."
        )
    splits = {"train": dataset[args.dataset_train_split]}
    test = args.dataset_test_split
    if test not in dataset and test != DEFAULT_TEST_SPLIT:
        raise ValueError(
            f"--dataset_name {name} has no split {test!r} (splits: {', '.join(dataset)}): pass one of them as "
            f"--dataset_test_split, or leave it out to hold out --test_split_size of the training rows."
        )
    if test in dataset and test != args.dataset_train_split:
        splits["test"] = dataset[test]
    return splits, name


def read_files(paths: list[str]) -> Dataset:
    """The rows of `.jsonl`/`.json`/`.parquet` files, with `datasets`' json or parquet builder.

    Raises:
        ValueError: another suffix, files of two kinds, or a file `datasets` cannot read (its first line).
    """
    builders = {BUILDERS.get(Path(path).suffix) for path in paths}
    if None in builders or len(builders) > 1:
        raise ValueError(f"data files must be all .jsonl/.json or all .parquet, got {', '.join(paths)}.")
    try:
        return load_dataset(builders.pop(), data_files=paths, split="train")
    except Exception as error:  # datasets' reader errors have many types; any is a bad file
        reason = first_line(error)
        raise ValueError(f"cannot read {', '.join(paths)} as rows: {reason}") from None


def check_columns(rows: Dataset, pairs: bool, args: PosttrainArguments, where: str) -> None:
    """The columns the rows need, in every row: `chosen` and `rejected` (preference pairs) or `prompt`.

    Raises:
        ValueError: no rows, a missing column (naming the columns there are and the format), or a row without a
            value.
    """
    needed = PAIR_COLUMNS if pairs else ("prompt",)
    form = (
        "TRL's preference format: {prompt, chosen, rejected} or {chosen, rejected}"
        if pairs
        else "TRL's prompt-only format: {prompt} rows, plain text or a list of messages"
        + (", or preference pairs" if args.takes_pairs else "")
    )
    if not len(rows):
        raise ValueError(f"{where} holds no rows: {args.method} takes {form}.")
    for column in needed:
        if column not in rows.column_names:
            raise ValueError(f"{where} has no {column!r} column (columns: {rows.column_names}): {args.method} takes "
                             f"{form}.")  # fmt: skip
        missing = next((index for index, value in enumerate(rows[column]) if not value), None)
        if missing is not None:
            raise ValueError(f"{where} row {missing + 1} has no {column!r}: {args.method} takes {form}.")


def prompts_of_pairs(pairs: Dataset) -> Dataset:
    """The prompts of preference rows (an implicit prompt extracted as TRL does) with their other columns, the
    completions dropped."""
    if "prompt" not in pairs.column_names:
        pairs = pairs.map(maybe_extract_prompt)
    return pairs.remove_columns([column for column in PAIR_COLUMNS if column in pairs.column_names])


def check_chat_template(data: Task, tokenizer: PreTrainedTokenizerBase) -> None:
    """Conversational prompts are rendered with the tokenizer's chat template, by TRL and by the measures.

    Raises:
        ValueError: conversational rows and a tokenizer without a chat template.
    """
    rows = data.train if data.train is not None and "prompt" in data.train.column_names else data.held_out
    if is_conversational(rows[0]) and tokenizer.chat_template is None:
        raise ValueError(
            "the data is conversational (lists of messages) but the model's tokenizer has no chat template: "
            "fine-tune it on conversations first (minirope-finetune with {messages} rows adds one), or give plain-text "
            "prompts."
        )
