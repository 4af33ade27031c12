"""`--optim_hidden muon`: the float32 Newton-Schulz against torch's own, the split between Muon and AdamW, the
schedule reaching both, and a run resumed from a checkpoint equal to one never stopped."""

import shutil

import pytest
import torch
from conftest import ON_CPU, TINY_RUN, random_model, tiny_config
from torch.optim._muon import DEFAULT_A, DEFAULT_B, DEFAULT_C, _zeropower_via_newtonschulz

from minirope.commands import pretrain
from minirope.training.optimizers import Muon, MuonWithAdamW, hidden_matrices, orthogonalize

COEFFICIENTS = (DEFAULT_A, DEFAULT_B, DEFAULT_C)


@pytest.mark.parametrize("shape", [(64, 64), (192, 64), (64, 192), (3, 48, 96)])
def test_orthogonalize_is_torchs_newton_schulz_in_float32(shape):
    torch.manual_seed(0)
    matrices = torch.randn(shape)
    got = orthogonalize(matrices, COEFFICIENTS, steps=5, eps=1e-7)
    assert got.dtype == torch.float32 and got.shape == matrices.shape
    for matrix, ours in zip(matrices.reshape(-1, *shape[-2:]), got.reshape(-1, *shape[-2:]), strict=True):
        theirs = _zeropower_via_newtonschulz(matrix, COEFFICIENTS, 5, 1e-7).float()  # bfloat16 inside
        assert (ours - theirs).abs().max() < 0.05 * theirs.abs().max()  # bfloat16 rounding over five steps, no more
        singular = torch.linalg.svdvals(ours)
        # about orthogonal (torch's coefficients: ~[0.7, 1.2]; five steps cannot lift a random square matrix's
        # smallest singular values, near 0, that far)
        assert singular.max() < 1.25 and (singular > 0.6).float().mean() > 0.9
        assert torch.linalg.svdvals(matrix).max() / torch.linalg.svdvals(matrix).min() > 2  # the input was not


def test_muon_step_equals_torchs_muon_up_to_bfloat16():
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(32, 96)) for _ in range(2)]
    twins = [torch.nn.Parameter(p.detach().clone()) for p in params]
    ours = Muon(params, lr=0.02, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    theirs = torch.optim.Muon(twins, lr=0.02, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    for _ in range(3):
        grads = [torch.randn(32, 96) for _ in params]
        for p, t, g in zip(params, twins, grads, strict=True):
            p.grad, t.grad = g.clone(), g.clone()
        ours.step()
        theirs.step()
    for p, t in zip(params, twins, strict=True):
        torch.testing.assert_close(p, t, rtol=0, atol=2e-3)


def test_hidden_matrices_go_to_muon_the_rest_to_adamw_and_the_schedule_reaches_both():
    model = random_model(tiny_config())
    hidden = hidden_matrices(model)
    names = dict(model.named_parameters())
    assert hidden and all(names[name].ndim == 2 for name in hidden)
    assert not {"model.embed_tokens.weight", "lm_head.weight"} & hidden
    assert all(".self_attn." in name or ".mlp." in name for name in hidden)
    optimizer = MuonWithAdamW(model, lr=1e-3, weight_decay=0.1, no_decay={"model.norm.weight"})
    muon, adamw = optimizer.optimizers
    assert {id(p) for g in muon.param_groups for p in g["params"]} == {id(names[n]) for n in hidden}
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(names)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5)
    assert [g["lr"] for g in muon.param_groups + adamw.param_groups] == [5e-4] * len(optimizer.param_groups)
    del scheduler


@pytest.mark.slow  # two pretraining runs (~16 s); the AdamW resume is checked in the default run
def test_a_muon_run_resumed_from_a_checkpoint_equals_one_never_stopped(tmp_path):
    run = [
        *TINY_RUN,
        *ON_CPU,
        "--optim_hidden",
        "muon",
        "--max_steps",
        "6",
        "--save_steps",
        "3",
        "--save_total_limit",
        "2",
    ]
    want = pretrain.run([*run, "--output_dir", str(tmp_path / "whole")])
    shutil.copytree(tmp_path / "whole" / "checkpoint-3", tmp_path / "resumed" / "checkpoint-3")
    got = pretrain.run([*run, "--output_dir", str(tmp_path / "resumed"), "--resume_from_checkpoint", "last"])
    assert got["eval_nats_per_token"] == want["eval_nats_per_token"]
    adamw_run = [*TINY_RUN, *ON_CPU, "--optim_hidden", "adamw", "--max_steps", "6"]
    adamw = pretrain.run([*adamw_run, "--output_dir", str(tmp_path / "adamw")])
    assert adamw["eval_nats_per_token"] != want["eval_nats_per_token"]  # Muon did train the hidden matrices
    assert "Muon for the hidden matrices and AdamW for the rest" in (tmp_path / "whole" / "README.md").read_text()
    assert "Muon" not in (tmp_path / "adamw" / "README.md").read_text()


def test_the_trainer_gives_muon_the_momentum_flag(tmp_path):
    from minirope.commands import finetune
    from minirope.training.trainer import MiniRopeTrainer

    argv = ["--output_dir", str(tmp_path), "--use_cpu", "True", "--bf16", "False", "--eval_strategy", "no"]
    args = pretrain.parse_args(argv)[2]
    assert args.muon_momentum == 0.9  # pretraining's measured default (docs/studies/recipe.md)
    finetuning = finetune.parse_args(["--model_name_or_path", "unused", "--output_dir", str(tmp_path)])[-1]
    assert finetuning.muon_momentum == 0.95  # torch's, in the other commands
    for momentum in (0.9, 0.8):
        args.muon_momentum = momentum
        muon, _ = MiniRopeTrainer(model=random_model(tiny_config()), args=args).create_optimizer().optimizers
        assert [group["momentum"] for group in muon.param_groups] == [momentum]
