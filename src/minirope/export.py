"""A trained minirope folder as a plain Llama folder, a GGUF file for llama.cpp, an ONNX model or an ExecuTorch program
(the library behind `minirope-export`: `export_llama`, `export_gguf`, `export_onnx`, `export_executorch`).

Each target is written next to its final path and moved there only once complete, so a failed export leaves
nothing half-written; an existing output is replaced only with `--overwrite`.

- **llama**: `to_llama` weights (safetensors), config (`model_type: llama`), generation config, the tokenizer
  files and a model card: loads with `AutoModelForCausalLM`/`AutoTokenizer` and no remote code.
- **gguf**: written with `gguf` (llama.cpp's own Python library), as llama.cpp's `convert_hf_to_gguf.py` writes a
  Llama: architecture `llama`, q/k rows permuted back to the interleaved RoPE layout llama.cpp rotates
  (`half_split_to_interleaved`), the byte-level BPE vocabulary and merges with llama.cpp's name for the
  pre-tokenizer's regex (`llama-bpe` for Llama 3's, which minirope's tokenizer uses; `gpt-2`), the special ids
  and add-bos/add-eos as the HF tokenizer does them, the RoPE base and the `linear`/`yarn`/`llama3` scalings.
- **onnx**: `torch.onnx.export(..., dynamo=True)`, inputs `input_ids` and `attention_mask` `(batch, sequence)`
  int64 with both axes dynamic, output `logits` `(batch, sequence, vocab)` float32; positions are computed
  inside as `generate()` computes them (`cumsum(attention_mask) - 1`), so left-padded batches are right.
- **executorch**: `model.pte` for ExecuTorch's runtime and its LLM runner (phones, edge boards), through transformers'
  own `TorchExportableModuleForDecoderOnlyLM` (a `StaticCache` of `max_cache_len` positions, batch 1) and
  ExecuTorch's `to_edge_transform_and_lower` with the XNNPACK backend; inputs `input_ids` `(1, T)` and
  `cache_position` `(T,)` int64 (1 <= T < max_cache_len), output logits `(1, T, vocab)` float32, and the metadata
  methods ExecuTorch's `TextLLMRunner` reads (`get_max_seq_len`, `get_bos_id`, `get_eos_ids`, `use_kv_cache`...).
  Weights float32, or `8da8w` (torchao: int8 per-channel weights with int8 dynamic activations for every linear
  layer, as ExecuTorch's own Llama export quantizes; the embedding stays float32).
"""

import ctypes
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from torch import nn
from transformers import PreTrainedTokenizerBase
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from minirope import owned
from minirope.convert import half_split_to_interleaved, to_llama
from minirope.folders import ModelArguments, load_causal_lm
from minirope.modeling_minirope import MiniRopeForCausalLM
from minirope.tokenizer_format import GENERATION_TAG, PRE_TOKENIZER_PATTERN

FORMATS = ("llama", "gguf", "onnx", "executorch")
GGUF_OUTTYPES = ("f32", "f16", "q8_0", "q4_0")
EXECUTORCH_OUTTYPES = ("f32", "8da8w")
GGUF_ROPE_TYPES = ("default", "linear", "yarn", "llama3")  # what llama.cpp's `llama` architecture can express


def check_export_output(output: str | Path, flag: str, overwrite: bool, inputs: dict | None = None) -> None:
    """What an export or import may do to `output`, decided before any work: a new path is written; an existing one
    only with `overwrite`, and then only where minirope wrote all of it (`owned.check_replaceable`: never the working
    directory, a parent of it, the home folder, the root, a folder holding an input, or a folder of the user's).

    Raises:
        FileExistsError: `output` exists and `overwrite` is False.
        ValueError: `output` is not minirope's to replace (one line naming what it holds).
    """
    output = Path(output)
    if output.exists() and not overwrite:
        raise FileExistsError(f"{output} exists: choose another {flag}, or pass --overwrite True.")
    owned.check_replaceable(output, flag, inputs)


RENAME_EXCHANGE = 2  # renameat2(2): swap two paths atomically (Linux 3.15; ext4, xfs, btrfs, tmpfs)


