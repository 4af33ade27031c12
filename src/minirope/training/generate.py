"""`minirope-generate`: stream text from a saved model with the stock `generate()` and `TextStreamer`.

    minirope-generate --model runs/minirope-shakespeare --prompt "ROMEO:" --max_new_tokens 200
    minirope-generate --model DIR --prompt "KING:" --do_sample False        # greedy
    minirope-generate --model DIR --prompt "KING:" --temperature 0.7 --top_p 0.9 --seed 1

Sampling settings left unset come from the model's generation_config.json. A folder saved by minirope
loads with or without minirope installed (remote code, `--trust_remote_code`).
"""

from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, HfArgumentParser, TextStreamer, set_seed

import minirope  # noqa: F401  (registers the minirope classes with the Auto factories)
from minirope.training.cli import run_cli


@dataclass
class GenerateArguments:
    model: str = field(metadata={"help": "A folder written by save_pretrained (or a Hub id)."})
    prompt: str = field(metadata={"help": "Text to continue."})
    max_new_tokens: int = field(default=200, metadata={"help": "Tokens to generate after the prompt."})
    do_sample: bool | None = field(default=None, metadata={"help": "Sample (True) or greedy (False)."})
    temperature: float | None = field(default=None, metadata={"help": "Softmax temperature when sampling."})
    top_k: int | None = field(default=None, metadata={"help": "Sample from the k most likely tokens."})
    top_p: float | None = field(default=None, metadata={"help": "Nucleus sampling mass."})
    seed: int = field(default=0, metadata={"help": "Random seed, for reproducible samples."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow the folder's own model code."})

    def generation_kwargs(self) -> dict:
        names = ("max_new_tokens", "do_sample", "temperature", "top_k", "top_p")
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}


def run(argv: list[str] | None = None) -> None:
    """Parse `argv`, load the model and tokenizer, and stream a continuation of the prompt to stdout.

    Raises:
        ValueError: bad flags, or no usable tokenizer in the folder.
        OSError: no loadable model (missing folder, truncated or pickle-only weights).
    """
    (args,) = HfArgumentParser(GenerateArguments).parse_args_into_dataclasses(args=argv)
    if Path(args.model).is_file():
        raise ValueError(f"--model {args.model} is a file: pass the folder written by save_pretrained.")
    if args.max_new_tokens < 1:
        raise ValueError(f"--max_new_tokens must be >= 1, got {args.max_new_tokens}.")
    try:
        model = AutoModelForCausalLM.from_pretrained(args.model, trust_remote_code=args.trust_remote_code)
    except OSError as error:
        raise OSError(f"cannot load a model from {args.model!r}: {error}") from error
    try:
        tokenizer = AutoTokenizer.from_pretrained(args.model, trust_remote_code=args.trust_remote_code)
    except (OSError, ValueError) as error:
        reason = str(error).strip().splitlines()[0]
        raise ValueError(
            f"cannot load a tokenizer from {args.model!r} ({reason}): save it next to the model with "
            f"tokenizer.save_pretrained(folder)."
        ) from error
    set_seed(args.seed)
    inputs = tokenizer(args.prompt, return_tensors="pt").to(model.device)
    streamer = TextStreamer(tokenizer, skip_special_tokens=True)
    with torch.no_grad():
        model.eval().generate(**inputs, streamer=streamer, **args.generation_kwargs())


def main() -> None:
    run_cli("minirope-generate", run)


if __name__ == "__main__":
    main()
