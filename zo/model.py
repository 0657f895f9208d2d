"""The deployed int8 model as the trainer sees it: a frozen prefix, a trainable suffix, the logits.

Only weight and bias values of the trainable layers ever change; every scale, zero point and
multiplier of the deployed graph stays as compiled (the NPU program has them baked in).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from npusim import Interpreter, NpusimError, write_model
from npusim.app import interrupt
from npusim.graph import Graph
from npusim.ops import MAC_OPS

from .config import CALIBRATION_IMAGES
from .errors import ZoError
from .head import feature_tensor, find_head, fresh_head, no_head_error
from .inputs import ImageInput, InputMapping, choose_mapping, model_inputs, parse_channels

if TYPE_CHECKING:  # annotations only
    from .config import TrainConfig
    from .data import Dataset

WEIGHT_BOUND = 127  # int8 weights are symmetric: [-127, 127]
BIAS_BOUND = 2**31 - 1
FOUR_BIT_BOUND = 7  # int4 and uint4 (zero point 8) weights: codes in [-7, 7] fit both
# A bias LSB is in_scale * w_scale: one weight LSB times one input LSB. Perturbing a bias by one LSB
# moves the accumulator by 1 where a weight step moves it by |x - zp| ~ 10^2 per tap, so biases are
# perturbed and updated in units of BIAS_UNIT LSB (one weight step on a half-range input).
BIAS_UNIT = 128


@dataclass
class Parameter:
    """One trainable tensor: its int values live in the graph, its master copy in the trainer."""

    name: str
    tensor: int  # tensor index in the graph
    op_index: int
    unit: int  # integer step of one perturbation unit (1 for weights, BIAS_UNIT for biases)
    bound: int

    @property
    def is_bias(self) -> bool:
        return self.unit != 1


class TrainableModel:
    """A prepared model split at its first trainable layer, with the logits as the training output."""

    def __init__(
        self,
        graph: Graph,
        trainable: str = "last:1",
        profile: str = "tflm",
        num_classes: int | None = None,
        new_head: bool = False,
        calibration: np.ndarray | None = None,
    ):
        """num_classes different from the model's, or new_head, gives a fresh zero head (zo/head.py),
        quantized from the frozen features of calibration (model-input values of a batch); the
        trainer may then initialize it (zo/head_init.py, requantize_head)."""
        if num_classes is not None and num_classes < 2:
            raise ZoError(f"{num_classes} class(es): a classifier needs at least 2 classes")
        try:
            out_classes = graph.output().shape[-1]
            fresh = check_head(graph, num_classes, new_head)
            self.interp = Interpreter(graph, profile=profile)
            if fresh:
                calibration = calibration() if callable(calibration) else calibration
                features = self.features(calibration, feature_tensor(graph))
                self.interp = Interpreter(
                    fresh_head(graph, num_classes or out_classes, features), profile=profile
                )
        except NpusimError as e:
            raise ZoError(str(e)) from None
        self.trainable = trainable
        # The fresh head's FULLY_CONNECTED (None for the model's own head): what zo/head_init.py fills.
        self.head_op = find_head(self.interp.graph) if fresh else None
        self._split()
        self.check_writable()

    def check_writable(self):
        """Write the model once before any training (an ONNX graph may hold what cannot go back into
        its file): a refusal after the whole budget would throw the run away."""
        check_writable(self.graph)

    def requantize_head(self, w_scale: np.ndarray):
        """New per-class weight scales for the fresh head (and bias scales in_scale * w_scale), before
        training: the interpreter is prepared again, as the compiler would compile the new head."""
        tensors = self.graph.tensors
        head = self.head_op
        tensors[head.inputs[1]].quant.scale = w_scale.astype(np.float32)
        if len(head.inputs) > 2 and head.inputs[2] >= 0:
            in_scale = np.float64(tensors[head.inputs[0]].scale)
            tensors[head.inputs[2]].quant.scale = (in_scale * w_scale.astype(np.float64)).astype(np.float32)
        self.interp = Interpreter(self.graph, profile=self.interp.profile)
        self._split()

    def _split(self):
        """The trainable parameters, and the prefix / suffix / tail split at them."""
        self.graph = self.interp.graph
        self.num_classes = self.graph.output().shape[-1]
        self.params = self._select(self.trainable)
        kernels = self.interp.kernels
        trainable_ops = {p.op_index for p in self.params}
        start = min(i for i, k in enumerate(kernels) if k.op.index in trainable_ops)
        self.logits_tensor, end = self._logits(kernels)
        if end < start:
            raise ZoError("the trainable layers lie after the logits; nothing to train")
        self.prefix = kernels[:start]
        self.suffix = kernels[start : end + 1]  # up to the op that produces the logits
        self.tail = kernels[end + 1 :]  # SOFTMAX/DEQUANTIZE: only for int8 predictions
        produced = {t for k in self.suffix for t in k.op.outputs}
        self.boundary = sorted(
            {
                t
                for k in self.suffix
                for t in k.op.inputs
                if t >= 0 and t not in produced and not self.graph.tensors[t].is_constant
            }
        )
        logits = self.graph.tensors[self.logits_tensor]
        self.logits_scale = np.float64(logits.scale)
        self.logits_zero_point = logits.zero_point

    def features(self, x: np.ndarray | None, tensor: int, chunk: int = 32) -> np.ndarray:
        """Real values [N, K] of an int8 tensor for the model inputs x; without x, unit features
        (a placeholder for what needs no calibration, such as a cost estimate)."""
        t = self.interp.graph.tensors[tensor]
        if x is None:
            return np.ones((1, int(np.prod(t.shape[1:]))))
        producer = {o: i for i, k in enumerate(self.interp.kernels) for o in k.op.outputs}
        plan = self.interp.kernels[: producer[tensor] + 1] if tensor in producer else []
        parts = []
        for i in range(0, len(x), chunk):
            interrupt.check()  # a safe point in the setup (npusim/app/interrupt.py)
            values = {self.interp.graph.inputs[0]: self.interp.check_input(x[i : i + chunk])}
            self.interp.evaluate(values, plan)
            parts.append(values[tensor].reshape(len(values[tensor]), -1))
        return t.scale * (np.concatenate(parts).astype(np.float64) - t.zero_point)

    def head_features(self, boundary: dict, chunk: int = 256) -> np.ndarray:
        """Real values [N, D] of the fresh head's input for cached boundary activations: the frozen
        prefix (cached) and the suffix's ops before the head, as deployed."""
        x = self.head_op.inputs[0]
        t = self.graph.tensors[x]
        head = self.head_op.outputs[0]
        before = self.suffix[: next(i for i, k in enumerate(self.suffix) if head in k.op.outputs)]
        n = len(next(iter(boundary.values())))
        parts = []
        for i in range(0, n, chunk):
            interrupt.check()  # a safe point in the setup (npusim/app/interrupt.py)
            values = {b: v[i : i + chunk] for b, v in boundary.items()}
            self.interp.evaluate(values, before)
            parts.append(values[x].reshape(len(values[x]), -1))
        return t.scale * (np.concatenate(parts).astype(np.float64) - t.zero_point)

    # -- the trainable set -------------------------------------------------------------------
    def _select(self, spec: str) -> list[Parameter]:
        mac = [k.op for k in self.interp.kernels if k.op.kind in MAC_OPS]
        tensors = self.graph.tensors
        if spec == TAIL:
            chosen, with_weights = head_and_tail(self.interp.kernels), True
        else:
            chosen, with_weights = chosen_layers(spec, mac, tensors)
        params = []
        stored = self.graph.source.weights
        for op in chosen:
            if with_weights:
                # a weight an ONNX file stores in 4 bits trains within them, so that it can be written back
                four_bit = stored.get(op.inputs[1], {}).get("storage") in ("int4", "uint4")
                bound = FOUR_BIT_BOUND if four_bit else WEIGHT_BOUND
                params.append(Parameter(tensors[op.inputs[1]].name, op.inputs[1], op.index, 1, bound))
            if len(op.inputs) > 2 and op.inputs[2] >= 0:
                params.append(
                    Parameter(tensors[op.inputs[2]].name, op.inputs[2], op.index, BIAS_UNIT, BIAS_BOUND)
                )
        if not params:
            raise ZoError(f"--trainable {spec!r}: the chosen layers have no bias to train")
        return params

    def _logits(self, kernels) -> tuple[int, int]:
        """The logits tensor (the input of the final SOFTMAX, else the int8 output) and its producer."""
        producer = {t: i for i, k in enumerate(kernels) for t in k.op.outputs}
        t = self.graph.outputs[0]
        while producer.get(t) is not None and (
            kernels[producer[t]].kind in ("DEQUANTIZE", "SOFTMAX", "RESHAPE")
            or kernels[producer[t]].kind == "QUANTIZE"
            and self.graph.tensors[kernels[producer[t]].op.inputs[0]].dtype == np.int8
        ):  # a QUANTIZE int8 -> int8: an ONNX Softmax's QuantizeLinear (its requantization from 1/256)
            k = kernels[producer[t]]
            t = k.op.inputs[0]
            if k.kind == "SOFTMAX":
                break
        if self.graph.tensors[t].dtype != np.int8 or t not in producer:
            raise ZoError(
                "cannot find int8 logits (expected the model to end in SOFTMAX, or in an int8 output)"
            )
        return t, producer[t]

    @property
    def size(self) -> int:
        return sum(self.graph.tensors[p.tensor].data.size for p in self.params)

    def values(self) -> list[np.ndarray]:
        return [self.graph.tensors[p.tensor].data for p in self.params]

    def set_values(self, values: list[np.ndarray]):
        for p, v in zip(self.params, values):
            t = self.graph.tensors[p.tensor]
            t.data = np.clip(v, -p.bound, p.bound).astype(t.dtype).reshape(t.shape)

    # -- forward passes ------------------------------------------------------------------------
    def boundary_activations(self, x: np.ndarray, chunk: int = 256) -> dict:
        """The frozen prefix's outputs that the suffix reads, for a whole set of inputs (computed once).
        Chunks of 256 images: 64 took 2.2 to 2.9 times as long on MobileNetV2-0.35."""
        parts = []
        for i in range(0, len(x), chunk):
            interrupt.check()  # a safe point in the setup (npusim/app/interrupt.py)
            values = {self.graph.inputs[0]: self.interp.check_input(x[i : i + chunk])}
            self.interp.evaluate(values, self.prefix)
            parts.append({t: values[t] for t in self.boundary})
        return {t: np.concatenate([p[t] for p in parts]) for t in self.boundary}

    def logits(self, boundary: dict, grouped: dict | None = None) -> np.ndarray:
        """Dequantized logits [N, C] from boundary activations of a batch B. With grouped trainable
        tensors ({tensor index: [G, ...]}: G versions), the result is [G*B, C], group-major; the
        frozen part of the suffix runs once on B (Interpreter.run_grouped)."""
        values = dict(boundary)
        if grouped:
            self.interp.run_grouped(values, self.suffix, grouped, len(next(iter(boundary.values()))))
        else:
            self.interp.evaluate(values, self.suffix)
        q = values[self.logits_tensor].reshape(-1, self.num_classes)
        return self.logits_scale * (q.astype(np.float64) - self.logits_zero_point)

    def predict(self, boundary: dict, chunk: int = 512) -> np.ndarray:
        """Predicted classes from the int8 (or dequantized) model output, as the device reports them."""
        preds = []
        n = len(next(iter(boundary.values())))
        for i in range(0, n, chunk):
            interrupt.check()  # a safe point in the setup (npusim/app/interrupt.py)
            values = {t: v[i : i + chunk] for t, v in boundary.items()}
            self.interp.evaluate(values, self.suffix + self.tail)
            out = values[self.graph.outputs[0]]  # [N, ...]: a boundary tensor's axis 0 may hold rows
            preds.append(np.argmax(out.reshape(len(out), -1), axis=1))
        return np.concatenate(preds)