def swap(new: Path, output: Path) -> None:
    """Put `new` at `output` in one step where the system can: a folder is exchanged with `renameat2`, so `output`
    names the old or the new folder at every instant (the old one is then at `new`); elsewhere the old folder is
    first renamed aside (beside `new`), a moment where `output` names nothing."""
    if output.is_dir() and not output.is_symlink():
        libc = ctypes.CDLL(None, use_errno=True)
        exchange = getattr(libc, "renameat2", None)
        at_fdcwd = -100
        if exchange is None or exchange(at_fdcwd, bytes(new), at_fdcwd, bytes(output), RENAME_EXCHANGE) != 0:
            os.rename(output, new.with_name(f"{new.name}.old"))
            os.rename(new, output)
        return
    os.replace(new, output)


@contextmanager
def staged(output: Path, overwrite: bool, command: str = "minirope-export", flag: str = "--output",
           inputs: dict | None = None) -> Iterator[Path]:  # fmt: skip
    """A scratch path beside `output` to write into; once the block succeeds its files are fsynced, a folder is
    marked as `command`'s (`.minirope/run.json` listing its files) and the whole is swapped in (`swap`); on failure
    `output` is untouched. The scratch folder (`.NAME.minirope-XXXX`) is removed either way.

    Raises:
        FileExistsError, ValueError: see `check_export_output`.
    """
    output = Path(output).expanduser()
    check_export_output(output, flag, overwrite, inputs)
    target = output.absolute()
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.minirope-", dir=target.parent))
    new = scratch / target.name
    try:
        yield new
        if new.is_dir():
            owned.record(new, command, {path.name for path in new.iterdir()} - {owned.MARKER_DIR})
        owned.fsync_tree(new)
        swap(new, target)
        owned.fsync_dir(target.parent)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def load(model_dir: str | Path) -> tuple[MiniRopeForCausalLM, PreTrainedTokenizerBase]:
    """The model (float32, eval) and tokenizer of a minirope folder.

    Raises:
        ValueError, OSError: not a minirope causal LM with its tokenizer (`minirope.folders.load_causal_lm`).
    """
    model, tokenizer = load_causal_lm(ModelArguments(str(model_dir)), dtype=torch.float32)
    if not isinstance(model, MiniRopeForCausalLM):
        raise ValueError(f"{str(model_dir)!r} holds a {type(model).__name__}: the exports read minirope folders.")
    return model.eval(), tokenizer


def export_llama(model_dir: str | Path, output: str | Path, overwrite: bool = False) -> Path:
    """Write a plain Llama folder (weights, config, generation config, tokenizer, model card); returns its path."""
    model, tokenizer = load(model_dir)
    output = Path(output)
    with staged(output, overwrite, inputs={"--model": str(model_dir)}) as folder:
        to_llama(model, save_directory=folder)
        tokenizer.save_pretrained(folder)
        (folder / "README.md").write_text(
            f"---\nlibrary_name: transformers\npipeline_tag: text-generation\ntags: [llama, minirope]\n---\n\n"
            f"# {output.name}\n\nA Llama checkpoint exported from the minirope model `{Path(model_dir).name}` by "
            f"`minirope-export --format llama`: the same weights and logits, loadable with transformers alone.\n\n"
            f"```python\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
            f'model = AutoModelForCausalLM.from_pretrained("{output.name}")\n'
            f'tokenizer = AutoTokenizer.from_pretrained("{output.name}")\n```\n'
        )
    return output


def gguf_rope_scaling(config, writer, gguf) -> np.ndarray | None:
    """Write `config.rope_parameters`' scaling into the GGUF header; returns llama3's `rope_freqs` factors.

    Raises:
        ValueError: a scaling llama.cpp's `llama` architecture cannot express (`dynamic`, `longrope`).
    """
    rope = config.rope_parameters
    rope_type = rope["rope_type"]
    if rope_type not in GGUF_ROPE_TYPES:
        raise ValueError(
            f"rope_type {rope_type!r} has no GGUF form llama.cpp's llama architecture runs (it runs "
            f"{', '.join(GGUF_ROPE_TYPES)}): export with --format llama or onnx, or fine-tune with one of those types."
        )
    writer.add_rope_freq_base(rope["rope_theta"])
    if rope_type == "default":
        return None
    if rope_type == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope["factor"])
        return None
    if rope_type == "yarn":
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(rope["factor"])
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        if rope.get("beta_fast") is not None:
            writer.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
        if rope.get("beta_slow") is not None:
            writer.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
        if rope.get("attention_factor") is not None:
            writer.add_rope_scaling_yarn_attn_factor(rope["attention_factor"])
        return None
    # llama3: llama.cpp divides each pair's frequency by a factor, the `rope_freqs` tensor
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](config, None)
    exponents = torch.arange(0, config.head_dim, 2, dtype=torch.float32) / config.head_dim
    return (1.0 / rope["rope_theta"] ** exponents / scaled).numpy().astype(np.float32)


