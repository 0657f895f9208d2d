"""The back-propagation baseline (zo/backprop.py): its backward pass is the gradient of its forward
(finite differences, float64), its forward is the int8 graph's up to quantization error, and its
training lowers the loss and carries over to the int8 model with fixed scales.

A generated model exercises every op the float suffix implements (strides, dilation, SAME/VALID,
depth multiplier, PAD, MAX/AVERAGE_POOL_2D with partial windows, ADD, CONCATENATION, MEAN, RESHAPE);
the real ResNet-8 and MobileNetV2 of /work/shared check the same on real data.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from npusim import load_model
from npusim.graph import Graph, Op, Quantization, Tensor
from zo.backprop import FloatSuffix, backprop_baseline
from zo.data import load_dataset
from zo.errors import ZoError
from zo.inputs import prepare_inputs
from zo.loss import cross_entropy
from zo.model import TrainableModel

from shared_paths import MOBILENET, SHARED

RESNET8 = SHARED / "models" / "resnet8_cifar10_int8.tflite"
EUROSAT32 = SHARED / "data" / "eurosat32_subset.npz"
EUROSAT64 = SHARED / "data" / "eurosat64_subset.npz"


def need(*paths: Path):
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        pytest.skip(
            f"SHARED DATA MISSING: {', '.join(missing)} (set "
            "NPU_SHARED to the folder holding models/ and data/)"
        )


@pytest.fixture(autouse=True, scope="module")
def one_blas_thread():
    """As backprop_baseline does: small GEMMs on shared cores run faster on one BLAS thread."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        yield
        return
    with threadpool_limits(1, user_api="blas"):
        yield


@pytest.fixture(scope="module")
def eurosat32():
    need(RESNET8, EUROSAT32)
    return load_dataset(EUROSAT32)


# ----------------------------------------------------------------------------------------------
# A generated model with every supported op

ACT_SCALE = 0.05  # one activation quantization everywhere: pools, PAD and CONCATENATION need shared ones


