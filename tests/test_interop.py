"""Llama interop (minirope.convert), remote code without minirope installed, and PEFT LoRA."""

import filecmp
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from conftest import left_padded_batch, llama_twin, random_model, tiny_config
from datasets import Dataset
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import LlamaForCausalLM, Trainer, TrainingArguments, default_data_collator

import minirope
from minirope import MiniRopeForCausalLM
from minirope.convert import from_llama, half_split_to_interleaved, interleaved_to_half_split, to_llama
from minirope.modeling_minirope import MiniRopeAttention, MiniRopeRotaryEmbedding


def logits(model, input_ids, attention_mask=None):
    with torch.no_grad():
        return model(input_ids, attention_mask=attention_mask).logits


def test_to_llama_and_back_give_the_same_logits(tmp_path, layout):
    """Same weights, same function: Llama's logits equal minirope's to float32 rounding (its products run on BLAS,
    minirope's CPU products on oneDNN, which may sum in another order: 1.5e-5 apart seen on an AVX-512 machine);
    minirope -> Llama -> minirope is bit-identical."""
    model = random_model(tiny_config(layout))
    input_ids, attention_mask, _ = left_padded_batch(model.config.vocab_size)
    want = logits(model, input_ids, attention_mask)

    llama = to_llama(model, save_directory=tmp_path)
    assert type(llama) is LlamaForCausalLM
    torch.testing.assert_close(logits(llama, input_ids, attention_mask), want, rtol=0, atol=1e-4)
    # a plain Llama folder: no remote code, loads with transformers alone
    assert not (tmp_path / "modeling_minirope.py").exists()
    reloaded = LlamaForCausalLM.from_pretrained(tmp_path)
    assert reloaded.config.model_type == "llama"
    assert torch.equal(logits(reloaded, input_ids, attention_mask), logits(llama, input_ids, attention_mask))

    for source in (llama, tmp_path):
        back = from_llama(source)
        assert type(back) is MiniRopeForCausalLM
        assert torch.equal(logits(back, input_ids, attention_mask), want)


def test_folder_loads_as_remote_code_where_minirope_is_not_importable(tmp_path):
    model = random_model(tiny_config("gqa"))
    model.save_pretrained(tmp_path / "model")
    input_ids, attention_mask, _ = left_padded_batch(model.config.vocab_size)
    torch.save({"input_ids": input_ids, "attention_mask": attention_mask}, tmp_path / "inputs.pt")
    package = Path(minirope.__file__).parent
    shipped = (
        "modeling_minirope.py",
        "configuration_minirope.py",
        "kernels_minirope.py",
        "rotary_minirope.py",
        "loading_minirope.py",
        "compat_minirope.py",
    )
    for name in shipped:  # shipped unchanged
        assert filecmp.cmp(tmp_path / "model" / name, package / name, shallow=False), name

    script = textwrap.dedent(
        f"""
        import sys, warnings
        # the shipped code calls no deprecated transformers API (e.g. a renamed cache keyword)
        warnings.filterwarnings("error", category=FutureWarning, module="transformers_modules")
        sys.modules["minirope"] = None  # any `import minirope` now raises ImportError
        try:
            import minirope
        except ImportError:
            pass
        else:
            raise SystemExit("minirope is importable")
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification
        folder = {str(tmp_path / "model")!r}
        config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
        model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
        assert type(config).__name__ == "MiniRopeConfig"
        assert type(model).__name__ == "MiniRopeForCausalLM"
        assert not type(model).__module__.startswith("minirope"), type(model).__module__
        assert any(name.endswith(".kernels_minirope") for name in sys.modules)  # the fused loss, shipped
        classifier = AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True, num_labels=2)
        assert type(classifier).__name__ == "MiniRopeForSequenceClassification"
        inputs = torch.load({str(tmp_path / "inputs.pt")!r})
        with torch.no_grad():
            torch.save(model(**inputs).logits, {str(tmp_path / "logits.pt")!r})
        settings = dict(max_new_tokens=40, min_new_tokens=40, do_sample=False, pad_token_id=0)
        cached = model.generate(**inputs, **settings)
        assert torch.equal(cached, model.generate(**inputs, use_cache=False, **settings)), "the cache changed tokens"
        torch.save(cached, {str(tmp_path / "tokens.pt")!r})
        """
    )
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert torch.equal(torch.load(tmp_path / "logits.pt"), logits(model, input_ids, attention_mask))
    settings = dict(max_new_tokens=40, min_new_tokens=40, do_sample=False, pad_token_id=0)
    want = model.generate(input_ids, attention_mask=attention_mask, **settings)
    assert torch.equal(torch.load(tmp_path / "tokens.pt"), want)
    assert torch.equal(want, llama_twin(model).generate(input_ids, attention_mask=attention_mask, **settings))


