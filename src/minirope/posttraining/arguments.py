"""`minirope-posttrain`'s script arguments in TRL's shape, `(ScriptArguments, the method's config, ModelConfig)` as
`trl/scripts/grpo.py` parses them: `PosttrainArguments` extends TRL's `ScriptArguments` (the data) with the task's
flags (the method, the rewards, the corpus term, the measures), and each method's script extends it as
`GRPOScriptArguments` does; the TRL configs and the model's flags are `configs`'. The measured defaults are not in
code but in each method's recipe, `recipes/<method>.yaml`, over the one every method takes, `recipes/every_method.yaml`
(`method_recipe`). `parsing.parse_args` reads them.
"""

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import ClassVar

from trl import DatasetMixtureConfig, ScriptArguments, SFTConfig
from trl.scripts.utils import DatasetConfig

from minirope.posttraining.configs import sft_mapping
from minirope.training.arguments import read_arguments_file

METHODS = ("grpo", "dpo", "distill")
USER_SOURCES = ("command line", "--config")  # where the user set a value; the other sources are recipes
RECIPES = Path(__file__).parent / "recipes"
EVERY_METHOD = RECIPES / "every_method.yaml"  # beneath each method's recipe


@cache
def method_recipe(method: str) -> dict:
    """minirope's defaults for `method` on the user's data: `recipes/<method>.yaml` over `EVERY_METHOD` (the held-out
    measures and the corpus term's batch), the flags they set in place of TRL's defaults (the lowest precedence of
    `parsing.parse_args`), each measured where the file says, and the method's sections of flags that go with a flag
    given (`parsing.SECTIONS`)."""
    shared = read_arguments_file(EVERY_METHOD, "method recipe")
    return {**shared, **read_arguments_file(RECIPES / f"{method}.yaml", "method recipe")}


