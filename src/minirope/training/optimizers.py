"""`--optim_hidden muon`: Muon for the decoder's hidden matrices, AdamW for the rest, as one optimizer.

Muon (K. Jordan et al., 2024, "Muon: An optimizer for hidden layers in neural networks"; `torch.optim.Muon`)
replaces each hidden matrix's momentum by its nearest semi-orthogonal matrix (five Newton-Schulz steps), so
every direction of the update moves by about the same amount. It is meant for the 2-D weights inside the
network: the embeddings, the LM head and the norm weights keep AdamW (Jordan et al.; J. Liu et al., 2025,
"Muon is Scalable for LLM Training", which also gives the `match_rms_adamw` scaling used here, so that one
`--learning_rate` and one `--weight_decay` serve both optimizers and the schedule scales both).

The Trainer steps, schedules and checkpoints `MuonWithAdamW` as it does any `torch.optim.Optimizer`.
"""

from collections import ChainMap

import torch
from torch import nn

MUON_MOMENTUM = 0.95  # torch.optim.Muon's default, and Jordan et al.'s


class Muon(torch.optim.Muon):
    """`torch.optim.Muon` with the Newton-Schulz iteration in float32.

    torch 2.13 runs it in bfloat16 (`torch.optim._muon._zeropower_via_newtonschulz`), which CPUs without
    AVX-512 BF16 emulate about 150x slower than float32: on a 2-core AVX2 CPU it cost more than the
    training step of the default model. Everything else is torch's: the arguments, their checks and defaults,
    Nesterov momentum, decoupled weight decay and the learning-rate adjustment (`adjust_lr_fn`).
    """

    @torch.no_grad()
    def step(self, closure=None):
        """One update of every parameter with a gradient; returns `closure()`'s loss, if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            grads = [p.grad for p in params]
            buffers = [self.state[p].setdefault("momentum_buffer", torch.zeros_like(p.grad)) for p in params]
            torch._foreach_lerp_(buffers, grads, 1 - group["momentum"])
            updates = torch._foreach_lerp(grads, buffers, group["momentum"]) if group["nesterov"] else buffers
            torch._foreach_mul_(params, 1 - group["lr"] * group["weight_decay"])
            by_shape: dict[torch.Size, list[int]] = {}
            for i, p in enumerate(params):  # matrices of one shape are orthogonalised in one batch
                by_shape.setdefault(p.shape, []).append(i)
            for shape, indices in by_shape.items():
                stacked = torch.stack([updates[i] for i in indices])
                orthogonal = orthogonalize(stacked, group["ns_coefficients"], group["ns_steps"], group["eps"])
                step_size = -group["lr"] * lr_ratio(group["adjust_lr_fn"], shape)
                for i, update in zip(indices, orthogonal.unbind(), strict=True):
                    params[i].add_(update.to(params[i].dtype), alpha=step_size)
        return loss


def orthogonalize(
    matrix: torch.Tensor, coefficients: tuple[float, float, float], steps: int, eps: float
) -> torch.Tensor:
    """Approximately the nearest semi-orthogonal matrix to `matrix` (`U V^T` of its SVD), in float32.

    The quintic Newton-Schulz iteration X <- aX + (bA + cA^2)X, A = XX^T, from X = G / ||G||_F, with torch's
    coefficients (3.4445, -4.7750, 2.0315): singular values land in about [0.7, 1.2], not exactly 1, which
    Jordan et al. found does not hurt. The steps of `torch.optim._muon._zeropower_via_newtonschulz`, batched.

    Args:
        matrix: `(..., rows, columns)`, any float dtype; each `(rows, columns)` matrix is orthogonalised alone.
    Returns:
        `(..., rows, columns)` float32.
    """
    a, b, c = coefficients
    x = matrix.float()
    wide = x.size(-2) <= x.size(-1)  # iterate on the smaller Gram matrix
    x = x if wide else x.mT
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x if wide else x.mT


def lr_ratio(adjust_lr_fn: str | None, shape: torch.Size) -> float:
    """torch.optim.Muon's learning-rate adjustment for a `(rows, columns)` matrix.

    "original" (Jordan et al.): sqrt(max(1, rows / columns)); "match_rms_adamw" (Liu et al., eq. 4):
    0.2 sqrt(max(rows, columns)), which gives the update the RMS of a typical AdamW update.
    """
    rows, columns = shape[:2]
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * max(rows, columns) ** 0.5
    return max(1.0, rows / columns) ** 0.5


def hidden_matrices(model: nn.Module) -> set[str]:
    """Names of the parameters Muon trains: every 2-D weight but the input embeddings and the LM head."""
    outer = {id(model.get_input_embeddings().weight), id(model.get_output_embeddings().weight)}
    return {name for name, p in model.named_parameters() if p.ndim == 2 and id(p) not in outer and p.requires_grad}


class MuonWithAdamW(torch.optim.Optimizer):
    """Two optimizers stepped, scheduled and saved as one: `Muon` for the hidden matrices, `torch.optim.AdamW`
    for the other parameters.

    `param_groups` are the two optimizers' own group dicts (Muon's first), so a learning-rate scheduler that sets
    `group["lr"]` sets it for both; `state_dict()` holds both optimizers' states.

    Args:
        model: the model; `hidden_matrices(model)` go to Muon.
        lr, weight_decay: for both (Muon with `adjust_lr_fn="match_rms_adamw"`).
        no_decay: names of parameters trained without weight decay (norm weights, biases).
        momentum: Muon's (Nesterov) momentum, in [0, 1).
        adamw_kwargs: `betas`, `eps`, ... for AdamW.
    Raises:
        ValueError: the model has no hidden matrix.
    """

    def __init__(
        self,
        model: nn.Module,
        lr: float,
        weight_decay: float,
        no_decay: set[str],
        momentum: float = MUON_MOMENTUM,
        **adamw_kwargs,
    ):
        hidden = hidden_matrices(model)
        if not hidden:
            raise ValueError("--optim_hidden muon: the model has no hidden matrix for Muon to train.")
        params = {name: p for name, p in model.named_parameters() if p.requires_grad}
        muon = Muon(
            [params[name] for name in sorted(hidden)],
            lr=lr,
            weight_decay=weight_decay,
            momentum=momentum,
            adjust_lr_fn="match_rms_adamw",
        )
        rest = [name for name in params if name not in hidden]
        groups = [
            {"params": [params[n] for n in rest if n not in no_decay], "weight_decay": weight_decay},
            {"params": [params[n] for n in rest if n in no_decay], "weight_decay": 0.0},
        ]
        adamw = torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, **adamw_kwargs)
        self.optimizers = (muon, adamw)
        super().__init__(self._groups(), {})
        self.state = ChainMap(muon.state, adamw.state)

    def _groups(self) -> list[dict]:
        return [group for optimizer in self.optimizers for group in optimizer.param_groups]

    def step(self, closure=None):
        """One step of both optimizers (`closure`, if given, is evaluated once, by Muon); returns its loss."""
        loss = self.optimizers[0].step(closure)
        self.optimizers[1].step()
        return loss

    def state_dict(self) -> dict:
        return {"muon": self.optimizers[0].state_dict(), "adamw": self.optimizers[1].state_dict()}

    def load_state_dict(self, state_dict: dict) -> None:
        """Load both optimizers' states; `param_groups` then hold their new group dicts."""
        self.optimizers[0].load_state_dict(state_dict["muon"])
        self.optimizers[1].load_state_dict(state_dict["adamw"])
        self.param_groups[:] = self._groups()
        self.state = ChainMap(self.optimizers[0].state, self.optimizers[1].state)