def gguf_pre_tokenizer(tokenizer: PreTrainedTokenizerBase) -> str | None:
    """llama.cpp's name for the tokenizer's pre-tokenizer (`tokenizer.ggml.pre`), or None if llama.cpp has none.

    A byte-level BPE with GPT-2's regex (`ByteLevel(use_regex=True)`: minirope's tokenizers before 2026-11-24) is
    `gpt-2`; with Llama 3's (`Split(PRE_TOKENIZER_PATTERN)` then `ByteLevel(use_regex=False)`: minirope's now, and
    Meta-Llama-3's) it is `llama-bpe`. Any other pre-tokenizer, or another model than BPE: None.
    """
    state = json.loads(tokenizer.backend_tokenizer.to_str())
    pre = state.get("pre_tokenizer") or {}
    if state["model"]["type"] != "BPE":
        return None
    if pre.get("type") == "ByteLevel" and pre.get("use_regex", True):
        return "gpt-2"
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else []
    if (
        len(steps) == 2
        and steps[0]["type"] == "Split"
        and steps[0]["pattern"] == {"Regex": PRE_TOKENIZER_PATTERN}
        and steps[0]["behavior"] == "Isolated"
        and not steps[0]["invert"]
        and steps[1]["type"] == "ByteLevel"
        and not steps[1]["use_regex"]
    ):
        return "llama-bpe"
    return None


def gguf_vocabulary(tokenizer: PreTrainedTokenizerBase, vocab_size: int, gguf) -> tuple[list[str], list[int]]:
    """Token strings and types for ids `0 .. vocab_size-1`, as `convert_hf_to_gguf.py`'s `get_vocab_base`."""
    by_id = {index: token for token, index in tokenizer.get_vocab().items()}
    special = set(tokenizer.all_special_ids)
    tokens, types = [], []
    for index in range(vocab_size):
        if index not in by_id:
            tokens.append(f"[PAD{index}]")
            types.append(gguf.TokenType.UNUSED)
        else:
            tokens.append(by_id[index])
            types.append(gguf.TokenType.CONTROL if index in special else gguf.TokenType.NORMAL)
    return tokens, types


def gguf_tensor(tensor: torch.Tensor, outtype: str, gguf) -> tuple[np.ndarray, object]:
    """One tensor in the output type: 1-D tensors stay float32; q8_0 and q4_0 (blocks of 32 weights, one scale each:
    llama.cpp's types) fall back to f16 where rows do not divide into blocks."""
    data = tensor.detach().float().numpy()
    if data.ndim == 1 or outtype == "f32":
        return data, gguf.GGMLQuantizationType.F32
    if outtype in ("q8_0", "q4_0"):
        kind = gguf.GGMLQuantizationType[outtype.upper()]
        try:
            return gguf.quants.quantize(data, kind), kind
        except gguf.QuantError:
            pass
    return data.astype(np.float16), gguf.GGMLQuantizationType.F16


