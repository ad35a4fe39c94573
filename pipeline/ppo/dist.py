"""Collectives over the PPO processes (accelerate), each a no-op with one process.

    torchrun --nproc_per_node 2 -m rlhf.cli.app ppo ...   # gloo on CPUs
"""

from __future__ import annotations

import torch


class Dist:
    def __init__(self, accelerator):
        self.acc = accelerator
        self.rank, self.world = accelerator.process_index, accelerator.num_processes

    def gather(self, t: torch.Tensor) -> torch.Tensor:
        return self.acc.gather(t.contiguous()) if self.world > 1 else t

    def gather_objects(self, obj) -> list:
        """[obj of rank 0, obj of rank 1, ...] (rank order: the same every run)."""
        if self.world == 1:
            return [obj]
        from accelerate.utils import gather_object

        return gather_object([obj])

    def global_mean(self, values: torch.Tensor, mask: torch.Tensor) -> float:
        pair = torch.stack([(values * mask).sum(), mask.sum().to(values.dtype)])
        if self.world > 1:
            pair = self.acc.reduce(pair, "sum")
        return float(pair[0] / pair[1].clamp_min(1.0))

    def all_finite(self, loss: torch.Tensor) -> bool:
        ok = torch.isfinite(loss.detach()).float().view(1)
        if self.world > 1:  # every rank must take the same branch, or DDP would hang
            ok = self.acc.reduce(ok, "sum") / self.world
        return bool(ok.item() == 1.0)