@dataclass
class PosttrainArguments(ScriptArguments, DatasetMixtureConfig):
    """What to post-train on and for which reward, and what to measure: TRL's `ScriptArguments` (the data, as `trl
    grpo` takes it) and minirope's task flags. The model is `PosttrainModelConfig`'s (TRL's `ModelConfig`); the
    training flags are the method's TRL config's. After parsing, `sized` holds the defaults sized from the model that
    the run uses (`sizing`; {} for a model of minirope's demo sizes).

    What the method does with a task is its script's subclass (`grpo.py`, `dpo.py`, `distill.py`): the card's
    `card_tag`, the `advice` when nothing was gained, `answer_warm_start`, `takes_pairs`, `check_task`, `trainer_line`
    and `rejected_by_used`."""

    card_tag: ClassVar[str] = ""
    advice: ClassVar[tuple[str, ...]] = ()
    answer_warm_start: ClassVar[bool] = False
    takes_pairs: ClassVar[bool] = False

    sized: ClassVar[dict] = {}
    given: ClassVar[frozenset] = frozenset()
    recipe: ClassVar[dict] = {}  # the --task recipe's values the run takes (no flag or --config set them)
    recipe_path: ClassVar[str | None] = None
    method_recipe: ClassVar[dict] = {}  # the method recipe's values the run takes (nothing above set them)
    sft_sources: ClassVar[dict] = {}  # each key of --sft_config: where its value came from
    method: str = field(
        default="grpo", metadata={"help": "grpo (reward), dpo (preference pairs) or distill (a teacher)."}
    )
    task: str | None = field(
        default=None,
        metadata={
            "help": "A task that brings its own prompts, rewards and recipe of defaults: a bundled one by name "
            "(the end of --help names them and the one taken when no data is given) or an import path of a module "
            "with a load(args, seed) -> Task function (minirope.posttraining.tasks). Default: your data "
            "(--dataset_name, --train_file)."
        },
    )
    dataset_name: str | None = field(
        default=None,
        metadata={
            "help": "The task's data, as TRL's scripts take it: a folder saved by `datasets` (save_to_disk), a "
            "folder of data files, or a Hub id. grpo/distill: prompt-only rows ({prompt}, plain or conversational; "
            "other columns reach the rewards); dpo: preference rows ({prompt, chosen, rejected}, or implicit prompt "
            "{chosen, rejected}). Without any data: a bundled task (--task)."
        },
    )
    dataset_test_split: str = field(
        default="test",
        metadata={
            "help": "The held-out split the measures use; if the dataset has none, --test_split_size of the "
            "training rows are held out instead (never trained on)."
        },
    )
    train_file: list[str] | None = field(
        default=None,
        metadata={"help": "Instead of --dataset_name: .jsonl/.json/.parquet files of the same rows."},
    )
    validation_file: list[str] | None = field(
        default=None, metadata={"help": "Held-out rows for the measures, as --train_file."}
    )
    datasets: list[DatasetConfig] = field(
        default_factory=list,
        metadata={
            "help": "Instead of --dataset_name: TRL's dataset mixture, as `trl grpo` reads it (trl.get_dataset): "
            "Hub ids or folders here, or in a --config file mappings of path, name, data_dir, data_files, split, "
            "columns and fraction; their rows are trained on, less --test_split_size held out."
        },
    )
    test_split_size: float | None = field(
        default=None,
        metadata={
            "help": "Without a test split or --validation_file: the rows held out for the measures (the first ones, "
            "never trained on), a share up to 0.5 or a number of rows, as TRL's dataset mixture takes it. Default: "
            "recipes/every_method.yaml's."
        },
    )
    reward_funcs: list[str] | None = field(
        default=None,
        metadata={
            "help": "Rewards by import path (my_rewards.exact_match, imported from the working directory as `trl "
            "grpo` does), by name from TRL's registry or from the --task's own, called as TRL calls them: prompts, "
            "completions, completion_ids and every dataset column as keyword arguments. grpo trains on them; dpo "
            "ranks its own samples into pairs by their weighted sum; every method measures them on the held-out "
            "prompts. Needed for grpo on your data; a bundled task's recipe names its own."
        },
    )
    num_prompts: int | None = field(
        default=None,
        metadata={
            "help": "At most this many training prompts. Default: every row of your data (dpo's own pairs: "
            "`minirope-posttrain dpo --help`); a bundled task's recipe sets its own."
        },
    )
    lm_coef: float | None = field(
        default=None,
        metadata={
            "help": "Weight of the language-modelling loss on your pretraining text added to each update (ptx), "
            "where there is a corpus (--lm_train_file, --lm_dataset_name, or the bundled plays for a model the run "
            "summary says was trained on them), else off. Default: the method's recipe's."
        },
    )
    lm_train_file: list[str] | None = field(
        default=None,
        metadata={"help": "The corpus term's text: .txt/.jsonl/.json/.parquet files or globs (--text_column 'text')."},
    )
    lm_dataset_name: str | None = field(
        default=None, metadata={"help": "The corpus term's text: the train split of a `datasets` dataset ('text')."}
    )
    lm_validation_file: list[str] | None = field(
        default=None,
        metadata={
            "help": "Validation text whose bits per byte is measured before and after (default: the bundled "
            "validation plays when the corpus term is the bundled plays)."
        },
    )
    lm_batch_size: int | None = field(
        default=None,
        metadata={"help": "Corpus blocks per micro-batch for the corpus term. Default: recipes/every_method.yaml's."},
    )
    sft_steps: int | None = field(
        default=None,
        metadata={
            "help": "A warm start: steps of TRL's SFTTrainer before the method, on --sft_train_file or a --task's "
            "demonstrations. Default: with --sft_train_file the method recipe's (grpo, dpo; distill takes none), a "
            "--task recipe's, else 0."
        },
    )
    sft_train_file: list[str] | None = field(
        default=None,
        metadata={
            "help": "The warm start's demonstrations of your task: .jsonl/.json/.parquet rows in TRL's SFT formats "
            "(text, prompt/completion, messages), or .txt files (each one text row)."
        },
    )
    sft_config: dict | str | None = field(
        default=None,
        metadata={
            "help": "The warm start's TRL SFTConfig flags as JSON, as TRL takes --model_init_kwargs (a mapping in a "
            "--config file), e.g. '{\"learning_rate\": 1e-3}', and lm_coef, its corpus term's weight. Each key "
            "given replaces the recipe's. Default: the method recipe's (--print_settings True shows them)."
        },
    )
    weight_interpolation: float = field(
        default=1.0, metadata={"help": "Saved weights = start + a * (tuned - start), a in (0, 1] (WiSE-FT)."}
    )
    keep_last: bool = field(
        default=False,
        metadata={
            "help": "Keep the last step's weights even where an earlier measure (or the starting model) scored higher "
            "on the held-out prompts; by default the best-scoring weights are kept, and the run says what it gained."
        },
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Replace a model of another architecture that minirope wrote in --output_dir, or write the run "
            "into a folder of your files (they are left as they are)."
        },
    )
    push_data: bool = field(
        default=False,
        metadata={
            "help": "With --push_to_hub, push the data too: preference_pairs.jsonl (your rows, every column) and the "
            "held-out prompts with the model's replies in run_summary.json; by default they stay on this machine."
        },
    )
    eval_prompts: int | None = field(
        default=None,
        metadata={"help": "Held-out prompts measured before and after: default all (a --task recipe sets its own)."},
    )
    eval_sampled_prompts: int | None = field(
        default=None,
        metadata={
            "help": "Held-out prompts (the first of them) sampled --num_generations_eval times, for the sampled "
            "rewards, the share of distinct completions and GRPO's signal check; the greedy measures take every "
            "held-out prompt. A number at least the held-out prompts' samples them all. Default: "
            "recipes/every_method.yaml's."
        },
    )
    eval_max_new_tokens: int | None = field(
        default=None,
        metadata={"help": "Tokens sampled for each measured completion. Default: recipes/every_method.yaml's."},
    )
    print_settings: bool = field(
        default=False,
        metadata={
            "help": "Print the run's effective settings (every value that differs from TRL's default, with its "
            "source: command line, --config, recipe, sized, method recipe) as JSON and exit, reading no weights "
            "and writing nothing."
        },
    )

    def __post_init__(self) -> None:
        for name in ("num_prompts", "lm_batch_size", "eval_prompts", "eval_sampled_prompts", "eval_max_new_tokens"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"--{name} must be >= 1, got {getattr(self, name)}.")
        if self.sft_steps is not None and self.sft_steps < 0:
            raise ValueError(f"--sft_steps must be >= 0 (0: no warm start), got {self.sft_steps}.")
        if self.lm_coef is not None and self.lm_coef < 0:
            raise ValueError(f"--lm_coef must be >= 0, got {self.lm_coef}.")
        self.sft_config = sft_mapping(self.sft_config)
        if not 0 < self.weight_interpolation <= 1:
            raise ValueError(f"--weight_interpolation must be in (0, 1], got {self.weight_interpolation}.")
        DatasetMixtureConfig.__post_init__(self)  # TRL's: the --datasets mappings as its DatasetConfigs
        size = self.test_split_size
        if size is None or not (0 < size <= 0.5 or size >= 1 and size == int(size)):
            raise ValueError(f"--test_split_size must be a share in (0, 0.5] or a whole number of rows, got {size}.")
        if len(data := [name for name in ("dataset_name", "datasets", "train_file") if getattr(self, name)]) > 1:
            raise ValueError(f"Give one of --{' or --'.join(data)} (--validation_file with --train_file), not both.")
        if self.validation_file and not self.train_file:
            raise ValueError("--validation_file needs a --train_file (alone, there would be nothing to train on).")
        if self.lm_train_file and self.lm_dataset_name:
            raise ValueError("Give either --lm_train_file or --lm_dataset_name for the corpus term, not both.")
        if self.dataset_streaming or self.streaming:
            raise ValueError(f"--{'dataset_' * self.dataset_streaming}streaming: minirope-posttrain holds out and "
                             f"measures prompts from the whole dataset; drop the flag.")  # fmt: skip
        if self.ignore_bias_buffers:
            raise ValueError("--ignore_bias_buffers is a DDP workaround of TRL's dpo script for models with bias "
                             "buffers; minirope's models have none: drop the flag.")  # fmt: skip

    @property
    def prompt_limit(self) -> int | None:
        """`--num_prompts`, or its default: None, every row."""
        return self.num_prompts

    @property
    def warm_start_steps(self) -> int:
        """`--sft_steps` (given or a recipe's: the method recipe's `with_sft_train_file`, a task's), else 0."""
        return self.sft_steps or 0

    @property
    def sft_batch_size(self) -> int:
        """The warm start's rows a step: `--sft_config`'s `per_device_train_batch_size`, else SFTConfig's default."""
        return self.sft_config.get("per_device_train_batch_size", SFTConfig.per_device_train_batch_size)

    @property
    def sft_learning_rate(self) -> float:
        """The warm start's peak learning rate: `--sft_config`'s `learning_rate` (the method recipe's, `with_use_peft`'s
        under --use_peft), else SFTConfig's default."""
        return self.sft_config.get("learning_rate", SFTConfig.learning_rate)

    @property
    def sft_lm_coef(self) -> float:
        """The corpus term's weight during the warm start: `--sft_config`'s `lm_coef`, else 0."""
        return self.sft_config.get("lm_coef", 0.0)

    def check_task(self, task) -> None:
        """The method's checks of the run's `Task` and rewards before any work; the base takes every task."""

    def require_rewards(self, what: str) -> None:
        """Raises ValueError when no `--reward_funcs` are given: the method `what` (trains on, ranks its own
        samples by) them."""
        if not self.reward_funcs:
            raise ValueError(
                f"--method {self.method} {what} a reward: give --reward_funcs, by name or import path "
                f"(my_rewards.exact, a function (prompts, completions, **columns) -> list[float])."
            )

    def trainer_line(self, summary: dict) -> str:
        """The model card's words for the method's trainer, from the run `summary`."""
        raise NotImplementedError(f"{type(self).__name__}: a method's script arguments say what trained the model.")

    def rejected_by_used(self, task) -> str | None:
        """How the run's own preference pairs chose their rejected sample (`--rejected_by`); None: no own pairs."""
        return None
