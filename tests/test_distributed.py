"""The pretraining and fine-tuning scripts run unchanged on 2 processes (DDP and FSDP2, gloo on CPU), and the
model runs under transformers' tensor-parallel plan.

Tolerance: the 2-process run sees the same global batch (2 x 4 blocks vs 1 x 8) in the same order, in
fp32; only the order of the gradient summation differs (an all-reduce of two half-batch means), which
changes results by float32 rounding, ~1e-7 relative per step. 1e-5 relative on the losses after 10 steps
leaves room for that and still fails on any real difference (a wrong batch, a missed all-reduce or a
different learning-rate schedule moves the loss by > 1e-3).
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import TINY_RUN, random_model, tiny_config

from minirope import MiniRopeForCausalLM

TOLERANCE = 1e-5
RUN = [*TINY_RUN, "--bf16", "False", "--max_steps", "10", "--eval_strategy", "no", "--save_strategy", "no",
       "--logging_steps", "1", "--max_train_samples", "200", "--seed", "1"]  # fmt: skip


def launch(command: list[str], cwd) -> None:
    """Run `command` with every process on the CPU (gloo): two ranks never share one GPU, and a machine with one
    GPU runs these tests as CI does (`CUDA_VISIBLE_DEVICES=""`; the single-process baselines too, for the same
    float32 arithmetic)."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=cwd, env=env)
    assert result.returncode == 0, result.stderr[-4000:]


def losses(folder) -> tuple[list[float], float]:
    state = json.loads((folder / "trainer_state.json").read_text())
    train = [entry["loss"] for entry in state["log_history"] if "loss" in entry]
    return train, json.loads((folder / "eval_results.json").read_text())["eval_nats_per_token"]


def assert_close(single, multi):
    (train_a, eval_a), (train_b, eval_b) = losses(single), losses(multi)
    assert len(train_a) == len(train_b) == 10
    for a, b in [*zip(train_a, train_b, strict=True), (eval_a, eval_b)]:
        assert abs(a - b) <= TOLERANCE * abs(a), (a, b)


@pytest.fixture(scope="module")
def single_process(tmp_path_factory):
    out = tmp_path_factory.mktemp("single")
    launch([sys.executable, "-m", "minirope.commands.pretrain", *RUN, "--per_device_train_batch_size", "8",
            "--output_dir", str(out)], out)  # fmt: skip
    return out


def test_torchrun_two_processes_match_one(single_process, tmp_path):
    launch([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m",
            "minirope.commands.pretrain", *RUN, "--per_device_train_batch_size", "4", "--output_dir",
            str(tmp_path)], tmp_path)  # fmt: skip
    assert_close(single_process, tmp_path)
    summary = json.loads((tmp_path / "run_summary.json").read_text())
    assert (summary["processes"], summary["distributed_type"]) == (2, "MULTI_CPU")


def test_accelerate_launch_fine_tuning_runs_on_two_processes(tiny_pretrained, tmp_path):
    launch([sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--cpu", "-m",
            "minirope.commands.finetune", "--model_name_or_path", str(tiny_pretrained), "--play", "the-tempest",
            "--max_steps", "4", "--per_device_train_batch_size", "2", "--torch_compile", "False",
            "--output_dir", str(tmp_path / "out")], tmp_path)  # fmt: skip
    summary = json.loads((tmp_path / "out" / "run_summary.json").read_text())
    assert summary["steps"] == 4
    assert summary["after"]["eval_nats_per_token"] < summary["before"]["eval_nats_per_token"]


FULLY_SHARDED = textwrap.dedent(
    """
    import json, sys
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import fully_shard
    from minirope import MiniRopeForCausalLM

    folder, out, world = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if world > 1:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if world > 1 else 0
    model = MiniRopeForCausalLM.from_pretrained(folder, dtype=torch.float32).train()
    if world > 1:
        for layer in model.model.layers:  # one unit per decoder layer, as the shipped FSDP config wraps
            fully_shard(layer)
        fully_shard(model)
        sharded = type(model.model.layers[0].self_attn.q_proj.weight).__name__
    optimizer = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9)  # no per-element normalisation: see below
    data = torch.randint(3, model.config.vocab_size, (6, 8, 16), generator=torch.Generator().manual_seed(0))
    losses = []
    for batch in data:  # the same global batch of 8 each step; each process takes its share
        share = batch.chunk(world)[rank]
        loss = model(share, labels=share).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        loss = loss.detach()
        if world > 1:
            dist.all_reduce(loss)
        losses.append(loss.item() / world)
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        saved = MiniRopeForCausalLM.from_pretrained(folder)
        saved.load_state_dict(state)
        saved.save_pretrained(out)
        json.dump({"losses": losses, "sharded": sharded if world > 1 else None}, open(out + "/fsdp.json", "w"))
    if world > 1:  # no rank leaves while another still talks to it (gloo aborts a process exiting mid-use)
        dist.barrier()
        dist.destroy_process_group()
    """
)