def test_lora_trains_saves_reloads_and_merges(tmp_path):
    model = random_model(tiny_config("gqa"))
    lora = get_peft_model(
        model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    )
    trainable = {name for name, param in lora.named_parameters() if param.requires_grad}
    assert trainable and all("lora_" in name and ("q_proj" in name or "v_proj" in name) for name in trainable)
    before = {name: param.detach().clone() for name, param in lora.named_parameters() if "lora_B" in name}

    rows = torch.randint(3, 97, (32, 16), generator=torch.Generator().manual_seed(0)).tolist()
    data = Dataset.from_dict({"input_ids": rows, "labels": rows})
    args = TrainingArguments(
        output_dir=str(tmp_path / "trainer"),
        max_steps=5,
        per_device_train_batch_size=8,
        learning_rate=1e-2,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
    )
    Trainer(model=lora, args=args, train_dataset=data, data_collator=default_data_collator).train()
    changed = [
        name for name, param in lora.named_parameters() if "lora_B" in name and not torch.equal(param, before[name])
    ]
    assert changed

    input_ids = torch.tensor(rows[:2])
    lora.eval()
    adapted = logits(lora, input_ids)
    lora.save_pretrained(tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    base = random_model(tiny_config("gqa"))  # same seed: the same base weights
    reloaded = PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    assert torch.equal(logits(reloaded, input_ids), adapted)
    merged = reloaded.merge_and_unload()
    assert type(merged) is MiniRopeForCausalLM
    torch.testing.assert_close(logits(merged, input_ids), adapted, rtol=0, atol=1e-5)


# --- Interleaved (Meta / complex-number) RoPE checkpoints ---------------------------------------------


def complex_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """RoFormer eq. 34 in complex form, as in Meta's Llama code: pairs (x_2i, x_2i+1) times e^{i m theta_i}.

    x: (B, T, heads, d); positions: (T,).
    """
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2)[: d // 2].float() / d))
    freqs_cis = torch.polar(torch.ones(len(positions), d // 2), torch.outer(positions.float(), inv_freq))
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(pairs * freqs_cis[None, :, None, :]).flatten(3)


def meta_attention(x, wq, wk, wv, wo, num_heads, num_kv_heads, theta):
    """Causal GQA attention of Meta's reference Llama, with interleaved complex-form RoPE. x: (B, T, D)."""
    batch, length, _ = x.shape
    q = (x @ wq.T).view(batch, length, num_heads, -1)
    k = (x @ wk.T).view(batch, length, num_kv_heads, -1)
    v = (x @ wv.T).view(batch, length, num_kv_heads, -1)
    positions = torch.arange(length)
    q, k = complex_rope(q, positions, theta), complex_rope(k, positions, theta)
    groups = num_heads // num_kv_heads
    k, v = k.repeat_interleave(groups, dim=2), v.repeat_interleave(groups, dim=2)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(torch.ones(length, length, dtype=torch.bool).triu(1), float("-inf"))
    out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, length, -1)
    return out @ wo.T


def test_permuted_interleaved_weights_give_the_same_attention(layout):
    config = tiny_config(layout)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    heads, kv_heads, d, hidden = (
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
        config.hidden_size,
    )
    wq, wk = torch.randn(heads * d, hidden) * 0.2, torch.randn(kv_heads * d, hidden) * 0.2
    wv, wo = torch.randn(kv_heads * d, hidden) * 0.2, torch.randn(hidden, heads * d) * 0.2
    x = torch.randn(2, 20, hidden)
    want = meta_attention(x, wq, wk, wv, wo, heads, kv_heads, config.rope_parameters["rope_theta"])

    attention = MiniRopeAttention(config, layer_idx=0).eval()
    with torch.no_grad():
        attention.q_proj.weight.copy_(interleaved_to_half_split(wq, heads))
        attention.k_proj.weight.copy_(interleaved_to_half_split(wk, kv_heads))
        attention.v_proj.weight.copy_(wv)
        attention.o_proj.weight.copy_(wo)
        rope = MiniRopeRotaryEmbedding(config)
        causal = torch.full((20, 20), float("-inf")).triu(1)[None, None]
        got, _ = attention(x, rope(x, torch.arange(20)[None]), attention_mask=causal)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # without the permutation the same weights give a different function
    with torch.no_grad():
        attention.q_proj.weight.copy_(wq)
        attention.k_proj.weight.copy_(wk)
        unpermuted, _ = attention(x, rope(x, torch.arange(20)[None]), attention_mask=causal)
    assert (unpermuted - want).abs().max() > 1e-3


def test_layout_permutations_are_inverse():
    weight = torch.arange(4 * 8 * 3).reshape(4 * 8, 3)
    half = interleaved_to_half_split(weight, num_heads=4)
    assert half[:8, 0].tolist() == [0, 6, 12, 18, 3, 9, 15, 21]  # head 0: rows 0,2,4,6 then 1,3,5,7 (x3 columns)
    assert torch.equal(half_split_to_interleaved(half, num_heads=4), weight)
    bias = torch.arange(16)
    assert torch.equal(half_split_to_interleaved(interleaved_to_half_split(bias, 2), 2), bias)