def check_head(graph: Graph, num_classes: int | None, new_head: bool) -> bool:
    """Whether the model gets a fresh head, checked on the graph alone, before the interpreter is
    prepared or a calibration image is read: a new class count needs a head to replace (or
    --new-head), and in an ONNX graph the fresh head must be writable into the file (its place and
    shape decide that, not its values: a placeholder head is written once)."""
    out_classes = graph.output().shape[-1]
    other = num_classes is not None and num_classes != out_classes
    if find_head(graph) is None and not new_head and other:
        # --new-head would append one: say so only where the appended head could be written
        raise no_head_error(graph, num_classes, _unwritable(_placeholder_head(graph, num_classes)))
    fresh = new_head or other
    if fresh:
        check_writable(_placeholder_head(graph, num_classes or out_classes))
    return fresh


def _placeholder_head(graph: Graph, num_classes: int) -> Graph:
    try:
        depth = int(np.prod(graph.tensors[feature_tensor(graph)].shape[1:]))
        return fresh_head(graph, num_classes, np.ones((1, depth)))
    except NpusimError as e:
        raise ZoError(str(e)) from None


def _unwritable(graph: Graph) -> str | None:
    """Why the ONNX graph cannot be written back into its file; None when it can (or is no ONNX)."""
    if graph.source.format != "onnx":
        return None
    try:
        write_model(graph)
    except NpusimError as e:
        return str(e)
    return None