@pytest.mark.slow  # FSDP2 on two processes (~16 s); torchrun and accelerate DDP are checked in the default run
def test_fully_sharded_fsdp2_matches_one_process_and_saves_a_folder_that_loads(tmp_path):
    """FSDP2 (`fully_shard`, one unit per decoder layer) on 2 CPU processes, against the same optimizer steps on
    one process with the whole batch: equal losses within float32 summation order (1e-5 relative), and a
    gathered full state dict that saves and loads as a minirope folder, with the single run's weights.

    The optimizer is SGD with momentum, whose update is proportional to the gradient: two summation orders give
    weights that differ by rounding. AdamW divides each gradient element by its own running magnitude, so an element
    that is zero up to rounding (a gradient summed from terms that cancel) takes a step of up to the learning rate
    in a direction rounding picks: measured on an AVX-512 AMD EPYC, one embedding element with gradient 3e-8 (the
    row's largest: 9e-2) at its row's first update ended 5.8e-4 apart after 6 AdamW steps at lr 3e-3, every other
    weight within 7e-6. That tests rounding, not sharding.

    The Trainer scripts cannot be run under FSDP on CPU: accelerate turns FSDP on only for GPU-like devices (a
    `--cpu` launch with the FSDP config silently runs one plain process), so this drives `fully_shard` directly.
    """
    random_model(tiny_config("gqa")).save_pretrained(tmp_path / "model")
    (tmp_path / "fsdp.py").write_text(FULLY_SHARDED)
    launch([sys.executable, str(tmp_path / "fsdp.py"), str(tmp_path / "model"), str(tmp_path / "one"), "1"], tmp_path)
    launch([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(tmp_path / "fsdp.py"),
            str(tmp_path / "model"), str(tmp_path / "two"), "2"], tmp_path)  # fmt: skip
    one, two = (json.loads((tmp_path / run / "fsdp.json").read_text()) for run in ("one", "two"))
    assert two["sharded"] == "DTensor"
    assert len(two["losses"]) == 6 and two["losses"][-1] < two["losses"][0]
    for a, b in zip(one["losses"], two["losses"], strict=True):
        assert abs(a - b) <= TOLERANCE * abs(a), (a, b)
    sharded, single = (
        MiniRopeForCausalLM.from_pretrained(tmp_path / "two"),
        MiniRopeForCausalLM.from_pretrained(tmp_path / "one"),
    )
    initial = MiniRopeForCausalLM.from_pretrained(tmp_path / "model").state_dict()
    for name, param in sharded.state_dict().items():
        torch.testing.assert_close(param, single.state_dict()[name], rtol=1e-4, atol=1e-5, msg=name)
        assert (param - initial[name]).abs().max() > 1e-3, name  # trained: the comparison can fail


TENSOR_PARALLEL = textwrap.dedent(
    """
    import sys, warnings
    import torch
    import torch.distributed as dist
    import minirope
    from transformers import AutoModelForCausalLM, DistributedConfig

    warnings.filterwarnings("error", category=FutureWarning, module="minirope")  # no deprecated call of ours
    folder, out = sys.argv[1], sys.argv[2]
    tensor_parallel = DistributedConfig(tp_plan="auto")  # transformers 5.24 deprecates from_pretrained(tp_plan=...)
    model = AutoModelForCausalLM.from_pretrained(folder, distributed_config=tensor_parallel, dtype=torch.float32)
    ids = torch.randint(3, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    loss = model(ids, labels=ids).loss
    loss.backward()
    grads = {name: getattr(p.grad, "full_tensor", lambda g=p.grad: g)() for name, p in model.named_parameters()}
    sharded = sorted(name for name, p in model.named_parameters() if type(p.data).__name__ == "DTensor")
    if dist.get_rank() == 0:
        torch.save({"loss": loss.detach(), "grads": grads, "sharded": sharded}, out)
    dist.barrier()
    dist.destroy_process_group()
    """
)