def export_gguf(model_dir: str | Path, output: str | Path, outtype: str = "f32", overwrite: bool = False) -> Path:
    """Write a GGUF file that stock llama.cpp loads and runs; returns its path.

    Raises:
        ValueError: an unknown `outtype`, a tokenizer llama.cpp cannot reproduce (not a byte-level BPE), or a
            RoPE scaling llama.cpp cannot express.
    """
    import gguf

    if outtype not in GGUF_OUTTYPES:
        raise ValueError(f"--outtype {outtype!r} is not one of {', '.join(GGUF_OUTTYPES)}.")
    model, tokenizer = load(model_dir)
    config = model.config
    pre_tokenizer = gguf_pre_tokenizer(tokenizer)
    if pre_tokenizer is None:
        backend = tokenizer.backend_tokenizer
        raise ValueError(
            f"the tokenizer in {model_dir} is not a byte-level BPE with GPT-2's or Llama 3's pre-tokenizer (model "
            f"{type(backend.model).__name__}, pre-tokenizer {type(backend.pre_tokenizer).__name__}): GGUF export "
            "supports minirope's own tokenizers."
        )
    output = Path(output)
    file_type = {
        "f32": gguf.LlamaFileType.ALL_F32,
        "f16": gguf.LlamaFileType.MOSTLY_F16,
        "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
        "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
    }[outtype]
    with staged(output, overwrite, inputs={"--model": str(model_dir)}) as path:
        writer = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA])
        writer.add_name(Path(model_dir).name)
        gguf_hyperparameters(writer, config, file_type)
        rope_freqs = gguf_rope_scaling(config, writer, gguf)
        gguf_tokenizer(writer, tokenizer, model_dir, pre_tokenizer, config.vocab_size, gguf)
        gguf_tensors(writer, model, outtype, gguf)
        if rope_freqs is not None:
            writer.add_tensor(gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight", rope_freqs)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return output


def gguf_hyperparameters(writer, config, file_type) -> None:
    """The Llama architecture's hyperparameters in llama.cpp's keys (`llama.context_length`, ...; head sizes and the
    rotary dimension from `head_dim`)."""
    writer.add_vocab_size(config.vocab_size)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_file_type(file_type)


def gguf_tokenizer(writer, tokenizer, model_dir, pre_tokenizer: str, vocab_size: int, gguf) -> None:
    """The byte-level BPE as llama.cpp's `gpt2` tokenizer model: tokens, types, merges, the special tokens (whether
    the tokenizer adds bos/eos, probed) and the chat template without transformers' `{% generation %}` tag, which
    llama.cpp's renderers lack."""
    tokens, types = gguf_vocabulary(tokenizer, vocab_size, gguf)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre_tokenizer)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    special = gguf.SpecialVocab(model_dir, load_merges=True, n_vocab=vocab_size)
    probe = tokenizer("a")["input_ids"]  # does the HF tokenizer add bos/eos around text?
    special.add_special_token = {"bos": probe[0] == tokenizer.bos_token_id, "eos": probe[-1] == tokenizer.eos_token_id}
    if tokenizer.chat_template:
        special.chat_template = GENERATION_TAG.sub("", tokenizer.chat_template)
    special.add_to_gguf(writer, quiet=True)


def gguf_tensors(writer, model, outtype: str, gguf) -> None:
    """Every weight under llama.cpp's name, q_proj/k_proj rows reordered from rotate_half's split halves to
    llama.cpp's interleaved pairs (`half_split_to_interleaved`), a tied lm_head left out (llama.cpp reads a missing
    output.weight as tied to token_embd).

    Raises:
        ValueError: a tensor without a GGUF name."""
    config = model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        if name.endswith(("q_proj.weight", "q_proj.bias")):
            tensor = half_split_to_interleaved(tensor, config.num_attention_heads)
        elif name.endswith(("k_proj.weight", "k_proj.bias")):
            tensor = half_split_to_interleaved(tensor, config.num_key_value_heads)
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise ValueError(f"no GGUF name for tensor {name!r}")
        data, dtype = gguf_tensor(tensor, outtype, gguf)
        writer.add_tensor(gguf_name, data, raw_dtype=dtype)


class LogitsFromIds(nn.Module):
    """`(input_ids, attention_mask)` -> logits, with `generate()`'s positions; the graph `export_onnx` traces."""

    def __init__(self, model: MiniRopeForCausalLM) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        return self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).logits


def export_onnx(model_dir: str | Path, output: str | Path, overwrite: bool = False) -> Path:
    """Write `model.onnx` (dynamic batch and sequence), the config and the tokenizer into a folder; returns it."""
    model, tokenizer = load(model_dir)
    model.config._attn_implementation = "sdpa"
    output = Path(output)
    batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence", min=2)
    # Two distinct example tensors (one tensor passed twice is traced as a single aliased input: wrong logits),
    # the mask left-padded so that tracing goes through the padding path.
    example_ids = torch.randint(0, model.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    example_mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1], [1] * 8])
    with staged(output, overwrite, inputs={"--model": str(model_dir)}) as folder:
        folder.mkdir()
        with torch.no_grad():
            program = torch.onnx.export(
                LogitsFromIds(model).eval(),  # the wrapper too: exported in training mode, ONNX warns
                (example_ids, example_mask),
                dynamo=True,
                input_names=["input_ids", "attention_mask"],
                output_names=["logits"],
                dynamic_shapes={"input_ids": {0: batch, 1: sequence}, "attention_mask": {0: batch, 1: sequence}},
                verbose=False,
            )
        program.save(folder / "model.onnx")
        model.config.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    return output


