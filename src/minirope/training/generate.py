"""`minirope-generate`: stream text from a saved model with the stock `generate()` and `TextStreamer`.

    minirope-generate --model runs/minirope-shakespeare --prompt "ROMEO:" --max_new_tokens 200
    minirope-generate --model DIR --prompt "KING:" --do_sample False        # greedy
    minirope-generate --model DIR --prompt "KING:" --temperature 0.7 --top_p 0.9 --seed 1

Sampling settings left unset come from the model's generation_config.json. A folder saved by minirope
loads with or without minirope installed (remote code, `--trust_remote_code`).
"""

import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, HfArgumentParser, TextStreamer, set_seed

import minirope  # noqa: F401  (registers the minirope classes with the Auto factories)


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


def main(argv: list[str] | None = None) -> None:
    (args,) = HfArgumentParser(GenerateArguments).parse_args_into_dataclasses(args=argv)
    if not Path(args.model).is_dir() and Path(args.model).exists():
        sys.exit(f"minirope-generate: --model {args.model} is a file; pass the folder written by save_pretrained.")
    if args.max_new_tokens < 1:
        sys.exit(f"minirope-generate: --max_new_tokens must be >= 1, got {args.max_new_tokens}.")
    try:
        tokenizer = AutoTokenizer.from_pretrained(args.model, trust_remote_code=args.trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(args.model, trust_remote_code=args.trust_remote_code)
    except OSError as error:
        sys.exit(f"minirope-generate: cannot load a model from {args.model!r}: {error}")
    set_seed(args.seed)
    inputs = tokenizer(args.prompt, return_tensors="pt").to(model.device)
    streamer = TextStreamer(tokenizer, skip_special_tokens=True)
    with torch.no_grad():
        model.eval().generate(**inputs, streamer=streamer, **args.generation_kwargs())


if __name__ == "__main__":
    main()
