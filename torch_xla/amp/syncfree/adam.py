"""Syncfree Adam (L2 weight decay, AMSGrad, maximize) as torch.optim.Adam."""
from __future__ import annotations

import torch

from ._base import assign, check_positive, keep_mask, run_closure


class Adam(torch.optim.Optimizer):
    _decoupled = False  # AdamW: decoupled weight decay

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0,
                 amsgrad: bool = False, *, maximize: bool = False):
        check_positive("learning rate", lr)
        check_positive("epsilon value", eps)
        check_positive("weight_decay value", weight_decay)
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"Invalid beta parameters: {betas!r}")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                        maximize=maximize)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None, found_inf: torch.Tensor = None):
        loss = run_closure(closure)
        keep = keep_mask(found_inf)
        for group in self.param_groups:
            lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
            wd, amsgrad, maximize = group["weight_decay"], group["amsgrad"], group["maximize"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError(f"syncfree.{type(self).__name__} does not support sparse gradients")
                grad = -p.grad if maximize else p.grad
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                    if amsgrad:
                        state["max_exp_avg_sq"] = torch.zeros_like(p)
                param = p
                if wd != 0:
                    if self._decoupled:
                        param = p * (1 - lr * wd)
                    else:
                        grad = grad + wd * p
                step = state["step"] + 1
                exp_avg = state["exp_avg"] * beta1 + (1 - beta1) * grad
                exp_avg_sq = state["exp_avg_sq"] * beta2 + (1 - beta2) * grad * grad
                bias_correction1 = 1 - torch.pow(beta1, step)
                bias_correction2_sqrt = torch.sqrt(1 - torch.pow(beta2, step))
                if amsgrad:
                    max_sq = torch.maximum(state["max_exp_avg_sq"], exp_avg_sq)
                    denom = torch.sqrt(max_sq) / bias_correction2_sqrt + eps
                    assign(state["max_exp_avg_sq"], max_sq, keep)
                else:
                    denom = torch.sqrt(exp_avg_sq) / bias_correction2_sqrt + eps
                new_p = param - (lr / bias_correction1).to(p.dtype) * exp_avg / denom
                assign(state["exp_avg"], exp_avg, keep)
                assign(state["exp_avg_sq"], exp_avg_sq, keep)
                assign(state["step"], step, keep)
                assign(p, new_p, keep)
        return loss
