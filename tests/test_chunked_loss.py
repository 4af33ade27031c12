"""`skip_logits=True`: the chunked loss equals transformers' LlamaForCausalLM loss, and so do its gradients."""

import pytest
import torch
from conftest import llama_twin, random_model, tiny_config
from transformers import TrainingArguments

from minirope import kernels_minirope as kernels
from minirope.kernels_minirope import LinearCrossEntropy, loss_chunk_rows
from minirope.training.trainer import MiniRopeTrainer


def loss_and_grads(model, **kwargs):
    model.zero_grad()
    output = model(**kwargs)
    output.loss.backward()
    return output, {name: param.grad.clone() for name, param in model.named_parameters()}


@pytest.fixture(params=[None, 5], ids=["own-rows", "5-rows"])
def chunk_rows(request, monkeypatch):
    """The model's own rows per chunk (one chunk at this tiny vocabulary), and 5, so that many chunks add into one
    weight gradient (the float32 `addmm_` accumulator, or bf16 products added to it under autocast)."""
    if request.param:
        monkeypatch.setattr(kernels, "loss_chunk_rows", lambda vocab_size, device_type: request.param)
    return request.param


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("num_items_in_batch", [None, 40])
def test_chunked_loss_and_gradients_match_llama(layout, tied, num_items_in_batch, chunk_rows):
    model = random_model(tiny_config(layout, tie_word_embeddings=tied)).train()
    llama = llama_twin(model).train()
    input_ids = torch.randint(3, model.config.vocab_size, (3, 24), generator=torch.Generator().manual_seed(5))
    labels = input_ids.clone()
    labels[0, :7] = -100  # a masked prompt
    labels[2, 20:] = -100
    kwargs = dict(input_ids=input_ids, labels=labels, num_items_in_batch=num_items_in_batch)
    ours, our_grads = loss_and_grads(model, skip_logits=True, **kwargs)
    theirs, llama_grads = loss_and_grads(llama, **kwargs)
    assert ours.logits is None and theirs.logits is not None
    torch.testing.assert_close(ours.loss, theirs.loss, rtol=1e-6, atol=0)  # float32 summation order
    for name, grad in our_grads.items():
        torch.testing.assert_close(grad, llama_grads[name], rtol=1e-5, atol=1e-6, msg=name)


def test_chunked_loss_under_bf16_autocast_matches_llama(chunk_rows):
    model = random_model(tiny_config()).train()
    llama = llama_twin(model).train()
    input_ids = torch.randint(3, model.config.vocab_size, (2, 32), generator=torch.Generator().manual_seed(6))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours, our_grads = loss_and_grads(model, input_ids=input_ids, labels=input_ids, skip_logits=True)
        theirs, llama_grads = loss_and_grads(llama, input_ids=input_ids, labels=input_ids)
    torch.testing.assert_close(ours.loss, theirs.loss, rtol=1e-3, atol=0)
    for name, grad in our_grads.items():  # bf16 matrix products: agreement to bf16 rounding (2^-8)
        scale = llama_grads[name].abs().max()
        assert (grad - llama_grads[name]).abs().max() <= 2e-2 * scale, name


def test_linear_cross_entropy_chunking_does_not_change_the_result():
    generator = torch.Generator().manual_seed(7)
    hidden = torch.randn(50, 16, generator=generator, requires_grad=True)
    weight = torch.randn(30, 16, generator=generator, requires_grad=True)
    targets = torch.randint(0, 30, (50,), generator=generator)
    targets[::7] = -100
    expected = torch.nn.functional.cross_entropy(hidden @ weight.T, targets)
    expected_grads = torch.autograd.grad(expected, (hidden, weight))
    products = []

    def product(x, w):  # another kernel for the chunks' products (cpu_matmuls passes oneDNN's): same math
        products.append(tuple(x.shape))
        return torch.mm(x, w.t())

    for chunk_size, kernel in ((1, None), (7, None), (50, None), (64, None), (7, product)):
        loss = LinearCrossEntropy.apply(hidden, weight, targets, None, chunk_size, kernel)
        grads = torch.autograd.grad(2.5 * loss, (hidden, weight))  # the incoming gradient scales both
        torch.testing.assert_close(loss, expected, rtol=0, atol=1e-6)
        for grad, want in zip(grads, expected_grads, strict=True):
            torch.testing.assert_close(grad, 2.5 * want, rtol=1e-5, atol=1e-6)
    # 7 full chunks of 7 rows (and one of 1): logits (7, 16) @ (16, 30), hidden's gradient (7, 30) @ (30, 16), and
    # the weight's (30, 7) @ (7, 16), each through the given kernel
    assert [products.count(shape) for shape in ((7, 16), (7, 30), (30, 7))] == [7, 7, 7]