def test_tensor_parallel_forward_and_backward_match_one_process(tmp_path):
    """`tp_plan="auto"` (the config's `base_model_tp_plan`) on 2 processes: the projections become DTensors, which
    take the standard linear (the oneDNN op has no sharding rule); loss and gradients equal one process's."""
    model = random_model(tiny_config("gqa"))
    model.save_pretrained(tmp_path / "model")
    (tmp_path / "tp.py").write_text(TENSOR_PARALLEL)
    launch([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(tmp_path / "tp.py"),
            str(tmp_path / "model"), str(tmp_path / "out.pt")], tmp_path)  # fmt: skip
    result = torch.load(tmp_path / "out.pt")
    assert {name.rsplit(".", 2)[-2] for name in result["sharded"]} >= {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    }
    model.train()
    ids = torch.randint(3, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    loss = model(ids, labels=ids).loss
    loss.backward()
    torch.testing.assert_close(result["loss"], loss.detach(), rtol=1e-5, atol=0)
    for name, param in model.named_parameters():
        torch.testing.assert_close(result["grads"][name], param.grad, rtol=1e-4, atol=1e-6, msg=name)


def posttrain_flags(root, model, method: str) -> list[str]:
    """A tiny `minirope-posttrain` run on a user's task (test_posttrain's), its reward module in `root`, the folder it
    runs in: held-out scores at steps 2 and 4, the best kept."""
    from test_posttrain import SOLUTION_REWARD, TINY_GRPO, TINY_POST, problems_folder

    (root / "task_rewards.py").write_text(SOLUTION_REWARD)
    folder = problems_folder(root, test_split=True)
    own = TINY_GRPO if method == "grpo" else ["--min_reward_margin", "0.01"]  # DPO: pairs from its own samples
    return ["--method", method, "--model_name_or_path", str(model), "--dataset_name", str(folder), "--reward_funcs",
            "task_rewards.starts_right", *TINY_POST, *own, "--sft_steps", "0", "--max_steps", "4", "--eval_steps", "2",
            "--keep_last", "False", "--seed", "3"]  # fmt: skip


# DPO under accelerate in `make test-slow` (~50 s on a Zen 3); the default run launches accelerate with pretraining
@pytest.mark.parametrize(
    ("launcher", "method"), [("torchrun", "grpo"), pytest.param("accelerate", "dpo", marks=pytest.mark.slow)]
)
def test_posttraining_on_two_processes_measures_once_and_writes_one_folder(tiny_pretrained, tmp_path, monkeypatch,
                                                                           launcher, method):  # fmt: skip
    """`minirope-posttrain` under torchrun (GRPO) and `accelerate launch` (DPO, ranking its own samples) on 2 CPU
    processes: every rank trains; the main process samples the measures and every rank scores those samples
    (`sampling.on_main_process`), so the measures before training equal a one-process run's; the kept step is the
    best measured one; one folder, written by the main process, that loads."""
    from minirope.commands import posttrain

    flags = posttrain_flags(tmp_path, tiny_pretrained, method)
    monkeypatch.chdir(tmp_path)
    single = posttrain.run([*flags, "--output_dir", str(tmp_path / "single")])
    start = {
        "torchrun": [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"],
        "accelerate": [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--cpu"],
    }
    launch([*start[launcher], "-m", "minirope.commands.posttrain", *flags, "--output_dir", str(tmp_path / "two")],
           tmp_path)  # fmt: skip
    summary = json.loads((tmp_path / "two" / "run_summary.json").read_text())
    assert summary["steps"] == 4 and summary["before"] == single["before"]
    measured = summary["kept"]["measured"]
    assert [entry["step"] for entry in measured] == [0, 2, 4]
    best = max(measured, key=lambda entry: (entry["score"], -entry["step"]))
    assert summary["kept"]["kept_step"] == best["step"]
    assert not list((tmp_path / "two").glob("checkpoint-*")) and not (tmp_path / "two" / ".staging").exists()
    MiniRopeForCausalLM.from_pretrained(tmp_path / "two")


@pytest.mark.slow  # two more torchrun runs (~95 s on a Zen 3): in `make test-slow`
def test_posttraining_on_two_processes_resumes_to_the_uninterrupted_run(tiny_pretrained, tmp_path, monkeypatch):
    """GRPO under torchrun on 2 CPU processes, checkpoints every 2 of 4 steps, and the folder a run killed after its
    first checkpoint leaves (that checkpoint alone, with each rank's RNG state): resumed on 2 processes with
    `--resume_from_checkpoint last`, it ends with the uninterrupted run's weights, kept step and measures."""
    from safetensors.torch import load_file

    flags = [*posttrain_flags(tmp_path, tiny_pretrained, "grpo"), "--save_strategy", "steps", "--save_steps", "2"]
    monkeypatch.chdir(tmp_path)
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "-m",
        "minirope.commands.posttrain",
    ]
    launch([*torchrun, *flags, "--output_dir", str(tmp_path / "whole")], tmp_path)
    killed = tmp_path / "killed"
    killed.mkdir()
    shutil.copytree(tmp_path / "whole" / "checkpoint-2", killed / "checkpoint-2")
    launch([*torchrun, *flags, "--output_dir", str(killed), "--resume_from_checkpoint", "last"], tmp_path)
    want, got = (json.loads((folder / "run_summary.json").read_text()) for folder in (tmp_path / "whole", killed))
    assert got["kept"] == want["kept"] and got["steps"] == want["steps"] == 4 and got["before"] == want["before"]
    whole, resumed = load_file(tmp_path / "whole" / "model.safetensors"), load_file(killed / "model.safetensors")
    assert all(torch.allclose(resumed[name], whole[name], atol=1e-6) for name in whole)
