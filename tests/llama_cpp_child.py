"""llama.cpp (through llama-cpp-python) in a child process, so that a crash in its native code fails one test.

llama.cpp has segfaulted inside its own kernels on some CPUs (its AMX path on Sapphire Rapids:
ggml-org/llama.cpp#20824). In the pytest process that would end the whole run; here the test that asked fails,
naming the signal, and the suite goes on.

`llama_cpp(path, calls)` starts `python llama_cpp_child.py`, which loads the GGUF once and answers each call:
  ("tokenize", text, add_bos, special) -> token ids
  ("specials",)                         -> [bos id, eos id]
  ("metadata", key)                     -> the GGUF metadata value
  ("scores", ids)                       -> the logits `(len(ids), V)` after evaluating `ids` from an empty cache
  ("greedy", ids, n)                    -> n tokens of greedy decoding (temperature 0, top-k 1) after `ids`
"""

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest


def llama_cpp(path: Path, calls: list, n_ctx: int = 64, f32_cache: bool = True) -> list:
    """The answers to `calls` from llama.cpp on the GGUF at `path` (context `n_ctx`, every position's logits kept,
    a float32 KV cache unless `f32_cache` is False: llama.cpp's default is f16)."""
    pytest.importorskip("llama_cpp")
    request = {"model": str(path), "n_ctx": n_ctx, "f32_cache": f32_cache, "calls": calls}
    answer = Path(str(path) + ".answers.json")
    result = subprocess.run(
        [sys.executable, __file__, str(answer)], input=json.dumps(request), capture_output=True, text=True, timeout=600
    )
    if result.returncode != 0:
        code = result.returncode
        ended = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        pytest.fail(f"llama.cpp ended with {ended} on {path.name}:\n{result.stderr[-3000:]}")
    answers = json.loads(answer.read_text())
    answer.unlink()
    return answers


def main(answer_path: str) -> None:
    import llama_cpp

    request = json.load(sys.stdin)
    options = dict(n_ctx=request["n_ctx"], n_batch=request["n_ctx"], logits_all=True, verbose=False)
    if request["f32_cache"]:
        options.update(type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32)
    llm = llama_cpp.Llama(model_path=request["model"], **options)

    def scores(ids):
        llm.reset()
        llm.eval(ids)
        return llm.scores[: len(ids)].tolist()

    def greedy(ids, n):
        tokens = []
        for token in llm.generate(ids, temp=0.0, top_k=1, reset=True):
            tokens.append(token)
            if len(tokens) == n:
                return tokens
        return tokens

    calls = {
        "tokenize": lambda text, add_bos, special: llm.tokenize(text.encode(), add_bos=add_bos, special=special),
        "specials": lambda: [llm.token_bos(), llm.token_eos()],
        "metadata": lambda key: llm.metadata[key],
        "scores": scores,
        "greedy": greedy,
    }
    answers = [calls[name](*args) for name, *args in request["calls"]]
    Path(answer_path).write_text(json.dumps(answers))


if __name__ == "__main__":
    main(sys.argv[1])