def quantize_8da8w(model: MiniRopeForCausalLM) -> None:
    """In place, with torchao: every `nn.Linear` (`lm_head` too) to int8 per-output-channel weights with int8
    dynamic per-token activations, the form XNNPACK runs (ExecuTorch's Llama recipe's `8da8w`). The embedding stays
    float32: XNNPACK does not lower torchao's quantized embedding (`dequantize_affine` has no ExecuTorch kernel)."""
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
    from torchao.quantization.granularity import PerAxis

    quantize_(model, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8, weight_granularity=PerAxis(0)))


def runner_metadata(config, tokenizer, length: int) -> dict:
    """The constant methods ExecuTorch's LLM runner reads from a `.pte` (its `get_max_seq_len`, `get_eos_ids`, ...):
    `length` positions of static KV cache, the vocabulary and the tokenizer's bos/eos ids."""
    return {
        "get_max_seq_len": length,
        "get_max_context_len": length,
        "get_vocab_size": config.vocab_size,
        "get_bos_id": tokenizer.bos_token_id,
        "get_eos_ids": [tokenizer.eos_token_id],
        "use_kv_cache": True,
        "enable_dynamic_shape": True,
    }


def export_executorch(
    model_dir: str | Path,
    output: str | Path,
    outtype: str = "f32",
    max_cache_len: int | None = None,
    overwrite: bool = False,
) -> Path:
    """Write a folder with `model.pte` (XNNPACK) and the tokenizer files, for ExecuTorch's runtime; returns it.

    Args:
        model_dir: a minirope folder.
        output: the folder to write.
        outtype: `f32` or `8da8w` (see the module docstring).
        max_cache_len: positions in the static KV cache, prompt and generated tokens together (default: the
            trained context, `max_position_embeddings`); ExecuTorch's runner stops generating there.

    Raises:
        ValueError: an unknown `outtype`, or `max_cache_len` < 2.
        ImportError: `executorch` is not installed (`pip install "minirope[executorch]"`).
    """
    if outtype not in EXECUTORCH_OUTTYPES:
        raise ValueError(f"--outtype {outtype!r} is not one of {', '.join(EXECUTORCH_OUTTYPES)} for ExecuTorch.")
    if max_cache_len is not None and max_cache_len < 2:
        raise ValueError(f"--max_cache_len {max_cache_len} leaves no room to generate: give at least 2 positions.")
    try:
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
        from executorch.exir import to_edge_transform_and_lower
    except ImportError as error:
        raise ImportError(f'{error}: install ExecuTorch with pip install "minirope[executorch]".') from None
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    model, tokenizer = load(model_dir)
    length = max_cache_len or model.config.max_position_embeddings
    model.requires_grad_(False)
    if outtype == "8da8w":
        quantize_8da8w(model)
    model.generation_config.use_cache = True
    model.generation_config.cache_implementation = "static"
    module = TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=length)
    tokens = torch.export.Dim("tokens", max=length - 1)
    with torch.no_grad():  # strict (TorchDynamo) capture: to_edge refuses the non-strict one's graph on torch 2.13
        program = module.export(
            input_ids=torch.tensor([[tokenizer.bos_token_id, 3, 4]]),
            cache_position=torch.arange(3),
            dynamic_shapes={"input_ids": {1: tokens}, "cache_position": {0: tokens}},
            strict=True,
        )
    metadata = runner_metadata(model.config, tokenizer, length)
    lowered = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()], constant_methods=metadata)
    output = Path(output)
    with staged(output, overwrite, inputs={"--model": str(model_dir)}) as folder:
        folder.mkdir()
        (folder / "model.pte").write_bytes(lowered.to_executorch().buffer)
        model.config.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    return output