def test_linear_cross_entropy_is_exact_where_the_target_probability_underflows():
    """Logits hundreds apart (a diverging run): the target's float32 softmax probability is 0, yet the loss is
    the exact log-sum-exp minus the target logit, as transformers' loss gives it, never inf or nan."""
    generator = torch.Generator().manual_seed(8)
    hidden = 40 * torch.randn(12, 16, generator=generator)
    weight = torch.randn(30, 16, generator=generator)
    logits = hidden @ weight.T
    targets = logits.argmin(-1)  # the least likely token: probability exp(-hundreds), 0 in float32
    assert (logits.softmax(-1).gather(-1, targets[:, None]) == 0).all()
    expected = torch.nn.functional.cross_entropy(logits, targets)
    assert 100 < expected < float("inf")
    torch.testing.assert_close(LinearCrossEntropy.apply(hidden, weight, targets, None, 5), expected, rtol=1e-6, atol=0)


def test_chunks_are_large_enough_to_be_fast_and_small_enough_to_save_memory():
    """At any vocabulary a chunk has the rows for compute-bound products (the weight gradient is a (V, D) pass per
    chunk: 16 rows at V = 128,256 made the step 0.42x Llama's on CPU), and its float32 logits stay far below the
    batch's (a 4 x 256 batch at V = 128,256: Llama's logits are 501 MiB, one chunk's at most 128 MiB)."""
    for vocab_size in (97, 4096, 32000, 128256, 256000):
        cpu, cuda = loss_chunk_rows(vocab_size, "cpu"), loss_chunk_rows(vocab_size, "cuda")
        assert cpu >= 256 and cuda >= 1024
    assert loss_chunk_rows(128256, "cpu") * 128256 * 4 <= 128 * 2**20


def test_skip_logits_needs_labels():
    model = random_model(tiny_config())
    with pytest.raises(ValueError, match="pass labels"):
        model(torch.tensor([[3, 4, 5]]), skip_logits=True)


def test_trainer_asks_for_the_loss_alone_in_training_steps_only(tmp_path):
    model = random_model(tiny_config()).train()
    seen = []
    record = lambda module, args, kwargs: seen.append(kwargs.get("skip_logits"))  # noqa: E731
    model.register_forward_pre_hook(record, with_kwargs=True)
    trainer = MiniRopeTrainer(model=model, args=TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[]))
    batch = {"input_ids": torch.tensor([[3, 4, 5, 6]]), "labels": torch.tensor([[3, 4, 5, 6]])}
    trainer.compute_loss(model, batch)
    model.eval()
    trainer.compute_loss(model, batch)
    assert seen == [True, None]


def test_compiled_model_computes_the_loss_from_logits_with_eager_gradients(monkeypatch):
    """Under torch.compile the fused loss is not used (its gradients came out zero there on CUDA, torch 2.11,
    so compiled training did not learn): the compiled model's loss and gradients equal the eager model's."""
    model = random_model(tiny_config(), attn="eager").train()
    input_ids = torch.randint(3, model.config.vocab_size, (2, 24))
    eager = model(input_ids=input_ids, labels=input_ids, skip_logits=True).loss
    eager.backward()
    expected = {name: param.grad.clone() for name, param in model.named_parameters()}
    model.zero_grad()

    def refuse(*args, **kwargs):
        raise AssertionError("the fused loss ran inside torch.compile")

    monkeypatch.setattr(kernels, "chunked_causal_lm_loss", refuse)
    compiled = torch.compile(model, backend="aot_eager")  # the autograd tracing that broke, without Inductor's build
    loss = compiled(input_ids=input_ids, labels=input_ids, skip_logits=True).loss
    loss.backward()
    torch.testing.assert_close(loss, eager, rtol=1e-5, atol=1e-6)
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, expected[name], rtol=1e-4, atol=1e-6, msg=name)
