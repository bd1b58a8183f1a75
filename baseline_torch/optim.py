"""Muon + Adam exactly as the baseline (docs/model.md), groups and schedules shared
with the JAX side.

Groups (`frontier_jax.policies.groups.param_label`, the same rule as the JAX optimizer's labels): Muon for
every 2-D matrix inside the blocks except control tensors; Adam (torch.optim.Adam, betas (beta1,
beta2), eps adam_eps, no weight decay) for the tied embedding at embed_lr and for vectors/scalars/
control tensors (+ skip_weights) at scalar_lr. The learning-rate multiplier and Muon's momentum come
from `frontier_jax.policies.schedules.lr_scale` / `muon_momentum` (the driver passes them to `step`), so both
implementations schedule identically.

On the XLA device (`xla=True`, baseline_torch.xla) the step must trace the same graph every time:
PyTorch/XLA bakes a Python scalar that is 0 or 1 into the graph as a constant and passes other values
as inputs, so a learning rate, momentum or Adam bias correction that moves onto or off such a value
would recompile the step. There the learning rates and Muon's momentum are 0-dim device tensors
(graph inputs, set each step), Adam keeps its step count and bias corrections on the device
(`capturable=True`), and every optimizer state tensor is created up front, so the first step is the
same graph as the others. Eager devices keep Python numbers and the baseline's expressions.
"""

from __future__ import annotations

import dataclasses

import torch

from frontier_jax.config import OptimConfig
from frontier_jax.policies.dtypes import AUTO
from frontier_jax.policies.groups import param_label