class GraphBuilder:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.tensors: list[Tensor] = []
        self.ops: list[Op] = []

    def tensor(self, shape, dtype=np.int8, scale=ACT_SCALE, zero_point=0, data=None, axis=0):
        scale = np.atleast_1d(np.asarray(scale, dtype=np.float32))
        quant = (
            Quantization(scale, np.full(scale.size, zero_point, dtype=np.int64), axis) if scale.size else None
        )
        self.tensors.append(Tensor(f"t{len(self.tensors)}", tuple(shape), np.dtype(dtype), quant, data))
        return len(self.tensors) - 1

    def const(self, values, dtype=np.int32):
        return self.tensor(np.shape(values), dtype, scale=[], data=np.asarray(values, dtype=dtype))

    def op(self, kind, inputs, out_shape, zero_point=0, **options):
        out = self.tensor(out_shape, zero_point=zero_point)
        self.ops.append(Op(kind, list(inputs), [out], options, len(self.ops)))
        return out

    def weights(self, shape, taps, per_channel_axis=None):
        """Random int8 weights whose real scale keeps the output about as large as the input."""
        channels = shape[per_channel_axis] if per_channel_axis is not None else 1
        scale = (1.0 / (np.sqrt(taps) * 60.0)) * self.rng.uniform(0.7, 1.3, channels)
        data = self.rng.integers(-127, 128, shape).astype(np.int8)
        return self.tensor(shape, scale=scale, data=data, axis=per_channel_axis or 0), scale

    def bias(self, in_scale, w_scale, channels):
        scale = in_scale * np.broadcast_to(w_scale, (channels,))
        data = self.rng.integers(-3000, 3000, channels).astype(np.int32)
        return self.tensor((channels,), np.int32, scale=scale, data=data)

    def conv(
        self, x, cout, k, stride=1, dilation=1, padding="SAME", act="NONE", per_channel=True, zero_point=0
    ):
        _, h, w, cin = self.tensors[x].shape
        wt, ws = self.weights((cout, k[0], k[1], cin), k[0] * k[1] * cin, 0 if per_channel else None)
        b = self.bias(ACT_SCALE, ws, cout)
        oh, ow = [_out(n, kk, stride, dilation, padding) for n, kk in zip((h, w), k)]
        return self.op(
            "CONV_2D",
            [x, wt, b],
            (1, oh, ow, cout),
            zero_point,
            padding=padding,
            stride_h=stride,
            stride_w=stride,
            dilation_h_factor=dilation,
            dilation_w_factor=dilation,
            fused_activation_function=act,
        )

    def depthwise(self, x, mult, k, stride=1, dilation=1, padding="SAME", act="NONE"):
        _, h, w, cin = self.tensors[x].shape
        wt, ws = self.weights((1, k[0], k[1], cin * mult), k[0] * k[1], 3)
        b = self.bias(ACT_SCALE, ws, cin * mult)
        oh, ow = [_out(n, kk, stride, dilation, padding) for n, kk in zip((h, w), k)]
        return self.op(
            "DEPTHWISE_CONV_2D",
            [x, wt, b],
            (1, oh, ow, cin * mult),
            padding=padding,
            stride_h=stride,
            stride_w=stride,
            dilation_h_factor=dilation,
            dilation_w_factor=dilation,
            depth_multiplier=mult,
            fused_activation_function=act,
        )

    def pool(self, kind, x, k, stride, padding):
        _, h, w, c = self.tensors[x].shape
        oh, ow = [_out(n, k, stride, 1, padding) for n in (h, w)]
        return self.op(
            kind,
            [x],
            (1, oh, ow, c),
            filter_height=k,
            filter_width=k,
            stride_h=stride,
            stride_w=stride,
            padding=padding,
            fused_activation_function="NONE",
        )

    def fc(self, x, out):
        depth = int(np.prod(self.tensors[x].shape[1:]))
        wt, ws = self.weights((out, depth), depth)
        b = self.bias(ACT_SCALE, ws, out)
        return self.op(
            "FULLY_CONNECTED",
            [x, wt, b],
            (1, out),
            fused_activation_function="NONE",
            weights_format=0,
            keep_num_dims=False,
        )


def _out(n, k, stride, dilation, padding):
    extent = (k - 1) * dilation + 1
    return (n + stride - 1) // stride if padding == "SAME" else (n - extent) // stride + 1


def generated_model(seed: int = 0) -> Graph:
    g = GraphBuilder(seed)
    x = g.tensor((1, 9, 9, 3), zero_point=-3)
    t1 = g.conv(x, 4, (3, 3), stride=2, act="RELU", zero_point=-128)  # [5, 5, 4]
    t2 = g.depthwise(t1, 2, (3, 3), dilation=2, act="RELU6")  # [5, 5, 8], multiplier 2
    t3 = g.op("PAD", [t2, g.const([[0, 0], [1, 0], [0, 1], [0, 0]])], (1, 6, 6, 8))
    t4 = g.pool("MAX_POOL_2D", t3, 3, 2, "SAME")  # [3, 3, 8]
    t5 = g.conv(t2, 8, (1, 1), stride=2, padding="VALID", per_channel=False)  # [3, 3, 8]
    t6 = g.op("ADD", [t4, t5], (1, 3, 3, 8), fused_activation_function="RELU")
    t7 = g.conv(t6, 6, (2, 2), padding="VALID", act="RELU6")  # [2, 2, 6]
    t8 = g.pool("AVERAGE_POOL_2D", t6, 2, 2, "SAME")  # [2, 2, 8], partial windows
    t9 = g.op("CONCATENATION", [t7, t8], (1, 2, 2, 14), axis=3, fused_activation_function="NONE")
    t10 = g.op("MEAN", [t9, g.const([1])], (1, 1, 2, 14), keep_dims=True)
    t11 = g.op("RESHAPE", [t10, g.const([1, 28])], (1, 28))
    logits = g.fc(t11, 5)
    return Graph(g.tensors, g.ops, [x], [logits])


