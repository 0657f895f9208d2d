"""The local-loss part of a hybrid step (`--estimator local|guided`, zo/local.py), and what it costs
on the device under --budget-ms. A part of Trainer.

Cost of a step (zo/cost.step_parts' parts, recomposed): the head's pass of the trainable suffix; on
the M55 the weight gradients of the exact tail and of every local layer (as many multiply-adds as
their forward passes, fp32), the auxiliary heads' logits, input gradients and outer products
(3 x classes x channels each per image), the head's outer product, the write-back of every updated
value and the loss; `guided` adds the step's layer's 2 suffix passes (NPU) and their losses."""

from __future__ import annotations

import functools

import numpy as np

from npusim.app import interrupt

from .activity import ActivityEstimator
from .cost import CYCLES_PER_UPDATED_PARAMETER, CostModel, m55_mac_seconds, step_parts
from .local import ESTIMATORS, LocalEstimator


class LocalStep:
    def make_local(self, below: list, offsets: dict):
        """The local-loss estimator of the layers below the tail (None unless --estimator local or
        guided), its auxiliary heads ridge-fitted on the training images' pooled features."""
        if not below or self.config.estimator not in ESTIMATORS:
            return None
        every = self.config.local_layers == "all"
        local = LocalEstimator(
            self.model, below, offsets, self.model.num_classes, self.config.estimator, every
        )
        local.examples, local.seed = self.config.local_examples, self.config.seed
        self.report("fitting the local losses' auxiliary heads on the training images' pooled features")
        interrupt.check()
        rows = self.train_rows
        local.fit({t: v[rows] for t, v in self.train_cache.items()}, self.data.y_train[rows])
        return local

    def local_description(self) -> list:
        if self.local is None:
            return []
        names = ", ".join(layer.name for layer in self.local.layers)
        if self.local.kind == "local":
            return [
                f"{names}: exact gradient of a local loss (an auxiliary head on each block's pooled output)"
            ]
        return [f"{names}: the local loss's direction, sized by 2 suffix passes (one layer a step)"]

    def calibrate_local(self) -> int:
        """`guided`: each layer's eps (its probe's RMS, LSB) measured as activity perturbation's is."""
        if self.local.kind != "guided":
            return 0
        if self.config.eps is not None:
            for layer in self.local.layers:
                layer.eps = self.config.eps
            return 0
        act = ActivityEstimator(self.model, [layer.f for layer in self.local.layers], self.flat_offsets(), 0)
        self.activity = act
        try:
            passes = self.calibrate_activity_eps()
        finally:
            self.activity = None
        for layer, a in zip(self.local.layers, act.layers):
            layer.eps = a.eps
        return passes

    def local_gradient(self, values: dict, labels: np.ndarray, estimate) -> np.ndarray:
        """The local layers' gradient of this step (zo/local.py); counts its passes and M55 work."""
        g, passes = self.local.gradient(values, labels, self.step)
        self.forward_passes += passes
        estimate.suffix_passes += passes
        b = min(len(labels), self.local.examples or len(labels))
        if self.local.every:
            estimate.local_macs += b * sum(layer.macs_per_image for layer in self.local.layers)
        else:
            estimate.local_macs += b * self.local.layers[self.step % len(self.local.layers)].macs_per_image
        estimate.local_macs += len(labels) * self.local.aux_macs_per_image()
        if passes:
            self.zero_differences = float(np.mean(self.local.last_differences == 0))
        return g

    def local_passes(self) -> int:
        return 2 if self.local is not None and self.local.kind == "guided" else 0

    @functools.cached_property
    def local_parts(self) -> dict:
        """Per layer of the round robin (its op's id; None for `local`, every layer each step): the
        device seconds of a step."""
        interp, batch, local = self.model.interp, self.config.batch, self.local
        tensors = [p.tensor for p in self.model.params]
        position = {id(k.op): pos for pos, k in enumerate(interp.kernels)}
        cost = CostModel()
        base = step_parts(interp, tensors, 1, batch)
        f = base["fixed"]
        values = {p.tensor: int(np.prod(v.shape)) for p, v in zip(self.model.params, self.model.values())}
        local_values = {t for layer in local.layers for t in layer.op.inputs[1:3] if t in values}
        exact_values = sum(n for t, n in values.items() if t not in local_values)
        aux = m55_mac_seconds(batch * local.aux_macs_per_image(), "fp32", cost)

        examples = min(batch, local.examples or batch)  # the local weight gradients' examples

        def seconds(layers, probes):
            macs = base["exact_tail_macs"] + examples * sum(layer.macs_per_image for layer in layers)
            updated = exact_values + sum(
                values[t] for layer in layers for t in layer.op.inputs[1:3] if t in values
            )
            return (
                f["head_pass"] + m55_mac_seconds(macs, "fp32", cost) + f["head_outer"] + aux + f["loss"]
                + updated * CYCLES_PER_UPDATED_PARAMETER / cost.m55_clock_hz + probes
            )  # fmt: skip

        if local.every:
            return {None: seconds(local.layers, 0.0)}
        out = {}
        for layer in local.layers:
            probe = 0.0
            if local.kind == "guided":
                probe = step_parts(interp, tensors, 1, batch, layer=position[id(layer.op)])["per_direction_s"]
            out[id(layer.op)] = seconds([layer], probe)
        return out

    def local_overhead(self) -> float:
        """Device seconds of this step beyond its forward passes at a whole pass's time."""
        local = self.local
        key = None if local.every else id(local.layers[self.step % len(local.layers)].op)
        return self.local_parts[key] - (1 + self.local_passes()) * self.device_seconds_per_pass
