"""How closely each export of a trained folder reproduces minirope's logits, measured in the real clients.

    python benchmarks/exports.py --model runs/minirope-shakespeare --output /tmp/exports
    python benchmarks/exports.py --model smol --output /tmp/exports --executorch --gguf_types f32 q8_0 --chat \\
        --prompt "What is 17 + 25? Answer with the number only." "Name three colours of the rainbow."

Scores the first 256 tokens (`<s>` + the text) of the validation play *The Tempest*: transformers'
`LlamaForCausalLM` (`to_llama`), onnxruntime on the ONNX export, llama.cpp (through llama-cpp-python, float32 KV
cache) on the GGUF export in `--gguf_types` (f32, f16 and q8_0), and with `--executorch` ExecuTorch's runtime on the
`.pte` in f32 and 8da8w (its LLM runner for the greedy text); for each: the largest |logit difference| over the
positions, the share of positions with the same argmax, and for each `--prompt` ("ROMEO:\\n"; with `--chat` each a
user's message in the tokenizer's chat template) whether greedy decoding of 64 tokens (fewer where the model ends its
turn) gives `generate()`'s tokens. Prints a table and writes it, with each export's seconds, `generate()`'s replies,
the command and the machine, to OUTPUT/exports.json.
"""

import argparse
import json
import platform
import time
from pathlib import Path

import llama_cpp
import numpy as np
import onnxruntime
import torch
import transformers
from bench_speed import command_line, cpu_description  # this folder's helpers
from transformers import AutoTokenizer

from minirope import MiniRopeForCausalLM
from minirope.convert import to_llama
from minirope.data.bundled import shakespeare_dataset
from minirope.export import export_executorch, export_gguf, export_onnx


def greedy_llama_cpp(llm: llama_cpp.Llama, prompt: list[int], n: int, ends: set[int]) -> list[int]:
    """llama.cpp's greedy tokens after `prompt`: `n`, or fewer up to and with the first of `ends` (as `generate()`
    stops at the end-of-sequence token)."""
    tokens = []
    for token in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
        tokens.append(token)
        if len(tokens) == n or token in ends:
            return tokens
    return tokens


