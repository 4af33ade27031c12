"""`minirope-generate`: stream text from a saved model with the stock `generate()` and `TextStreamer`.

    minirope-generate --model runs/minirope-shakespeare --prompt "ROMEO:" --max_new_tokens 200
    minirope-generate --model DIR --prompt "KING:" --do_sample False        # greedy
    minirope-generate --model DIR --prompt "KING:" --temperature 0.7 --top_p 0.9 --seed 1
    minirope-generate --model smol --chat --prompt "What is 17 + 25?"     # an instruct model: its reply alone

Sampling settings left unset come from the model's generation_config.json. A folder saved by minirope
loads with or without minirope installed (remote code, `--trust_remote_code`).
"""

import sys
from dataclasses import dataclass, field

import torch
from transformers import HfArgumentParser, TextStreamer, set_seed

from minirope.commands import run_cli
from minirope.cpu_matmuls import use_measured_matmuls
from minirope.folders import ModelArguments, load_causal_lm


@dataclass
class GenerateArguments:
    prompt: str = field(metadata={"help": "Text to continue (with --chat: the user's message)."})
    chat: bool = field(
        default=False,
        metadata={
            "help": "Send --prompt as a user message through the tokenizer's chat template (with the assistant's turn "
            "opened, as `apply_chat_template(..., add_generation_prompt=True)` does) and print the reply alone: for "
            "instruct and chat models."
        },
    )
    system: str | None = field(default=None, metadata={"help": "With --chat: a system message before the prompt."})
    max_new_tokens: int = field(default=200, metadata={"help": "Tokens to generate after the prompt."})
    do_sample: bool | None = field(default=None, metadata={"help": "Sample (True) or greedy (False)."})
    temperature: float | None = field(default=None, metadata={"help": "Softmax temperature when sampling."})
    top_k: int | None = field(default=None, metadata={"help": "Sample from the k most likely tokens."})
    top_p: float | None = field(default=None, metadata={"help": "Nucleus sampling mass."})
    seed: int = field(default=0, metadata={"help": "Random seed, for reproducible samples."})
    measured_matmuls: bool | None = field(
        default=None,
        metadata={
            "help": "On a CPU, run the decoding and prompt matmuls on oneDNN where this machine measured it faster "
            "than torch's default (minirope.cpu_matmuls). Default: only where the timings are already cached for "
            "this CPU and model shape (nothing is timed before a reply); True: time what is missing first (seconds "
            "to a minute, once per CPU and shape, cached); False: torch's matmuls, as Llama's."
        },
    )

    def __post_init__(self) -> None:
        if not self.prompt:
            raise ValueError("--prompt is empty: give the text to continue.")
        if self.max_new_tokens < 1:
            raise ValueError(f"--max_new_tokens must be >= 1, got {self.max_new_tokens}.")
        if self.temperature is not None and not self.temperature > 0:
            raise ValueError(
                f"--temperature must be > 0, got {self.temperature}: for greedy text pass --do_sample False."
            )
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"--top_p must be in (0, 1], got {self.top_p}: e.g. 0.9.")
        if self.top_k is not None and self.top_k < 0:
            raise ValueError(f"--top_k must be >= 0 (0: no limit), got {self.top_k}.")
        if self.system is not None and not self.chat:
            raise ValueError("--system is a chat message: pass --chat too (or put the text in --prompt).")

    def messages(self) -> list[dict[str, str]]:
        """The conversation `--chat` sends: the system message (if any), then the prompt as the user's."""
        system = [{"role": "system", "content": self.system}] if self.system else []
        return [*system, {"role": "user", "content": self.prompt}]

    def generation_kwargs(self) -> dict:
        names = ("max_new_tokens", "do_sample", "temperature", "top_k", "top_p")
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}


def measured_matmuls(model, timing: bool) -> None:
    """`use_measured_matmuls` on a CPU model, for the decoding steps' matmuls and for the prompt's (more than 8
    rows: the decision timed for training), saying what it chose (on stderr, apart from the text); without `timing`
    from the cache alone (a one-off reply waits for no benchmark)."""
    if model.device.type != "cpu":
        return
    decoding = use_measured_matmuls(model, timing=timing)
    prompt = use_measured_matmuls(model, training=True, timing=timing)
    if timing or decoding or prompt:
        total = sum(type(module) is torch.nn.Linear for module in model.modules())
        print(f"[minirope] matmuls on oneDNN, measured faster on this CPU: decoding {len(decoding)}, prompt "
              f"{len(prompt)} of {total} linear layers (--measured_matmuls False: none)", file=sys.stderr)  # fmt: skip


def context_notice(config, prompt_tokens: int, max_new_tokens: int) -> str | None:
    """One line for stderr when the prompt and the new tokens reach past the positions the model was trained on
    (`max_position_embeddings`; a `dynamic` RoPE model rescales itself past it, and says nothing), else None."""
    trained, total = config.max_position_embeddings, prompt_tokens + max_new_tokens
    if total <= trained or (config.rope_parameters or {}).get("rope_type") == "dynamic":
        return None
    return (
        f"[minirope] the prompt ({prompt_tokens} tokens) and --max_new_tokens {max_new_tokens} reach {total} "
        f"positions, past the {trained} this model was trained on: RoPE gives positions past {trained} angles it "
        f"never saw, and the text there usually degrades; minirope-extend stretches the context (RoPE scaling and a "
        f"short fine-tune)."
    )


def run(argv: list[str] | None = None) -> None:
    """Parse `argv`, load the model and tokenizer, and stream a continuation of the prompt to stdout.

    Raises:
        ValueError: bad flags, not a model folder, or no usable tokenizer in it.
        OSError: the weights do not load (truncated or pickle-only).
    """
    model_args, args = HfArgumentParser((ModelArguments, GenerateArguments)).parse_args_into_dataclasses(args=argv)
    model, tokenizer = load_causal_lm(model_args)
    if args.measured_matmuls is not False:
        measured_matmuls(model, timing=bool(args.measured_matmuls))
    set_seed(args.seed)
    inputs = model_inputs(tokenizer, args, model.device)
    notice = context_notice(model.config, inputs["input_ids"].shape[1], args.max_new_tokens)
    if notice:
        print(notice, file=sys.stderr)
    streamer = TextStreamer(tokenizer, skip_prompt=args.chat, skip_special_tokens=True)
    with torch.no_grad():
        model.eval().generate(**inputs, streamer=streamer, **args.generation_kwargs())


def model_inputs(tokenizer, args: GenerateArguments, device) -> dict:
    """The prompt's token ids: the text as it is, or (`--chat`) the conversation through the tokenizer's chat template
    with the assistant's turn opened (the template writes the special tokens, so none are added again).

    Raises:
        ValueError: `--chat` and a tokenizer without a chat template.
    """
    if not args.chat:
        return tokenizer(args.prompt, return_tensors="pt").to(device)
    if tokenizer.chat_template is None:
        raise ValueError(
            "--chat: this model's tokenizer has no chat template: drop --chat to continue the text, or fine-tune the "
            "model on conversations first (minirope-finetune with {messages} rows adds a template)."
        )
    text = tokenizer.apply_chat_template(args.messages(), tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False, return_tensors="pt").to(device)


def main() -> None:
    run_cli("minirope-generate", run)


if __name__ == "__main__":
    main()
