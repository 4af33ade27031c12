"""How closely each export of a trained folder reproduces minirope's logits, measured in the real clients.

    python benchmarks/exports.py --model runs/minirope-shakespeare --output /tmp/exports

Scores the first 256 tokens (`<s>` + the text) of the validation play *The Tempest*: transformers'
`LlamaForCausalLM` (`to_llama`), onnxruntime on the ONNX export, and llama.cpp (through llama-cpp-python, float32
KV cache) on the GGUF export in f32, f16 and q8_0; for each: the largest |logit difference| over the positions,
the share of positions with the same argmax, and whether greedy decoding of 64 tokens from "ROMEO:\\n" gives the
same tokens. Prints a table and writes it to OUTPUT/exports.json.
"""

import argparse
import json
from pathlib import Path

import llama_cpp
import numpy as np
import onnxruntime
import torch
from transformers import AutoTokenizer

from minirope import MiniRopeForCausalLM
from minirope.convert import to_llama
from minirope.data.bundled import shakespeare_dataset
from minirope.export import export_gguf, export_onnx


def greedy_llama_cpp(llm: llama_cpp.Llama, prompt: list[int], n: int) -> list[int]:
    tokens = []
    for token in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
        tokens.append(token)
        if len(tokens) == n:
            return tokens
    return tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="runs/minirope-shakespeare")
    parser.add_argument("--output", type=Path, default=Path("/tmp/minirope-exports"))
    args = parser.parse_args()
    model = MiniRopeForCausalLM.from_pretrained(args.model).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    validation = shakespeare_dataset()["validation"]
    play = dict(zip(validation["source"], validation["text"], strict=True))["the-tempest"]
    length = min(256, model.config.max_position_embeddings)  # an ONNX graph holds the cos/sin of the context only
    ids = [tokenizer.bos_token_id, *tokenizer(play)["input_ids"]][:length]
    prompt = tokenizer("ROMEO:\n")["input_ids"]
    with torch.no_grad():
        ours = model(torch.tensor([ids])).logits[0].numpy()
        greedy = model.generate(torch.tensor([prompt]), max_new_tokens=64, min_new_tokens=64, do_sample=False)
    greedy = greedy[0, len(prompt) :].tolist()

    def row(name: str, logits: np.ndarray, tokens: list[int] | None, size: int | None = None) -> dict:
        difference = np.abs(logits - ours)
        return {
            "export": name,
            "megabytes": None if size is None else round(size / 1e6, 2),
            "max_abs_logit_difference": float(difference.max()),
            "last_position_difference": float(difference[-1].max()),
            "argmax_agreement": float((logits.argmax(-1) == ours.argmax(-1)).mean()),
            "greedy_64_identical": None if tokens is None else tokens == greedy,
        }

    with torch.no_grad():
        rows = [row("to_llama (transformers)", to_llama(model)(torch.tensor([ids])).logits[0].numpy(), None)]
    onnx = export_onnx(args.model, args.output / "onnx", overwrite=True) / "model.onnx"
    session = onnxruntime.InferenceSession(str(onnx))
    feed = {"input_ids": np.array([ids]), "attention_mask": np.ones((1, len(ids)), dtype=np.int64)}
    rows.append(row("onnx (onnxruntime)", session.run(None, feed)[0][0], None, onnx.stat().st_size))
    for outtype in ("f32", "f16", "q8_0"):
        path = export_gguf(args.model, args.output / f"model-{outtype}.gguf", outtype, overwrite=True)
        f32 = llama_cpp.GGML_TYPE_F32
        llm = llama_cpp.Llama(model_path=str(path), n_ctx=256, n_batch=256, logits_all=True, type_k=f32,
                              type_v=f32, verbose=False)  # fmt: skip
        llm.eval(ids)
        logits = np.array(llm.scores[: len(ids)])
        rows.append(row(f"gguf {outtype} (llama.cpp)", logits, greedy_llama_cpp(llm, prompt, 64), path.stat().st_size))
    print(f"{'export':26s} {'MB':>6s} {'max|dlogit|':>12s} {'last pos':>9s} {'argmax':>7s} greedy-64")
    for r in rows:
        megabytes = "" if r["megabytes"] is None else f"{r['megabytes']:.2f}"
        difference, last = r["max_abs_logit_difference"], r["last_position_difference"]
        print(f"{r['export']:26s} {megabytes:>6s} {difference:12.2e} {last:9.2e} {r['argmax_agreement']:7.3f} "
              f"{r['greedy_64_identical']}")  # fmt: skip
    (args.output / "exports.json").write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