def greedy_onnx(session: onnxruntime.InferenceSession, prompt: list[int], n: int, ends: set[int]) -> list[int]:
    """onnxruntime's greedy tokens after `prompt`, as `greedy_llama_cpp` (the graph has no KV cache: each step runs
    the whole sequence; a check of the graph, not a way to serve it)."""
    tokens: list[int] = []
    while len(tokens) < n and not (tokens and tokens[-1] in ends):
        sequence = np.array([prompt + tokens])
        feed = {"input_ids": sequence, "attention_mask": np.ones_like(sequence)}
        tokens.append(int(session.run(None, feed)[0][0, -1].argmax()))
    return tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="runs/minirope-shakespeare")
    parser.add_argument("--output", type=Path, default=Path("/tmp/minirope-exports"))
    parser.add_argument("--prompt", nargs="+", default=["ROMEO:\n"], help="The greedy decoding's prompts.")
    parser.add_argument("--chat", action="store_true", help="Each prompt is a user's message (the chat template).")
    parser.add_argument("--gguf_types", nargs="+", default=["f32", "f16", "q8_0"])
    parser.add_argument("--executorch", action="store_true", help="Add ExecuTorch's f32 and 8da8w programs.")
    args = parser.parse_args()
    model = MiniRopeForCausalLM.from_pretrained(args.model).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    validation = shakespeare_dataset()["validation"]
    play = dict(zip(validation["source"], validation["text"], strict=True))["the-tempest"]
    length = min(256, model.config.max_position_embeddings)
    ids = [tokenizer.bos_token_id, *tokenizer(play)["input_ids"]][:length]

    def as_chat(text: str) -> str:
        return tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             tokenize=False)  # fmt: skip

    texts = [as_chat(text) if args.chat else text for text in args.prompt]
    prompts = [tokenizer(text, add_special_tokens=not args.chat)["input_ids"] for text in texts]
    with torch.no_grad():
        ours = model(torch.tensor([ids])).logits[0].numpy()
        # 64 tokens each, or fewer where the model ends (a chat reply's turn)
        greedy = [model.generate(torch.tensor([prompt]), max_new_tokens=64, do_sample=False)[0, len(prompt) :].tolist()
                  for prompt in prompts]  # fmt: skip
    ends = set(model.generation_config.eos_token_id if isinstance(model.generation_config.eos_token_id, list)
               else [model.generation_config.eos_token_id])  # fmt: skip

    clock = [time.perf_counter()]

    def row(name: str, logits: np.ndarray, identical: list[bool] | None, size: int | None = None) -> dict:
        difference = np.abs(logits - ours)
        seconds, clock[0] = time.perf_counter() - clock[0], time.perf_counter()
        return {
            "export": name,
            "seconds": round(seconds, 1),  # the export, loading it and its runs
            "megabytes": None if size is None else round(size / 1e6, 2),
            "max_abs_logit_difference": float(difference.max()),
            "last_position_difference": float(difference[-1].max()),
            "argmax_agreement": float((logits.argmax(-1) == ours.argmax(-1)).mean()),
            "greedy_identical": identical,  # one per prompt
        }

    with torch.no_grad():
        rows = [row("to_llama (transformers)", to_llama(model)(torch.tensor([ids])).logits[0].numpy(), None)]
    onnx = export_onnx(args.model, args.output / "onnx", overwrite=True) / "model.onnx"
    session = onnxruntime.InferenceSession(str(onnx))
    feed = {"input_ids": np.array([ids]), "attention_mask": np.ones((1, len(ids)), dtype=np.int64)}
    onnx_greedy = [
        greedy_onnx(session, prompt, 64, ends) == tokens for prompt, tokens in zip(prompts, greedy, strict=True)
    ]
    rows.append(row("onnx (onnxruntime)", session.run(None, feed)[0][0], onnx_greedy, onnx.stat().st_size))
    for outtype in args.gguf_types:
        path = export_gguf(args.model, args.output / f"model-{outtype}.gguf", outtype, overwrite=True)
        f32 = llama_cpp.GGML_TYPE_F32
        llm = llama_cpp.Llama(model_path=str(path), n_ctx=256, n_batch=256, logits_all=True, type_k=f32,
                              type_v=f32, verbose=False)  # fmt: skip
        llm.eval(ids)
        logits = np.array(llm.scores[: len(ids)])
        same = [
            greedy_llama_cpp(llm, prompt, 64, ends) == tokens for prompt, tokens in zip(prompts, greedy, strict=True)
        ]
        rows.append(row(f"gguf {outtype} (llama.cpp)", logits, same, path.stat().st_size))
    if args.executorch:
        replies = [tokenizer.decode([token for token in tokens if token not in ends]) for tokens in greedy]
        rows += executorch_rows(args, ids, prompts, replies, tokenizer, row)
    print(f"{'export':26s} {'MB':>6s} {'max|dlogit|':>12s} {'last pos':>9s} {'argmax':>7s} greedy replies the same")
    for r in rows:
        megabytes = "" if r["megabytes"] is None else f"{r['megabytes']:.2f}"
        same = "-" if r["greedy_identical"] is None else f"{sum(r['greedy_identical'])} of {len(prompts)}"
        difference, last = r["max_abs_logit_difference"], r["last_position_difference"]
        print(f"{r['export']:26s} {megabytes:>6s} {difference:12.2e} {last:9.2e} {r['argmax_agreement']:7.3f} "
              f"{same}")  # fmt: skip
    machine = {
        "cpu": cpu_description(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "llama_cpp_python": llama_cpp.__version__,
        "onnxruntime": onnxruntime.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    replies = {text: tokenizer.decode(tokens) for text, tokens in zip(args.prompt, greedy, strict=True)}
    record = {"command": command_line(), "machine": machine, "chat": args.chat, "generate": replies, "rows": rows}
    (args.output / "exports.json").write_text(json.dumps(record, indent=2) + "\n")


def executorch_rows(args, ids: list[int], prompts: list[list[int]], replies: list[str], tokenizer, row) -> list[dict]:
    """ExecuTorch's f32 and 8da8w programs (a static cache of the scored tokens plus 64): the runtime's logits over
    `ids` in one prefill, and for each of `prompts` its C++ LLM runner's greedy text against `generate()`'s reply
    (`replies`, decoded without the end-of-sequence token)."""
    from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner
    from executorch.runtime import Runtime

    rows, length = [], max(len(ids), *map(len, prompts)) + 64
    for outtype in ("f32", "8da8w"):
        folder = export_executorch(args.model, args.output / f"executorch-{outtype}", outtype, length, overwrite=True)
        forward = Runtime.get().load_program(folder / "model.pte").load_method("forward")
        logits = forward.execute([torch.tensor([ids]), torch.arange(len(ids))])[0][0].numpy()
        runner = TextLLMRunner(str(folder / "model.pte"), str(folder / "tokenizer.json"))
        same = []
        for prompt, reply in zip(prompts, replies, strict=True):
            pieces = []
            config = GenerationConfig(echo=False, max_new_tokens=64, temperature=0.0, num_bos=0, num_eos=0)
            runner.generate(tokenizer.decode(prompt), config, token_callback=pieces.append)
            runner.reset()
            same.append("".join(pieces).removesuffix(tokenizer.eos_token or "") == reply)  # it stops at the turn's end
        rows.append(row(f"executorch {outtype}", logits, same, (folder / "model.pte").stat().st_size))
    return rows


if __name__ == "__main__":
    main()