NS_COEFFS = (3.4445, -4.7750, 2.0315)
NS_EPS = 1e-7
_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def zeropower_via_newtonschulz5(G: torch.Tensor, steps: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """The baseline's quintic Newton-Schulz orthogonalisation ([out, in] orientation), in `dtype`."""
    a, b, c = NS_COEFFS
    X = G.to(dtype)
    X = X / (X.norm() + NS_EPS)
    transposed = G.size(0) > G.size(1)
    if transposed:
        X = X.T
    for _ in range(steps):
        A = X @ X.T
        B = b * A + c * A @ A
        X = a * X + B @ X
    return X.T if transposed else X


def _is_number(x) -> bool:
    return isinstance(x, (int, float))


class Muon(torch.optim.Optimizer):
    """Nesterov momentum, Newton-Schulz, update scaled by sqrt(max(1, rows/cols)) and rounded to the
    NS dtype (the baseline's flat bf16 update buffer), then p -= lr * update. Single process.

    `lr` and `momentum` are Python numbers (the baseline's `add(..., alpha=)`) or 0-dim tensors on the
    parameters' device (the XLA path: `alpha=` takes numbers only, so the product is formed there)."""

    def __init__(self, params, lr: float, momentum: float, backend_steps: int, ns_dtype: str = "bfloat16",
                 nesterov: bool = True):
        super().__init__(params, dict(lr=lr, momentum=momentum, backend_steps=backend_steps, nesterov=nesterov,
                                      ns_dtype=_DTYPES[ns_dtype]))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            lr, momentum = group["lr"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(g)
                buf = state["momentum_buffer"]
                buf.mul_(momentum).add_(g)
                if group["nesterov"]:
                    g = g.add(buf, alpha=momentum) if _is_number(momentum) else g + buf * momentum
                u = zeropower_via_newtonschulz5(g, group["backend_steps"], group["ns_dtype"])
                u = u * max(1, u.size(0) / u.size(1)) ** 0.5
                u = u.to(group["ns_dtype"])  # the update buffer's dtype
                u = u.to(p.dtype)
                if _is_number(lr):
                    p.add_(u, alpha=-lr)
                else:
                    p.sub_(u * lr)


def split_params(model) -> dict[str, list[torch.nn.Parameter]]:
    """{"muon": [...], "embed": [...], "scalar": [...]} as the baseline's groups."""
    muon, scalar = [], []
    for name, p in model.blocks.named_parameters():
        (muon if param_label(["blocks", *name.split(".")], p.ndim) == "muon" else scalar).append(p)
    if model.skip_weights.numel() > 0:
        scalar.append(model.skip_weights)
    return {"muon": muon, "embed": [model.tok_emb.weight], "scalar": scalar}


class Optimizers:
    """The three optimizers, stepped together with the schedule's lr multiplier and Muon momentum."""

    def __init__(self, model, cfg: OptimConfig, ns_dtype: str | None = None, xla: bool = False):
        """ns_dtype: Newton-Schulz's dtype as the run resolved it (frontier_jax.policies.dtypes.resolve, as the
        JAX side); None: cfg.muon_ns_dtype, which must then name a dtype. xla: the parameters live on the XLA
        device (module docstring: one graph per step)."""
        ns_dtype = ns_dtype or cfg.muon_ns_dtype
        if ns_dtype == AUTO:
            raise ValueError('optim.muon_ns_dtype="auto" depends on the platform: pass the run\'s resolved dtype')
        cfg = dataclasses.replace(cfg, muon_ns_dtype=ns_dtype)
        groups = split_params(model)
        self.cfg, self.xla = cfg, xla
        self.device = model.tok_emb.weight.device
        adam_opts = {"capturable": True, "foreach": False} if xla else {}
        adam = lambda ps, lr: torch.optim.Adam([{"params": ps, "lr": self._hparam(lr), "base_lr": lr}],
                                               betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps, weight_decay=0.0,
                                               **adam_opts)
        self.embed = adam(groups["embed"], cfg.embed_lr)
        self.scalar = adam(groups["scalar"], cfg.scalar_lr)
        self.muon = Muon(groups["muon"], lr=self._hparam(cfg.matrix_lr), momentum=self._hparam(cfg.muon_momentum),
                         backend_steps=cfg.muon_ns_steps, ns_dtype=cfg.muon_ns_dtype)
        for group in self.muon.param_groups:
            group["base_lr"] = cfg.matrix_lr
        self.all = (self.embed, self.muon, self.scalar)
        if xla:
            self._create_state()

    def _hparam(self, value: float):
        """A hyper-parameter as the optimizers take it: a Python float, or on XLA a 0-dim float32 device
        tensor that is a graph input, so a new value is a transfer, never a new graph. It is sent as one
        element and reshaped on the device: PyTorch/XLA turns a 0-dim tensor sent as such into a graph
        constant when it is 0 or 1, as it does a Python scalar."""
        if not self.xla:
            return float(value)
        return torch.tensor([float(value)], dtype=torch.float32, device=self.device).reshape(())

    def _create_state(self) -> None:
        """Every state tensor now, as the optimizers would create it at their first step (torch.optim.Adam
        with capturable=True: a 0-dim step count on the device and zero moments; Muon: zero momentum), so
        the first step traces the same graph as every later one."""
        for opt in (self.embed, self.scalar):
            for group in opt.param_groups:
                for p in group["params"]:
                    opt.state[p] = {"step": torch.zeros((), dtype=torch.float32, device=p.device),
                                    "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                                    "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
        for group in self.muon.param_groups:
            for p in group["params"]:
                self.muon.state[p]["momentum_buffer"] = torch.zeros_like(p)

    def step(self, lr_scale: float, momentum: float) -> None:
        for group in self.muon.param_groups:
            group["momentum"] = self._hparam(momentum)
        for opt in self.all:
            for group in opt.param_groups:
                group["lr"] = self._hparam(group["base_lr"] * lr_scale)
            opt.step()

    def zero_grad(self) -> None:
        for opt in self.all:
            opt.zero_grad(set_to_none=True)

    def state_dict(self) -> list[dict]:
        return [opt.state_dict() for opt in self.all]

    def load_state_dict(self, states: list[dict]) -> None:
        for opt, s in zip(self.all, states):
            opt.load_state_dict(s)
