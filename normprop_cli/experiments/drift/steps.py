"""Probes inside the first epoch(s) (`experiment.probe_every_steps`): where the spread ratio's jump of
epoch 1 happens. `StepProbe(probe, every)` wraps an epoch probe (SpreadProbe, PopulationProbe) and runs
it every `every` SGD steps of the first `epochs` epochs, on the same evaluation images, from a forward
pre-hook on the model that counts its training-mode forwards (the SGD steps): the trainer's observers
are called only between epochs. A probe runs in evaluation mode and restores training mode, uses no
global random numbers and changes no weight, so the run trains exactly as without it.

The wrapped probe observes at epoch 0 too (a population probe's drift is from there), its rows kept as
step 0. Rows: the probe's, with `epoch` the fraction of epochs trained (steps / steps per epoch) and
`step`; returned at the end of epoch `epochs`, as runs/<run>/<probe>_steps.csv. A run resumed from an
epoch's checkpoint past those epochs needs none of them; one interrupted inside them restarts from
epoch 0 (no checkpoint before the first epoch ends), so nothing is kept across a resume. Data
normalisation must not depend on training mode (global or zca): a probe leaves it in evaluation mode."""

from __future__ import annotations

from torch import nn


class StepProbe:
    """Observer: `probe` every `every` SGD steps of the first `epochs` epochs (module docstring)."""

    def __init__(self, probe, every: int, epochs: int = 1):
        self.probe, self.every, self.epochs = probe, int(every), int(epochs)
        self.name = f"{probe.name}_steps"
        self.steps, self.done, self.rows, self.batches, self.handle = 0, 0, [], None, None

    def observe(self, model: nn.Module, batches, epoch: int) -> list[dict]:
        if epoch == 0:
            self.steps, self.done, self.batches = 0, 0, batches
            self.rows = [r | {"step": 0} for r in self.probe.observe(model, batches, 0)]
            if self.handle is None:
                self.handle = model.register_forward_pre_hook(self._before_step)
            return []
        self.done = epoch
        if epoch < self.epochs or self.handle is None:
            return []
        self.handle.remove()
        self.handle = None
        per_epoch = self.steps / epoch
        rows = [r | {"epoch": r["step"] / per_epoch} for r in self.rows]
        self.rows = []
        return rows

    def _before_step(self, model: nn.Module, args) -> None:
        if not model.training or self.done >= self.epochs:
            return
        if self.steps and self.steps % self.every == 0:
            # a step count as the probe's epoch: never 0 (epoch 0's batch-statistics context) and due every epoch
            rows = self.probe.observe(model, self.batches, self.steps)
            self.rows += [r | {"step": self.steps} for r in rows]
            model.train()
        self.steps += 1