def check_writable(graph: Graph):
    """An ONNX graph written once (TrainableModel.check_writable): what cannot go back into its file
    is a one-line error before any training."""
    reason = _unwritable(graph)
    if reason is not None:
        raise ZoError(f"the trained model could not be written back to ONNX, so nothing is trained: {reason}")


# -- a run's model, from its options (zo/config.py) ------------------------------------------
def input_mapping(config: TrainConfig, graph) -> tuple[ImageInput, InputMapping]:
    image = ImageInput.of(graph)
    return image, choose_mapping(
        image, config.input_range, parse_channels("--mean", config.mean), parse_channels("--std", config.std)
    )


# --trainable's default: the head and its exact tail (zo/tail.py).
TAIL = "tail"


def head_and_tail(kernels) -> list:
    """The MAC ops of `--trainable tail`, in execution order: the last one (the head) and, when it is a
    FULLY_CONNECTED classifier, every MAC op whose output reaches it through parameter-free ops only
    (zo/tail.py's walk with every layer trainable): the layers whose gradient is exact from the
    head's forward pass."""
    from .tail import find_tail_ops

    mac = [k.op for k in kernels if k.op.kind in MAC_OPS]
    if not mac:
        raise ZoError("the model has no CONV_2D, DEPTHWISE_CONV_2D or FULLY_CONNECTED layer to train")
    head = mac[-1]
    if head.kind != "FULLY_CONNECTED":
        return [head]
    upto = kernels[: next(i for i, k in enumerate(kernels) if k.op is head) + 1]
    return find_tail_ops(upto, head, lambda op: True)[1] + [head]