def generated_trainable(seed: int = 0) -> TrainableModel:
    return TrainableModel(generated_model(seed), "last:5")


def random_boundary(model: TrainableModel, n: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {
        t: rng.integers(-128, 128, (n,) + model.graph.tensors[t].shape[1:]).astype(np.int8)
        for t in model.boundary
    }


# ----------------------------------------------------------------------------------------------
# Gradients


def check_gradient(
    net: FloatSuffix, inputs: dict, labels: np.ndarray, per_tensor: int, seed: int, h: float = 1e-6
):
    """Central differences on a few random entries of each trainable tensor against backward."""
    rng = np.random.default_rng(seed)
    _, grads = net.loss_and_gradient(inputs, labels)

    def loss():
        return float(cross_entropy(net.forward(inputs), labels).mean())

    for t, value in net.params.items():
        scale = np.max(np.abs(grads[t])) + 1e-12
        for flat in rng.choice(value.size, size=min(per_tensor, value.size), replace=False):
            i = np.unravel_index(flat, value.shape)
            saved = value[i]
            value[i] = saved + h
            up = loss()
            value[i] = saved - h
            down = loss()
            value[i] = saved
            numeric = (up - down) / (2 * h)
            assert abs(numeric - grads[t][i]) <= 1e-5 * scale + 1e-6 * abs(numeric), (
                f"tensor {t} entry {i}: backward {grads[t][i]:.8g}, finite difference {numeric:.8g}"
            )
        assert np.any(grads[t] != 0), f"tensor {t}: gradient is identically zero"


def test_gradient_matches_finite_differences_on_generated_model():
    model = generated_trainable()
    net = FloatSuffix(model, np.float64)
    assert {f.op.kind for f in net.ops} == {
        "CONV_2D",
        "DEPTHWISE_CONV_2D",
        "PAD",
        "MAX_POOL_2D",
        "ADD",
        "AVERAGE_POOL_2D",
        "CONCATENATION",
        "MEAN",
        "RESHAPE",
        "FULLY_CONNECTED",
    }
    boundary = random_boundary(model, 6, seed=1)
    labels = np.random.default_rng(2).integers(0, 5, 6)
    check_gradient(net, net.dequantize(boundary), labels, per_tensor=12, seed=3)


def test_gradient_matches_finite_differences_on_resnet8_last_block(eurosat32):
    ds = eurosat32
    model = TrainableModel(load_model(str(RESNET8)), "last:4", num_classes=ds.num_classes)
    cache = model.boundary_activations(prepare_inputs(ds.x_train[:4], model.graph))
    net = FloatSuffix(model, np.float64)
    check_gradient(net, net.dequantize(cache), ds.y_train[:4], per_tensor=6, seed=0)


# ----------------------------------------------------------------------------------------------
# Forward against the int8 graph


def assert_close_to_int8(model: TrainableModel, cache: dict, max_mean_lsb: float):
    int8 = model.logits(cache)
    net = FloatSuffix(model, np.float64)
    real = net.forward(net.dequantize(cache))
    assert real.shape == int8.shape
    corr = np.corrcoef(int8.ravel(), real.ravel())[0, 1]
    mean_lsb = np.abs(int8 - real).mean() / model.logits_scale
    assert corr > 0.99 and mean_lsb < max_mean_lsb, (
        f"correlation {corr:.5f}, mean |diff| {mean_lsb:.2f} output LSB"
    )


def test_forward_matches_int8_on_generated_model():
    model = generated_trainable()
    assert_close_to_int8(model, random_boundary(model, 64, seed=5), max_mean_lsb=1.0)


def test_forward_matches_int8_on_resnet8_last_blocks(eurosat32):
    ds = eurosat32
    model = TrainableModel(
        load_model(str(RESNET8)), "last:7", num_classes=ds.num_classes
    )  # two residual blocks
    assert_close_to_int8(
        model, model.boundary_activations(prepare_inputs(ds.x_test[:128], model.graph)), max_mean_lsb=3.0
    )


def test_forward_matches_int8_on_mobilenet_v2_last_blocks():
    need(MOBILENET, EUROSAT64)
    ds = load_dataset(EUROSAT64)
    # Original 5-class head (a replaced head starts at zero and would make the comparison trivial);
    # last:6 reaches back across a residual ADD and a depthwise conv, from two boundary tensors.
    model = TrainableModel(load_model(str(MOBILENET)), "last:6")
    assert len(model.boundary) == 2
    assert_close_to_int8(
        model, model.boundary_activations(prepare_inputs(ds.x_test[:32], model.graph)), max_mean_lsb=1.0
    )


# ----------------------------------------------------------------------------------------------
# Write-back and training


def test_int_values_round_trip_the_deployed_values():
    model = generated_trainable()
    net = FloatSuffix(model, np.float32)
    for mine, deployed in zip(net.int_values(), model.values()):
        assert mine.dtype == deployed.dtype and np.array_equal(mine, deployed)


def teacher_labels(model: TrainableModel, boundaries: list[dict], seed: int) -> list[np.ndarray]:
    """Labels from a teacher: the same suffix with its trainable tensors moved by ~30 steps, logits
    centred per class (so that every class occurs). The student can learn them exactly."""
    teacher = FloatSuffix(model, np.float64)
    rng = np.random.default_rng(seed)
    for p in model.params:
        v = teacher.params[p.tensor]
        v += rng.normal(0, 30, v.shape) * p.unit * np.broadcast_to(teacher.steps[p.tensor], v.shape)
    logits = [teacher.forward(teacher.dequantize(b)) for b in boundaries]
    center = np.median(logits[0], axis=0)
    return [(z - center).argmax(axis=1) for z in logits]


def test_training_lowers_the_loss_and_leaves_the_model_unchanged():
    model = generated_trainable()
    train, test = random_boundary(model, 512, seed=11), random_boundary(model, 256, seed=12)
    y_train, y_test = teacher_labels(model, [train, test], seed=13)
    assert np.bincount(y_train, minlength=5).min() > 30
    before = [v.copy() for v in model.values()]
    r = backprop_baseline(model, train, y_train, test, y_test, epochs=5)
    losses = [row["train_loss"] for row in r["history"]]
    assert losses[-1] < 0.7 * losses[0], losses
    assert r["float_test_accuracy"] > r["float_test_accuracy_initial"] + 0.3, r
    # Written back with the scales fixed, the trained values keep (almost) all of the float gain.
    assert abs(r["int8_test_accuracy"] - r["float_test_accuracy"]) < 0.05, r
    assert all(np.array_equal(a, b) for a, b in zip(before, model.values())), (
        "backprop_baseline changed the model"
    )


def test_takes_model_caches_and_labels_from_a_trainer():
    """The experiments pass a Trainer: its model, train_cache, test_cache and data labels are the
    defaults. (A stand-in with the Trainer's attributes: a real Trainer would run the int8 prefix
    on its data set first, which costs more than this whole file.)"""
    model = generated_trainable()
    train, test = random_boundary(model, 96, seed=21), random_boundary(model, 48, seed=22)
    y_train, y_test = teacher_labels(model, [train, test], seed=23)
    trainer = SimpleNamespace(
        model=model, train_cache=train, test_cache=test, data=SimpleNamespace(y_train=y_train, y_test=y_test)
    )
    direct = backprop_baseline(model, train, y_train, test, y_test, epochs=2)
    via_trainer = backprop_baseline(trainer, epochs=2)
    for key in (
        "float_test_accuracy",
        "int8_test_accuracy",
        "int8_test_accuracy_initial",
        "train_loss",
        "parameters",
    ):
        assert via_trainer[key] == direct[key], key
    assert via_trainer["int8_test_accuracy_initial"] == float(np.mean(model.predict(test) == y_test))
    with pytest.raises(ZoError, match="required"):
        backprop_baseline(model, train, y_train)


def zo_blocks_below_head(model: TrainableModel) -> list:
    """The trainer's partition (Trainer.partition): every trainable tensor but the last layer's, a
    weight perturbed along its output channels' scalings."""
    from zo.blocks import Block

    head_op = max(p.op_index for p in model.params)
    blocks, i = [], 0
    for p, v in zip(model.params, model.values()):
        if p.op_index != head_op:
            t = model.graph.tensors[p.tensor]
            block = Block(p.name, i, i + v.size)
            block.shape = tuple(t.shape)
            if not p.is_bias:
                block.channel_axis = t.quant.axis if t.quant.scale.size > 1 else 0
            blocks.append(block)
        i += v.size
    return blocks


def test_block_projection_is_the_transpose_of_its_lift():
    model = generated_trainable()
    rng = np.random.default_rng(5)
    for block, values in zip(zo_blocks_below_head(model), model.values()):
        values = values.ravel().astype(np.float64)
        a, b = rng.normal(size=block.dims), rng.normal(size=block.size)
        assert np.dot(block.lift(a, values), b) == pytest.approx(np.dot(a, block.project(b, values)))


def test_restricted_bounds_move_the_layers_below_only_as_asked():
    """below="frozen" leaves every block as it was; "subspace" moves a weight block only by
    per-channel scalings (each channel stays proportional to where it started, up to rounding);
    "full" moves it freely; the head trains in every case."""
    model = generated_trainable()
    train, test = random_boundary(model, 512, seed=11), random_boundary(model, 256, seed=12)
    y_train, y_test = teacher_labels(model, [train, test], seed=13)
    blocks = zo_blocks_below_head(model)
    start = model.values()
    # project=False: no clamp inside training, so a channel's values stay in proportion even where
    # a scaling takes its largest past the int8 bound (the write-back clamps those: left out below)
    runs = {
        below: backprop_baseline(
            model, train, y_train, test, y_test, epochs=3, blocks=blocks, below=below, project=False
        )
        for below in ("full", "subspace", "frozen")
    }
    head = len(start) - 1  # the last layer's bias; its weight is before it
    for below, r in runs.items():
        assert not np.array_equal(r["values"][head], start[head]), f"{below}: the head did not train"
    weights = [k for k, b in enumerate(blocks) if b.channel_axis is not None]
    assert weights
    for k in range(len(blocks)):
        assert np.array_equal(runs["frozen"]["values"][k], start[k]), f"frozen: block {k} moved"

    def off_the_scalings(k, values):
        """The largest distance, in codes, of a block's values from the nearest per-channel scaling
        of its start (values clamped at the int8 bound aside)."""
        axis = blocks[k].channel_axis
        w0 = np.moveaxis(start[k].astype(np.float64), axis, 0).reshape(start[k].shape[axis], -1)
        w = np.moveaxis(values.astype(np.float64), axis, 0).reshape(w0.shape)
        inside = np.abs(w) < 127
        s = np.sum(w * w0 * inside, axis=1) / np.maximum(np.sum(w0 * w0 * inside, axis=1), 1e-12)
        return float(np.max(np.abs(w - s[:, None] * w0) * inside))

    moved = [k for k in weights if not np.array_equal(runs["subspace"]["values"][k], start[k])]
    assert moved, "subspace: no weight block moved"
    for k in moved:
        assert off_the_scalings(k, runs["subspace"]["values"][k]) <= 1.0, k
    assert max(off_the_scalings(k, runs["full"]["values"][k]) for k in weights) > 2.0
    with pytest.raises(ZoError, match="below"):
        backprop_baseline(model, train, y_train, test, y_test, epochs=1, below="half")
