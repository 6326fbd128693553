"""Syncfree SGD (momentum, dampening, Nesterov, weight decay, maximize) as torch.optim.SGD."""
from __future__ import annotations

import torch

from ._base import assign, check_positive, keep_mask, run_closure


class SGD(torch.optim.Optimizer):
    def __init__(self, params, lr: float = 1e-3, momentum: float = 0, dampening: float = 0,
                 weight_decay: float = 0, nesterov: bool = False, *, maximize: bool = False):
        check_positive("learning rate", lr)
        check_positive("momentum value", momentum)
        check_positive("weight_decay value", weight_decay)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                        nesterov=nesterov, maximize=maximize)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None, found_inf: torch.Tensor = None):
        loss = run_closure(closure)
        keep = keep_mask(found_inf)
        for group in self.param_groups:
            lr, momentum, dampening = group["lr"], group["momentum"], group["dampening"]
            wd, nesterov, maximize = group["weight_decay"], group["nesterov"], group["maximize"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("syncfree.SGD does not support sparse gradients")
                d_p = -p.grad if maximize else p.grad
                if wd != 0:
                    d_p = d_p + wd * p
                if momentum != 0:
                    state = self.state[p]
                    if "momentum_buffer" not in state:
                        state["momentum_buffer"] = torch.zeros_like(p)
                        state["initialized"] = torch.zeros((), dtype=torch.bool, device=p.device)
                    buf, init = state["momentum_buffer"], state["initialized"]
                    new_buf = torch.where(init, buf * momentum + (1 - dampening) * d_p, d_p)
                    d_p = d_p + momentum * new_buf if nesterov else new_buf
                    assign(buf, new_buf, keep)
                    assign(init, torch.ones_like(init), keep)
                assign(p, p - lr * d_p, keep)
        return loss