def chosen_layers(spec: str, mac: list, tensors, appended_head: bool = False) -> tuple[list, bool]:
    """(the MAC ops --trainable `spec` names, among `mac` in execution order; whether their weights
    train). appended_head: a fresh head will be appended, so last:K may count one layer more (the
    check before the model is prepared, which knows the graph's layers but not yet the head's)."""
    if not mac:
        raise ZoError("the model has no CONV_2D, DEPTHWISE_CONV_2D or FULLY_CONNECTED layer to train")
    if spec == "biases":
        return mac, False
    if spec.startswith("last:"):
        try:
            k = int(spec[5:])
        except ValueError:
            raise ZoError(f"--trainable {spec!r}: expected last:K with an integer K") from None
        if not 1 <= k <= len(mac) + appended_head:
            raise ZoError(
                f"--trainable {spec!r}: K must be between 1 and {len(mac) + appended_head} (the model's "
                "trainable layers)"
            )
        return mac[-k:], True
    names = [n.strip() for n in spec.split(",") if n.strip()]
    by_name = {}
    for op in mac:
        by_name[tensors[op.inputs[1]].name] = op
        by_name[tensors[op.outputs[0]].name] = op
    missing = [n for n in names if n not in by_name]
    if missing or not names:
        sample = ", ".join(tensors[op.inputs[1]].name for op in mac[-3:])
        raise ZoError(
            f"--trainable: no trainable layer named {missing[0] if missing else spec!r} "
            f"(expected last:K, biases, or weight/output tensor names such as {sample})"
        )
    return sorted({id(by_name[n]): by_name[n] for n in names}.values(), key=lambda o: o.index), True


def check_trainable(spec: str, graph) -> None:
    """--trainable against the graph's layers, before the data set is read and the model prepared."""
    mac = [op for op in graph.ops if op.kind in MAC_OPS]
    if spec == TAIL:  # resolved on the prepared model (its head may be appended)
        if not mac:
            raise ZoError("the model has no CONV_2D, DEPTHWISE_CONV_2D or FULLY_CONNECTED layer to train")
        return
    chosen_layers(spec, mac, graph.tensors, appended_head=find_head(graph) is None)


def calibration_indices(n: int) -> np.ndarray:
    return np.unique(np.linspace(0, n - 1, min(n, CALIBRATION_IMAGES)).astype(np.int64))


def build_model(config: TrainConfig, graph, data: Dataset) -> tuple[TrainableModel, ImageInput, InputMapping]:
    """The trainable model of a run, with its input mapping and, where asked for, a calibrated fresh head."""
    image, mapping = input_mapping(config, graph)

    def calibration():  # read only once the head's checks have passed (TrainableModel)
        return model_inputs(data.x_train[calibration_indices(len(data.y_train))], image, mapping)[0]

    model = TrainableModel(
        graph,
        config.trainable,
        config.profile,
        num_classes=data.num_classes,
        new_head=fresh_head_wanted(config, graph),
        calibration=calibration,
    )
    return model, image, mapping


def fresh_head_wanted(config: TrainConfig, graph) -> bool:
    """A fresh head unless --keep-head: a head trained for other data, even with as many classes,
    is a worse start than one fitted to this data (a CIFAR head on EuroSAT: 13%, docs/zo.md). A
    model without a classifier gets one appended only with --new-head."""
    return config.new_head or (not config.keep_head and find_head(graph) is not None)
