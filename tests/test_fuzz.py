"""Robustness fuzzing: hostile .tflite files never crash, hang or mislead the simulator.

Every case ends in npusim.NpusimError with a one-line message, or in a correct run: a result of
the declared type and shape in which no image depends on the others in its batch. Never another
exception, a native crash, a case slower than a few seconds, or an allocation beyond the limit.

A case is a seed model plus a short list of mutations. Structured mutations edit the file's object
tree (ai_edge_litert's ModelT: shapes, buffer and tensor indices, opcodes, options, quantization,
graph edges, cycles) and pack it again; byte mutations then damage the packed flatbuffer (bit
flips, truncation, forged offsets and lengths, swapped words, inserted or deleted bytes). Each
mutation is a pure function of (kind, seed), so hypothesis shrinks a failing case to a short plan
and the failing file is written out for replay.

Campaigns: generated one-op and multi-op models and the real models (in-process, hypothesis), and
`npusim run` in subprocesses (exit code 0 or 2, one stderr line). `--fuzz-examples N` sets the
total (default 3000 in CI; `make fuzz` runs 20000); each campaign prints its case count and
outcome counts. In-process cases run with the allocation limit lowered to FUZZ_LIMIT and an
address-space cap, and every CHECK_MEMORY_EVERY-th case under tracemalloc.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import math
import re
import resource
import signal
import subprocess
import sys
import time
import tracemalloc
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import flatbuffers
import numpy as np
import pytest
from ai_edge_litert import schema_py_generated as schema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npusim import Interpreter, NpusimError, load_model, write_model
from npusim.formats import limits
from npusim.npu import report as npu_report
from npusim.testing import oracle as O

from shared_paths import SHARED
from zo_fixtures import tiny_classifier

INT32_MAX = 2**31 - 1
# In-process campaigns lower npusim's allocation limit (limits.MAX_TENSOR_BYTES) to this, so the
# refusal paths run on small absurd shapes too; a case's traced peak must stay within a few times it.
FUZZ_LIMIT = 16 << 20
CHECK_MEMORY_EVERY = 8
CASE_DEADLINE = timedelta(seconds=5)  # hypothesis: a case slower than this fails
CASE_HARD_TIMEOUT = 30  # seconds: SIGALRM interrupts a case that hangs


class CaseFailure(AssertionError):
    """The simulator broke its contract on a case: anything but NpusimError or a correct run."""


# ----------------------------------------------------------------------------------------------
# Seeds
# ----------------------------------------------------------------------------------------------


def _conv_opts(stride=1, padding="SAME"):
    return dict(stride=(stride, stride), padding=padding)


def chain_model() -> bytes:
    """One input, many ops: QUANTIZE(float) -> CONV_2D -> DEPTHWISE -> PAD -> MAX_POOL -> ADD(const)
    -> CONCATENATION(const) -> TRANSPOSE -> AVERAGE_POOL -> MEAN -> RESHAPE -> FULLY_CONNECTED
    -> SOFTMAX -> DEQUANTIZE. Cross-op mutations (swapped edges, cycles) need a graph like this."""
    rng = np.random.default_rng(7)
    b = O.ModelBuilder("fuzz chain")
    s, z = 0.05, -3
    x = b.add_tensor((1, 6, 6, 3), np.float32, name="input")
    q = b.add_tensor((1, 6, 6, 3), np.int8, s, z, name="quant")
    b.add_op("QUANTIZE", [x], [q], schema.QuantizeOptionsT())
    ws = np.full(4, 0.01, np.float32)
    w = b.add_const(
        rng.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8),
        scale=ws,
        zero_point=np.zeros(4, np.int64),
        name="conv/w",
    )
    bias = b.add_const(
        rng.integers(-500, 500, 4).astype(np.int32),
        scale=O.bias_scale(s, ws),
        zero_point=np.zeros(4, np.int64),
        name="conv/b",
    )
    c = b.add_tensor((1, 6, 6, 4), np.int8, 0.1, 2, name="conv")
    opt = schema.Conv2DOptionsT()
    opt.padding, opt.strideH, opt.strideW, opt.dilationHFactor, opt.dilationWFactor = (
        schema.Padding.SAME,
        1,
        1,
        1,
        1,
    )
    opt.fusedActivationFunction = schema.ActivationFunctionType.RELU6
    b.add_op("CONV_2D", [q, w, bias], [c], opt)
    dws = np.full(8, 0.02, np.float32)
    dw = b.add_const(
        rng.integers(-127, 128, (1, 3, 3, 8)).astype(np.int8),
        scale=dws,
        zero_point=np.zeros(8, np.int64),
        axis=3,
        name="dw/w",
    )
    dwb = b.add_const(
        rng.integers(-500, 500, 8).astype(np.int32),
        scale=O.bias_scale(0.1, dws),
        zero_point=np.zeros(8, np.int64),
        name="dw/b",
    )
    d = b.add_tensor((1, 3, 3, 8), np.int8, 0.1, 0, name="dw")
    dopt = schema.DepthwiseConv2DOptionsT()
    dopt.padding, dopt.strideH, dopt.strideW, dopt.depthMultiplier = schema.Padding.SAME, 2, 2, 2
    dopt.dilationHFactor = dopt.dilationWFactor = 1
    b.add_op("DEPTHWISE_CONV_2D", [c, dw, dwb], [d], dopt)
    pads = b.add_const(np.array([[0, 0], [1, 0], [0, 1], [0, 0]], np.int32), name="pads")
    p = b.add_tensor((1, 4, 4, 8), np.int8, 0.1, 0, name="pad")
    b.add_op("PAD", [d, pads], [p], schema.PadOptionsT())
    mp = b.add_tensor((1, 2, 2, 8), np.int8, 0.1, 0, name="maxpool")
    popt = schema.Pool2DOptionsT()
    popt.padding, popt.strideH, popt.strideW, popt.filterHeight, popt.filterWidth = (
        schema.Padding.VALID,
        2,
        2,
        2,
        2,
    )
    b.add_op("MAX_POOL_2D", [p], [mp], popt)
    k = b.add_tensor(
        (1, 1, 1, 8),
        np.int8,
        0.05,
        1,
        data=rng.integers(-128, 128, (1, 1, 1, 8)).astype(np.int8),
        name="addconst",
    )
    a = b.add_tensor((1, 2, 2, 8), np.int8, 0.15, -1, name="add")
    b.add_op("ADD", [mp, k], [a], schema.AddOptionsT())
    cc = b.add_tensor(
        (1, 2, 2, 2),
        np.int8,
        0.15,
        -1,
        data=rng.integers(-128, 128, (1, 2, 2, 2)).astype(np.int8),
        name="catconst",
    )
    cat = b.add_tensor((1, 2, 2, 10), np.int8, 0.15, -1, name="concat")
    copt = schema.ConcatenationOptionsT()
    copt.axis = 3
    b.add_op("CONCATENATION", [a, cc], [cat], copt)
    perm = b.add_const(np.array([0, 2, 1, 3], np.int32), name="perm")
    tr = b.add_tensor((1, 2, 2, 10), np.int8, 0.15, -1, name="transpose")
    b.add_op("TRANSPOSE", [cat, perm], [tr], schema.TransposeOptionsT())
    ap = b.add_tensor((1, 1, 1, 10), np.int8, 0.15, -1, name="avgpool")
    aopt = schema.Pool2DOptionsT()
    aopt.padding, aopt.strideH, aopt.strideW, aopt.filterHeight, aopt.filterWidth = (
        schema.Padding.VALID,
        1,
        1,
        2,
        2,
    )
    b.add_op("AVERAGE_POOL_2D", [tr], [ap], aopt)
    axes = b.add_const(np.array([1, 2], np.int32), name="axes")
    mean = b.add_tensor((1, 10), np.int8, 0.1, 0, name="mean")
    mopt = schema.ReducerOptionsT()
    mopt.keepDims = False
    b.add_op("MEAN", [ap, axes], [mean], mopt)
    shape = b.add_const(np.array([1, 10], np.int32), name="shape")
    flat = b.add_tensor((1, 10), np.int8, 0.1, 0, name="reshape")
    ropt = schema.ReshapeOptionsT()
    ropt.newShape = [1, 10]
    b.add_op("RESHAPE", [mean, shape], [flat], ropt)
    fws = np.float32(0.01)
    fw = b.add_const(rng.integers(-127, 128, (5, 10)).astype(np.int8), scale=fws, zero_point=0, name="fc/w")
    fb = b.add_const(
        rng.integers(-100, 100, 5).astype(np.int32), scale=O.bias_scale(0.1, [fws]), zero_point=0, name="fc/b"
    )
    logits = b.add_tensor((1, 5), np.int8, 0.1, 0, name="logits")
    b.add_op("FULLY_CONNECTED", [flat, fw, fb], [logits], schema.FullyConnectedOptionsT())
    probs = b.add_tensor((1, 5), np.int8, 1 / 256, -128, name="probs")
    sopt = schema.SoftmaxOptionsT()
    sopt.beta = 1.0
    b.add_op("SOFTMAX", [logits], [probs], sopt)
    out = b.add_tensor((1, 5), np.float32, name="output")
    b.add_op("DEQUANTIZE", [probs], [out], schema.DequantizeOptionsT())
    return b.build([x], [out])


def generated_seeds() -> dict[str, bytes]:
    """Small valid models covering every supported op (each runs in milliseconds)."""
    rng = np.random.default_rng(0)
    w = rng.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8)
    seeds = {
        "chain": chain_model(),
        "tiny_classifier": tiny_classifier(),
        "conv2d": O.conv2d_model(
            (1, 5, 5, 3), w, rng.integers(-99, 99, 4), 0.05, -2, np.full(4, 0.01), 0.1, 3, stride=(2, 1)
        ),
        "conv2d_1x1": O.conv2d_model(
            (1, 4, 4, 3), w[:, :1, :1], None, 0.05, 0, 0.01, 0.1, 0, padding="VALID"
        ),
        "depthwise": O.depthwise_model(
            (1, 5, 5, 2),
            rng.integers(-127, 128, (1, 3, 3, 4)),
            rng.integers(-99, 99, 4),
            0.05,
            1,
            np.full(4, 0.02),
            0.1,
            0,
            depth_multiplier=2,
        ),
        "fully_connected": O.fully_connected_model(
            (1, 2, 8),
            rng.integers(-127, 128, (3, 8)),
            rng.integers(-99, 99, 3),
            0.05,
            0,
            0.01,
            0.1,
            0,
            keep_num_dims=True,
        ),
        "add_broadcast": O.add_model((1, 3, 3, 4), (1, 1, 1, 4), 0.05, 1, 0.07, -2, 0.1, 0),
        "add_const_vector": O.add_model(
            (1, 3, 4), (4,), 0.05, 1, 0.07, -2, 0.1, 0, const2=rng.integers(-128, 128, 4)
        ),
        "avg_pool": O.avg_pool_model((1, 5, 5, 2), 0.05, 0, (2, 2), (2, 2), "SAME"),
        "max_pool": O.max_pool_model((1, 4, 4, 3), 0.05, 0, (3, 3), (1, 1), "VALID", "RELU"),
        "mean": O.mean_model((1, 3, 4, 5), 0.05, 1, 0.04, -1, axes=(1, 2), keep_dims=True),
        "softmax": O.softmax_model((1, 3, 7), 0.1, 0),
        "reshape": O.reshape_model((1, 2, 3, 4), (1, 6, -1), 0.05, 0),
        "pad": O.pad_model((1, 3, 3, 2), [(0, 0), (1, 2), (0, 1), (0, 0)], 0.05, 3),
        "padv2": O.pad_model((1, 3, 2), [(0, 0), (1, 1), (2, 0)], 0.05, 3, v2=True),
        "transpose": O.transpose_model((1, 2, 3, 4), (0, 3, 1, 2), 0.05, 0),
        "concat": O.concat_model(
            [(1, 2, 3), (1, 2, 2)], 2, 0.05, 0, consts=[None, rng.integers(-128, 128, (1, 2, 2))]
        ),
        "concat_two_inputs": O.concat_model([(1, 2, 3), (1, 1, 3)], 1, 0.05, 0),
        "quantize_float": O.quantize_model((1, 4, 3), np.float32, 0.05, 1),
        "quantize_uint8": O.quantize_model((1, 4, 3), np.uint8, 0.05, 1, 0.05, 129),
        "dequantize": O.dequantize_model((1, 2, 5), 0.05, 3),
        "quantize_int8": O.quantize_model((1, 4, 3), np.int8, 0.05, 1, 0.07, -3),
        "logistic": O.logistic_model((1, 3, 5), 0.05, 2),
        "mul_broadcast": O.binary_model("MUL", (1, 3, 3, 4), (1, 1, 1, 4), 0.05, 1, 0.07, -2, 0.01, 0),
        "sub_const": O.binary_model(
            "SUB", (1, 3, 4), (4,), 0.05, 1, 0.07, -2, 0.1, 0, const2=rng.integers(-128, 128, 4)
        ),
        "strided_slice": O.strided_slice_model(
            (1, 5, 6, 3), [0, 4, 1, 0], [1, 0, 6, 3], [1, -2, 2, 1], 0.05, 1, end_mask=8, shrink_axis_mask=8
        ),
        "split": O.split_model((1, 2, 6), 2, 3, 0.05, 0),
        "split_v": O.split_v_model((1, 7, 2), [2, -1, 1], 1, 0.05, 0),
        "pack": O.pack_model((1, 2, 3), 3, -1, 0.05, 0),
        "resize_nearest": O.resize_nearest_model((1, 3, 4, 2), (6, 7), 0.05, 0, half_pixel_centers=True),
        "transpose_conv": O.transpose_conv_model(
            (1, 3, 3, 2),
            (6, 6),
            rng.integers(-127, 128, (3, 2, 2, 2)),
            rng.integers(-99, 99, 3),
            0.05,
            1,
            np.full(3, 0.02),
            0.1,
            0,
        ),
        "tanh": O.unary_model("TANH", (1, 3, 5), 0.05, 2, 1.0 / 128, 0),
        "hard_swish": O.unary_model("HARD_SWISH", (1, 3, 5), 0.05, 2, 0.03, -20),
        "leaky_relu": O.leaky_relu_model((1, 3, 5), 0.05, 2, 0.04, -3, 0.2),
        "maximum": O.plain_binary_model("MAXIMUM", (1, 3, 4), (1, 1, 4), (0.05, 1), (0.05, 1), (0.05, 1)),
        "minimum_const": O.plain_binary_model(
            "MINIMUM", (1, 3, 4), (4,), (0.05, 1), (0.05, 1), (0.05, 1), const2=rng.integers(-128, 128, 4)
        ),
        "prelu": O.plain_binary_model(
            "PRELU",
            (1, 3, 3, 4),
            (1, 1, 4),
            (0.05, 1),
            (0.01, 0),
            (0.04, -2),
            const2=rng.integers(-128, 128, 4),
        ),
        "slice": O.slice_model((1, 4, 5, 2), [0, 1, 0, 1], [-1, 2, -1, 1], 0.05, 1),
        "unpack": O.unpack_model((1, 3, 2), 1, 0.05, 1),
        "squeeze": O.squeeze_model((1, 1, 4, 1), [1, 3], 0.05, 1),
        "expand_dims": O.expand_dims_model((1, 3, 4), -1, 0.05, 1),
        "shape_reshape": O.shape_model((1, 3, 4), 0.05, 1, reshape=True),
        "tile": O.tile_model((1, 2, 3), [1, 2, 2], 0.05, 1),
        "gather": O.gather_model((1, 5, 3), [[4, 0], [1, 1]], 1, 0.05, 1),
        "sum": O.mean_model((1, 3, 4, 5), 0.05, 1, 0.4, -1, axes=(1, 3), keep_dims=False, kind="SUM"),
        "reduce_max": O.mean_model((1, 3, 4, 5), 0.05, 1, 0.05, 1, axes=(2,), kind="REDUCE_MAX"),
        "resize_bilinear": O.resize_nearest_model((1, 3, 4, 2), (6, 7), 0.05, 0, bilinear=True),
        "batch_matmul": O.batch_matmul_model(
            (1, 2, 3, 4), (4, 5), (0.05, 1), (0.02, 0), (0.1, 2), rhs_const=rng.integers(-127, 128, (4, 5))
        ),
        # int16 activations (16x8): the int16 paths of the ops that have one
        "conv2d_int16": O.conv2d_model(
            (1, 4, 4, 3), w, rng.integers(-99, 99, 4), 0.001, 0, np.full(4, 0.01), 0.01, 0, dtype=np.int16
        ),
        "depthwise_int16": O.depthwise_model(
            (1, 4, 4, 2),
            rng.integers(-127, 128, (1, 3, 3, 4)),
            rng.integers(-99, 99, 4),
            0.001,
            0,
            np.full(4, 0.02),
            0.01,
            0,
            depth_multiplier=2,
            dtype=np.int16,
        ),
        "fully_connected_int16": O.fully_connected_model(
            (1, 8), rng.integers(-127, 128, (3, 8)), None, 0.001, 0, 0.01, 0.01, 0, dtype=np.int16
        ),
        "add_int16": O.binary_model(
            "ADD", (1, 3, 4), (1, 1, 4), 0.001, 0, 0.002, 0, 0.003, 0, dtype=np.int16
        ),
        "sub_int16": O.binary_model(
            "SUB", (1, 3, 4), (1, 1, 4), 0.001, 0, 0.002, 0, 0.003, 0, dtype=np.int16
        ),
        "mul_int16": O.binary_model(
            "MUL", (1, 3, 4), (1, 3, 4), 0.001, 0, 0.002, 0, 0.003, 0, dtype=np.int16
        ),
        "logistic_int16": O.logistic_model((1, 3, 5), 0.001, 0, dtype=np.int16),
        "softmax_int16": O.softmax_model((1, 3, 7), 0.001, 0, dtype=np.int16),
    }
    return seeds


# ----------------------------------------------------------------------------------------------
# Structured mutations: edit the ModelT tree
# ----------------------------------------------------------------------------------------------

HUGE_DIMS = [INT32_MAX, 2**30, 1 << 20, 65536, 40000]
ODD_DIMS = [0, -1, -2, -(2**31), 1, 2, 3, 5, 7, 16, 64]
INDEX_VALUES = [-1, -2, -(2**31), INT32_MAX, 2**16]


def _sg(m):
    return m.subgraphs[0] if m.subgraphs else None


def _tensors(m):
    sg = _sg(m)
    return sg.tensors if sg is not None and sg.tensors else []


def _ops(m):
    sg = _sg(m)
    return sg.operators if sg is not None and sg.operators else []


def _pick(rng, seq):
    return seq[int(rng.integers(len(seq)))]


def _as_list(v):
    return [] if v is None else [int(a) for a in np.asarray(v).ravel()]


def mutate_tensor_shape(m, rng):
    ts = _tensors(m)
    if not ts:
        return
    t = _pick(rng, ts)
    shape = _as_list(t.shape)
    r = rng.integers(7)
    if r == 0 and shape:
        shape[rng.integers(len(shape))] = _pick(rng, HUGE_DIMS)
    elif r == 1 and shape:
        shape[rng.integers(len(shape))] = _pick(rng, ODD_DIMS)
    elif r == 2 and shape:
        shape.pop(rng.integers(len(shape)))
    elif r == 3:
        shape.insert(int(rng.integers(len(shape) + 1)), int(_pick(rng, [1, 2, 3])))
    elif r == 4:
        shape = []
    elif r == 5:
        shape = [int(_pick(rng, [1, 2, 3])) for _ in range(int(rng.integers(1, 40)))]
    else:
        shape = [_pick(rng, HUGE_DIMS) for _ in shape] or [INT32_MAX]
    t.shape = shape


def mutate_tensor_buffer(m, rng):
    ts = _tensors(m)
    if not ts:
        return
    t = _pick(rng, ts)
    n = len(m.buffers or [])
    t.buffer = int(_pick(rng, [0, n, n + 1, 2**32 - 1, 2**31, int(rng.integers(max(n, 1)))]))


def mutate_tensor_type(m, rng):
    ts = _tensors(m)
    if ts:
        _pick(rng, ts).type = int(_pick(rng, [int(rng.integers(0, 20)), 127, -1, -128]))


def mutate_quantization(m, rng):
    ts = _tensors(m)
    if not ts:
        return
    t = _pick(rng, ts)
    q = t.quantization
    r = rng.integers(8)
    if r == 0 or q is None:
        t.quantization = None
        return
    if r == 1:
        q.scale = [float(_pick(rng, [0.0, -1.0, math.nan, math.inf, 1e-45, 1e30, 3e38]))]
    elif r == 2:
        q.zeroPoint = [int(_pick(rng, [1000, -1000, 2**40, -(2**63), 255]))] * max(
            len(_as_list(q.zeroPoint)), 1
        )
    elif r == 3:
        q.zeroPoint = []
    elif r == 4:
        q.scale = [0.01] * int(_pick(rng, [2, 3, 7, 1000]))
    elif r == 5:
        q.quantizedDimension = int(_pick(rng, [-1, 1, 2, 3, 7, INT32_MAX]))
    elif r == 6:
        q.scale = None
    else:
        q.scale, q.zeroPoint = [], []


def _tensor_index(m, rng):
    n = len(_tensors(m))
    return int(_pick(rng, INDEX_VALUES + [n, n + 1] + [int(rng.integers(max(n, 1)))] * 6))


def mutate_op_inputs(m, rng):
    ops = _ops(m)
    if not ops:
        return
    op = _pick(rng, ops)
    ins = _as_list(op.inputs)
    r = rng.integers(5)
    if r == 0 and ins:
        ins[rng.integers(len(ins))] = _tensor_index(m, rng)
    elif r == 1 and ins:
        ins.pop(rng.integers(len(ins)))
    elif r == 2:
        ins.append(_tensor_index(m, rng))
    elif r == 3:
        ins = []
    else:
        rng.shuffle(ins)
    op.inputs = ins


def mutate_op_outputs(m, rng):
    ops = _ops(m)
    if not ops:
        return
    op = _pick(rng, ops)
    outs = _as_list(op.outputs)
    r = rng.integers(4)
    if r == 0 and outs:
        outs[0] = _tensor_index(m, rng)
    elif r == 1:
        outs = []
    elif r == 2:
        outs = outs + [_tensor_index(m, rng)]
    elif outs and op.inputs is not None and len(op.inputs):
        outs[0] = int(_pick(rng, _as_list(op.inputs)))  # writes its own input
    op.outputs = outs


def mutate_cycle(m, rng):
    """An op reads a tensor that a later op (or the op itself) produces."""
    ops = _ops(m)
    if not ops:
        return
    i = int(rng.integers(len(ops)))
    j = int(rng.integers(i, len(ops)))
    ins, outs = _as_list(ops[i].inputs), _as_list(ops[j].outputs)
    if ins and outs:
        ins[rng.integers(len(ins))] = outs[0]
        ops[i].inputs = ins


def mutate_swap_edges(m, rng):
    """Two ops exchange an input (a structurally valid graph with inconsistent shapes)."""
    ops = _ops(m)
    if len(ops) < 2:
        return
    a, b = _pick(rng, ops), _pick(rng, ops)
    ia, ib = _as_list(a.inputs), _as_list(b.inputs)
    if ia and ib:
        ka, kb = int(rng.integers(len(ia))), int(rng.integers(len(ib)))
        ia[ka], ib[kb] = ib[kb], ia[ka]
        a.inputs, b.inputs = ia, ib


def mutate_op_order(m, rng):
    sg = _sg(m)
    ops = _ops(m)
    if not ops:
        return
    r = rng.integers(4)
    if r == 0:
        ops = list(ops)
        rng.shuffle(ops)
    elif r == 1:
        ops = ops[::-1]
    elif r == 2:
        ops = [o for k, o in enumerate(ops) if k != rng.integers(len(ops))]
    else:
        ops = list(ops) + [copy.deepcopy(_pick(rng, ops))]
    sg.operators = ops


def mutate_opcode(m, rng):
    ops = _ops(m)
    codes = m.operatorCodes or []
    r = rng.integers(3)
    if r == 0 and ops:
        _pick(rng, ops).opcodeIndex = int(
            _pick(rng, [len(codes), len(codes) + 5, 2**32 - 1, int(rng.integers(max(len(codes), 1)))])
        )
    elif codes:
        c = _pick(rng, codes)
        code = int(_pick(rng, [int(rng.integers(0, 210)), 3, 9, 0, 22, 25, 114, 6, 17, 32, 4, 40, 49]))
        c.builtinCode = code
        c.deprecatedBuiltinCode = min(code, 127)


def mutate_options(m, rng):
    ops = _ops(m)
    if not ops:
        return
    op = _pick(rng, ops)
    r = rng.integers(6)
    if r == 0:
        op.builtinOptions = None
        return
    if r == 1:  # another op's options, another type
        other = _pick(rng, ops)
        op.builtinOptionsType, op.builtinOptions = (
            other.builtinOptionsType,
            copy.deepcopy(other.builtinOptions),
        )
        return
    o = op.builtinOptions
    if o is None:
        return
    fields = [
        k for k, v in vars(o).items() if isinstance(v, (int, float, bool, list, np.ndarray)) and v is not None
    ]
    if not fields:
        return
    k = _pick(rng, fields)
    v = getattr(o, k)
    wide = k in (
        "strideW",
        "strideH",
        "dilationWFactor",
        "dilationHFactor",
        "filterWidth",
        "filterHeight",
        "axis",
        "depthMultiplier",
    )
    if isinstance(v, bool):
        setattr(o, k, not v)
    elif isinstance(v, float):
        setattr(o, k, float(_pick(rng, [0.0, -1.0, math.nan, math.inf, 1e-30, 1e30])))
    elif isinstance(v, int):
        choices = [0, -1, 1, 2, 3, 5, 7, 100, 127, -128] + ([INT32_MAX, -(2**31), 65536] if wide else [])
        setattr(o, k, int(_pick(rng, choices)))
    else:
        setattr(o, k, [int(_pick(rng, [-1, 0, 1, 7, INT32_MAX])) for _ in range(int(rng.integers(0, 6)))])


def mutate_graph_io(m, rng):
    sg = _sg(m)
    if sg is None:
        return
    which = "inputs" if rng.integers(2) else "outputs"
    v = _as_list(getattr(sg, which))
    r = rng.integers(4)
    if r == 0:
        v = []
    elif r == 1:
        v = [_tensor_index(m, rng)]
    elif r == 2:
        v = v + [_tensor_index(m, rng)]
    else:
        v = v * 2
    setattr(sg, which, v)


def mutate_buffer_data(m, rng):
    bufs = [b for b in (m.buffers or []) if b.data is not None and len(b.data)]
    if not bufs:
        return
    b = _pick(rng, bufs)
    data = np.asarray(b.data, np.uint8)
    r = rng.integers(4)
    if r == 0:
        b.data = data[: int(rng.integers(len(data)))]
    elif r == 1:
        b.data = np.concatenate([data, rng.integers(0, 256, int(rng.integers(1, 64)), dtype=np.uint8)])
    elif r == 2:
        b.data = None  # the constant becomes an activation nobody produces
    else:
        b.data = rng.integers(0, 256, len(data), dtype=np.uint8)  # random weights: must still run
        b.offset, b.size = int(_pick(rng, [0, 1, 2**40])), int(_pick(rng, [0, 2**40]))


def mutate_structure(m, rng):
    r = rng.integers(6)
    sg = _sg(m)
    if r == 0:
        m.subgraphs = []
    elif r == 1 and sg is not None:
        m.subgraphs = [sg, copy.deepcopy(sg)]
    elif r == 2:
        m.buffers = None
    elif r == 3:
        m.operatorCodes = None
    elif r == 4 and sg is not None and sg.tensors:
        sg.tensors = sg.tensors[: int(rng.integers(len(sg.tensors)))]
    elif sg is not None:
        sg.tensors = None


STRUCTURED = {
    "tensor_shape": mutate_tensor_shape,
    "tensor_buffer": mutate_tensor_buffer,
    "tensor_type": mutate_tensor_type,
    "quantization": mutate_quantization,
    "op_inputs": mutate_op_inputs,
    "op_outputs": mutate_op_outputs,
    "cycle": mutate_cycle,
    "swap_edges": mutate_swap_edges,
    "op_order": mutate_op_order,
    "opcode": mutate_opcode,
    "options": mutate_options,
    "graph_io": mutate_graph_io,
    "buffer_data": mutate_buffer_data,
    "structure": mutate_structure,
}


# ----------------------------------------------------------------------------------------------
# Byte mutations: damage the packed flatbuffer
# ----------------------------------------------------------------------------------------------


def _position(data: bytearray, rng, hot) -> int:
    """Mostly the flatbuffer's structure (tables, vectors, offsets), sometimes anywhere."""
    if hot is not None and len(hot) and rng.random() < 0.85:
        return int(min(hot[int(rng.integers(len(hot)))], len(data) - 1))
    return int(rng.integers(len(data)))


def flip_bits(data, rng, hot):
    for _ in range(int(rng.integers(1, 9))):
        p = _position(data, rng, hot)
        data[p] ^= 1 << int(rng.integers(8))
    return data


def truncate(data, rng, hot):
    return data[: int(rng.integers(0, len(data)))]


def forge_word(data, rng, hot):
    """Overwrite an aligned 32-bit word (an offset, a length, an index) with a hostile value."""
    p = _position(data, rng, hot) & ~3
    if p + 4 > len(data):
        return data
    old = int.from_bytes(data[p : p + 4], "little")
    new = (
        int(
            _pick(
                rng,
                [
                    0,
                    1,
                    0xFFFFFFFF,
                    0x7FFFFFFF,
                    0x80000000,
                    len(data),
                    len(data) - p,
                    old + 4,
                    old - 4,
                    old * 2,
                    int(rng.integers(0, 2**32)),
                    int(rng.integers(0, 256)),
                ],
            )
        )
        % 2**32
    )
    data[p : p + 4] = new.to_bytes(4, "little")
    return data


def swap_words(data, rng, hot):
    a, b = _position(data, rng, hot) & ~3, _position(data, rng, hot) & ~3
    if max(a, b) + 4 <= len(data):
        data[a : a + 4], data[b : b + 4] = data[b : b + 4], data[a : a + 4]
    return data


def overwrite_run(data, rng, hot):
    p = _position(data, rng, hot)
    n = int(rng.integers(1, 33))
    data[p : p + n] = rng.integers(0, 256, min(n, len(data) - p), dtype=np.uint8).tobytes()
    return data


def splice(data, rng, hot):
    """Insert or delete bytes: every offset that spans the cut now points elsewhere."""
    p = _position(data, rng, hot)
    n = int(rng.integers(1, 17))
    if rng.integers(2):
        return data[:p] + bytearray(rng.integers(0, 256, n, dtype=np.uint8).tobytes()) + data[p:]
    return data[:p] + data[p + n :]


BYTES = {
    "flip_bits": flip_bits,
    "truncate": truncate,
    "forge_word": forge_word,
    "swap_words": swap_words,
    "overwrite_run": overwrite_run,
    "splice": splice,
}
KINDS = sorted(STRUCTURED) + sorted(BYTES)


# ----------------------------------------------------------------------------------------------
# Seeds prepared once: packed bytes, object tree, structural byte positions
# ----------------------------------------------------------------------------------------------


@dataclass
class Seed:
    name: str
    data: bytes
    tree: object
    hot: np.ndarray  # byte positions outside constant data: where damage hits the structure


def prepare_seed(name: str, data: bytes) -> Seed:
    tree = schema.ModelT.InitFromPackedBuf(bytearray(data), 0)
    model = schema.Model.GetRootAs(bytearray(data), 0)
    cold = np.zeros(len(data), bool)
    for i in range(model.BuffersLength()):
        tab = model.Buffers(i)._tab
        o = tab.Offset(4)
        if o:
            start = tab.Vector(o)
            cold[start : start + tab.VectorLen(o)] = True
    return Seed(name, data, tree, np.flatnonzero(~cold))


def pack(tree) -> bytes:
    builder = flatbuffers.Builder(1024)
    builder.Finish(tree.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def build_case(seed: Seed, plan) -> bytes | None:
    """Apply structured mutations (in plan order) to the tree, pack, then the byte mutations.
    None when the mutated tree cannot be packed (a value outside its field's range)."""
    structured = [(k, s) for k, s in plan if k in STRUCTURED]
    data = seed.data
    hot = seed.hot
    if structured:
        tree = copy.deepcopy(seed.tree)
        for kind, s in structured:
            STRUCTURED[kind](tree, np.random.default_rng(s))
        try:
            data = pack(tree)
        except Exception:  # struct.error and friends from the test-side packer: not a case
            return None
        hot = None
    buf = bytearray(data)
    for kind, s in plan:
        if kind in BYTES and len(buf):
            buf = BYTES[kind](buf, np.random.default_rng(s), hot)
    return bytes(buf)


# ----------------------------------------------------------------------------------------------
# One case
# ----------------------------------------------------------------------------------------------


def gist(message: str) -> str:
    """A message reduced to its kind: indices, numbers and names masked, for the outcome counts."""
    m = re.sub(r"^(model|\S+\.tflite): ", "", message)
    m = re.sub(r"'[^']*'", "'…'", m)
    m = re.sub(r"\([A-Z][A-Z0-9_:]*\)", "(OP)", m)
    m = re.sub(r"\[[^\]]*\]", "[…]", m)
    m = re.sub(r"\b-?\d+(\.\d+)?(e[-+]?\d+)?\b", "#", m)
    return m[:70]


def valid_input(shape, dtype, n: int, rng) -> np.ndarray:
    shape = (n,) + tuple(shape[1:])
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    info = np.iinfo(dtype)
    # Drawn in the input's own dtype: an int64 draw of a batch near the allocation limit would take
    # 8 times the input's bytes and trip the case's own bound on the traced peak.
    return rng.integers(max(info.min, -128), min(info.max, 255), shape, dtype=dtype, endpoint=True)


def run_case(data: bytes, n: int = 2) -> str:
    """Read, plan (kernels, MACs, NPU report) and run one (possibly hostile) model on a batch of n
    and on its first image alone. Returns the outcome label; raises CaseFailure on a contract breach."""
    stage = "load"
    try:
        graph = load_model(data)
        stage = "prepare"
        interp = Interpreter(graph)
        interp.macs()
        npu_report(interp)  # the NPU placement, epochs and arena plan of `npusim inspect --target stm32n6`
        stage = "input"
        rng = np.random.default_rng(0)
        xs = []
        for k in range(len(graph.inputs)):
            t = graph.input(k)
            per_image = int(np.prod(t.shape[1:], dtype=np.float64)) * np.dtype(t.dtype).itemsize
            if per_image > limits.MAX_TENSOR_BYTES:
                raise CaseFailure(
                    f"planner accepted an input of {per_image} bytes per image (shape {list(t.shape)}) "
                    f"beyond the allocation limit"
                )
            xs.append(valid_input(t.shape, t.dtype, n, rng))
        stage = "run"
        if len(xs) == 1:
            y, y1 = interp.run(xs[0]), interp.run(xs[0][:1])
            if len(graph.outputs) > 1:  # a list in the graph's output order
                if not isinstance(y, list) or len(y) != len(graph.outputs):
                    n = len(graph.outputs)
                    raise CaseFailure(f"run returned {type(y).__name__}, expected a list of {n} outputs")
                y, y1 = y[0], y1[0]
        else:
            values = {graph.inputs[k]: interp.check_input(x, k) for k, x in enumerate(xs)}
            y = interp.evaluate(values)[graph.outputs[0]]
            y1 = interp.evaluate({graph.inputs[k]: x[:1] for k, x in enumerate(xs)})[graph.outputs[0]]
    except NpusimError as e:
        message = str(e)
        if not message or "\n" in message:
            raise CaseFailure(f"NpusimError at {stage} without a one-line message: {message!r}") from e
        return f"NpusimError/{stage}: {gist(message)}"
    except CaseFailure:
        raise
    except Exception as e:
        raise CaseFailure(f"{type(e).__name__} at {stage}: {e}") from e
    out = graph.output()
    if not isinstance(y, np.ndarray) or y.dtype != out.dtype or y.shape[1:] != tuple(out.shape[1:]):
        raise CaseFailure(
            f"run returned {getattr(y, 'dtype', type(y))} {getattr(y, 'shape', '')}, "
            f"declared output {np.dtype(out.dtype).name} {list(out.shape)}"
        )
    k = y1.shape[0]
    if not np.array_equal(y[:k], y1, equal_nan=True):
        raise CaseFailure("the first image's output depends on the other images in the batch")
    return "ok"


# ----------------------------------------------------------------------------------------------
# Campaign machinery
# ----------------------------------------------------------------------------------------------


def is_quantized(data: bytes) -> bool:
    """Whether a model computes in integers: some activation (a tensor no constant data fills) has
    quantization parameters. A float model (the float half of a float/int8 pair) is no int8 seed,
    whatever its file is called or wherever it lies."""
    graph = load_model(data)
    return any(t.quant is not None and not t.is_constant for t in graph.tensors)


def real_seeds() -> dict[str, bytes]:
    """The shared folder's int8 .tflite models, chosen by what each model is (is_quantized)."""
    models = SHARED / "models"
    paths = sorted(models.glob("*.tflite")) if models.is_dir() else []
    return {p.stem: data for p in paths if is_quantized(data := p.read_bytes())}


def need_real_seeds() -> dict[str, bytes]:
    seeds = real_seeds()
    if not seeds:
        pytest.skip(
            f"SHARED DATA MISSING: no int8 .tflite in {SHARED / 'models'} "
            "(set NPU_SHARED); real-model fuzzing skipped"
        )
    return seeds


@contextlib.contextmanager
def hard_timeout(seconds: float):
    """A hang inside a case (hypothesis' deadline only judges cases that finish) becomes a failure."""

    def expire(signum, frame):
        raise CaseFailure(f"case still running after {seconds} s: a hang")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _address_space() -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


@contextlib.contextmanager
def memory_guard():
    """npusim's allocation limit lowered to FUZZ_LIMIT, and the address space capped 4 GiB above its
    current size: an allocation that slips past the limit fails the case with MemoryError instead of
    exhausting a shared machine."""
    old_limit = limits.MAX_TENSOR_BYTES
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    vm = _address_space()
    limits.MAX_TENSOR_BYTES = FUZZ_LIMIT
    if vm is not None:
        cap = vm + (4 << 30)
        if hard != resource.RLIM_INFINITY:
            cap = min(cap, hard)
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        limits.MAX_TENSOR_BYTES = old_limit
        if vm is not None:
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def checked_case(data: bytes, traced: bool) -> str:
    """run_case under a hard timeout; traced cases also bound the peak of traced allocations."""
    if traced:
        tracemalloc.start()
    try:
        with hard_timeout(CASE_HARD_TIMEOUT):
            outcome = run_case(data)
        if traced:
            peak = tracemalloc.get_traced_memory()[1]
            bound = 6 * FUZZ_LIMIT + 8 * len(data) + (8 << 20)
            if peak > bound:
                raise CaseFailure(
                    f"case allocated {peak} bytes at its peak, more than {bound} "
                    f"(allocation limit {FUZZ_LIMIT})"
                )
        return outcome
    finally:
        if traced:
            tracemalloc.stop()


class Campaign:
    """Counts outcomes and prints them: cases run, ok, and NpusimError by stage and kind."""

    def __init__(self, label: str):
        self.label = label
        self.counts: collections.Counter = collections.Counter()
        self.start = time.perf_counter()

    def record(self, outcome: str):
        self.counts[outcome] += 1

    def summary(self, top: int = 12) -> str:
        total = sum(self.counts.values())
        stages = collections.Counter()
        for outcome, n in self.counts.items():
            stages[outcome.split(":")[0]] += n
        lines = [
            f"fuzz {self.label}: {total} cases in {time.perf_counter() - self.start:.1f} s: "
            + ", ".join(f"{k} {v}" for k, v in sorted(stages.items(), key=lambda kv: -kv[1]))
        ]
        errors = [(k, v) for k, v in self.counts.items() if k.startswith("NpusimError")]
        for outcome, n in sorted(errors, key=lambda kv: -kv[1])[:top]:
            lines.append(f"  {n:6d}  {outcome}")
        if len(errors) > top:
            lines.append(
                f"  {sum(v for _, v in sorted(errors, key=lambda kv: -kv[1])[top:]):6d}  "
                f"({len(errors) - top} other kinds of NpusimError)"
            )
        return "\n".join(lines)

    def report(self, capsys):
        with capsys.disabled():
            print("\n" + self.summary())


def plans(kinds: list[str]):
    return st.lists(st.tuples(st.sampled_from(kinds), st.integers(0, 2**32 - 1)), min_size=1, max_size=4)


def run_campaign(
    label: str, seeds: dict[str, bytes], examples: int, kinds: list[str], failures: Path, capsys
):
    prepared = {name: prepare_seed(name, data) for name, data in seeds.items()}
    for (
        name,
        seed,
    ) in prepared.items():  # every seed runs; and Numba compiles its kernels outside the deadline
        assert run_case(seed.data) == "ok", name
    campaign = Campaign(label)
    index = iter(range(1 << 62))

    @settings(max_examples=examples, deadline=CASE_DEADLINE, suppress_health_check=list(HealthCheck))
    @given(name=st.sampled_from(sorted(prepared)), plan=plans(kinds))
    def case(name, plan):
        data = build_case(prepared[name], plan)
        if data is None:
            campaign.record("skipped: a mutated field out of its type's range")
            return
        try:
            outcome = checked_case(data, next(index) % CHECK_MEMORY_EVERY == 0)
        except CaseFailure as e:
            failures.mkdir(parents=True, exist_ok=True)
            path = failures / f"{label}-{name}-{len(data)}-{sum(data) % 100000}.tflite"
            path.write_bytes(data)
            raise CaseFailure(f"{e}\n  seed {name!r}, mutations {plan}\n  replay: {path}") from None
        campaign.record(outcome)

    with memory_guard():
        case()
    campaign.report(capsys)
    return campaign


def share(request, fraction: float, minimum: int = 1) -> int:
    return max(minimum, round(request.config.getoption("--fuzz-examples") * fraction))


# ----------------------------------------------------------------------------------------------
# Campaigns
# ----------------------------------------------------------------------------------------------


def test_fuzz_generated_models(request, tmp_path, capsys):
    """Every supported op in small generated models, all mutation kinds (70% of the cases)."""
    c = run_campaign("generated models", generated_seeds(), share(request, 0.7), KINDS, tmp_path, capsys)
    assert c.counts["ok"] > 0 and any(k.startswith("NpusimError/prepare") for k in c.counts)


def test_fuzz_real_models(request, tmp_path, capsys):
    """ResNet-8 and MobileNetV2 (30% of the cases), structured mutations weighted 2:1 over byte damage."""
    seeds = need_real_seeds()
    kinds = sorted(STRUCTURED) * 2 + sorted(BYTES)
    c = run_campaign("real models", seeds, share(request, 0.3), kinds, tmp_path, capsys)
    assert c.counts["ok"] > 0


def test_fuzz_cli_run(request, tmp_path, capsys):
    """`npusim run` on mutated files in subprocesses: exit 0 with an output of the declared shape, or
    exit 2 with one line on stderr; never a traceback, a signal or a hang."""
    seeds = {**generated_seeds(), **real_seeds()}
    prepared = {name: prepare_seed(name, data) for name, data in seeds.items()}
    names = sorted(prepared)
    n = share(request, 1 / 250, minimum=8)
    campaign = Campaign("npusim run (subprocess)")
    rng = np.random.default_rng(20261129)
    jobs = []
    for i in range(n):
        name = names[i % len(names)]
        plan = [
            (KINDS[rng.integers(len(KINDS))], int(rng.integers(2**32)))
            for _ in range(int(rng.integers(1, 4)))
        ]
        data = build_case(prepared[name], plan)
        if data is None:
            continue
        model, x, y = tmp_path / f"case{i}.tflite", tmp_path / f"x{i}.npy", tmp_path / f"y{i}.npy"
        model.write_bytes(data)
        graph = load_model(prepared[name].data)  # the seed's input: valid for the model before damage
        t = graph.input()
        np.save(x, valid_input(t.shape, t.dtype, 2, rng))
        jobs.append((name, plan, model, x, y))

    def limit_memory():
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, resource.getrlimit(resource.RLIMIT_AS)[1]))

    def start(job):
        _, _, model, x, y = job
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "npusim.app.cli",
                "run",
                str(model),
                "--input",
                str(x),
                "--output",
                str(y),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=limit_memory,
        )

    running = []
    pending = list(jobs)
    while pending or running:
        while pending and len(running) < 2:
            job = pending.pop(0)
            running.append((job, start(job), time.perf_counter()))
        job, proc, t0 = running.pop(0)
        name, plan, model, _, y = job
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            pytest.fail(f"npusim run hung on {model} (seed {name!r}, mutations {plan})")
        where = f"seed {name!r}, mutations {plan}, file {model}"
        assert proc.returncode in (0, 2), f"exit {proc.returncode}: {err[-2000:]}\n{where}"
        assert "Traceback" not in err, f"{err[-2000:]}\n{where}"
        if proc.returncode == 2:
            lines = err.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("error: "), f"{err!r}\n{where}"
            campaign.record("NpusimError/cli: " + gist(lines[0][len("error: ") :]))
        else:
            declared = load_model(model.read_bytes()).output()
            result = np.load(y)
            assert result.dtype == declared.dtype and result.shape[1:] == tuple(declared.shape[1:]), where
            campaign.record("ok")
    campaign.report(capsys)
    assert sum(campaign.counts.values()) == len(jobs)


# ----------------------------------------------------------------------------------------------
# Targeted hostile files
# ----------------------------------------------------------------------------------------------


def shared_reference_bomb(k: int) -> bytes:
    """k references to one subgraph that holds k references to one tensor: k*k tensors to unpack
    from a file of 8k bytes (before the structure check, k = 1000 took 89 s and 2.1 GB to unpack)."""
    b = flatbuffers.Builder(1024)
    t = schema.TensorT()
    t.shape, t.type, t.name = [1, 4], schema.TensorType.INT8, "x"
    tensor = t.Pack(b)
    schema.SubGraphStartTensorsVector(b, k)
    for _ in range(k):
        b.PrependUOffsetTRelative(tensor)
    tensors = b.EndVector()
    schema.SubGraphStart(b)
    schema.SubGraphAddTensors(b, tensors)
    sg = schema.SubGraphEnd(b)
    schema.ModelStartSubgraphsVector(b, k)
    for _ in range(k):
        b.PrependUOffsetTRelative(sg)
    subgraphs = b.EndVector()
    schema.ModelStart(b)
    schema.ModelAddVersion(b, 3)
    schema.ModelAddSubgraphs(b, subgraphs)
    b.Finish(schema.ModelEnd(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def test_shared_references_are_refused_before_unpacking():
    data = shared_reference_bomb(3000)
    tracemalloc.start()
    try:
        with pytest.raises(NpusimError, match="over and over"):
            load_model(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20  # refused before the shared tables were unpacked (no wall time asserted)


def test_forged_vector_lengths_are_refused():
    """The length word of each vector in a real file set to 2^31 - 1: refused, no big allocation."""
    seed = tiny_classifier()
    model = schema.Model.GetRootAs(bytearray(seed), 0)
    sg = model.Subgraphs(0)
    lengths = []
    for table, slot in ((model._tab, 4 + 2 * 2), (model._tab, 4 + 2 * 1), (sg._tab, 4), (sg._tab, 4 + 2 * 3)):
        o = table.Offset(slot)  # buffers, subgraphs; tensors, operators
        lengths.append(table.Vector(o) - 4)
    t = model.Subgraphs(0).Tensors(0)
    lengths.append(t._tab.Vector(t._tab.Offset(4)) - 4)  # the tensor's shape
    for pos in lengths:
        data = bytearray(seed)
        data[pos : pos + 4] = (INT32_MAX).to_bytes(4, "little")
        # the vectors' lengths say "longer than the file"; the shape's, read by the flatbuffers
        # runtime, "file truncated or damaged"
        tracemalloc.start()
        try:
            with pytest.raises(NpusimError, match="^model: malformed flatbuffer[:,] ") as e:
                Interpreter(load_model(bytes(data))).run(np.zeros((1, 4, 4, 3), np.int8))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert "\n" not in str(e.value)
        assert peak < 64 << 20, (pos, peak)  # the forged 2^31 - 1 was never allocated


def test_a_damaged_field_that_reading_skips_is_refused_when_the_model_is_written():
    """load_model reads the fields a Graph needs (tflite_io._read); write_model unpacks them all. A
    model whose version field points past the end of the file loads and runs, and writing it back
    ends in NpusimError, one line, instead of the flatbuffers runtime's struct.error."""
    data = bytearray(tiny_classifier())
    root = int.from_bytes(data[0:4], "little")
    vtable = root - int.from_bytes(data[root : root + 4], "little", signed=True)
    size = int.from_bytes(data[vtable : vtable + 2], "little")
    assert size >= 6  # the version field is present
    # The Model table gets a vtable of its own (the builder shares one with the subgraph's table),
    # appended to the file, whose version field points far past the end.
    own = len(data) + len(data) % 2
    data += bytes(own - len(data)) + data[vtable : vtable + size]
    data[own + 4 : own + 6] = (0xFFF0).to_bytes(2, "little")
    data[root : root + 4] = (root - own).to_bytes(4, "little", signed=True)
    graph = load_model(bytes(data))
    Interpreter(graph).run(np.zeros((1, 4, 4, 3), np.int8))
    with pytest.raises(NpusimError, match="^model: malformed flatbuffer, cannot write the model back") as e:
        write_model(graph)
    assert "\n" not in str(e.value)


def test_constants_sharing_a_buffer_count_against_the_limit(monkeypatch):
    """Many tensors reading one buffer each get a copy: the total is bounded, not just each tensor."""
    b = O.ModelBuilder()
    x = b.add_tensor((1, 4), np.int8, 0.1, 0)
    c = b.add_const(np.zeros((1024, 1024), np.int8), scale=0.1, zero_point=0)
    for _ in range(40):
        b.tensors.append(copy.deepcopy(b.tensors[c]))
    y = b.add_tensor((1, 4), np.int8, 1 / 256, -128)
    opt = schema.SoftmaxOptionsT()
    opt.beta = 1.0
    b.add_op("SOFTMAX", [x], [y], opt)
    data = b.build([x], [y])
    assert len(data) < 2 << 20
    load_model(data)  # 41 MiB of constants: within the 1 GiB limit
    monkeypatch.setattr(limits, "MAX_TENSOR_BYTES", 16 << 20)
    with pytest.raises(NpusimError, match="constant data exceeds the limit"):
        load_model(data)


def test_absurd_but_consistent_shapes_are_refused_before_allocation(monkeypatch):
    """A well-formed file can still ask for too much: a tensor beyond the limit is refused by the
    reader, a kernel workspace (im2col) or a batch beyond it by the planner, before anything is allocated."""
    with pytest.raises(NpusimError, match="more than the limit"):
        load_model(O.dequantize_model((1, 20000, 20000), 0.1, 0))  # float32 output: 1.6 GB
    rng = np.random.default_rng(0)
    w = rng.integers(-127, 128, (64, 9, 9, 64)).astype(np.int8)
    conv = O.conv2d_model((1, 512, 512, 64), w, None, 0.05, 0, 0.01, 0.1, 0)  # im2col: 5.4 GB per image
    tracemalloc.start()
    try:
        with pytest.raises(NpusimError, match="workspace of op 0 \\(CONV_2D\\)"):
            Interpreter(conv)
        assert tracemalloc.get_traced_memory()[1] < 64 << 20
    finally:
        tracemalloc.stop()
    interp = Interpreter(O.conv2d_model((1, 64, 64, 8), w[:8, :3, :3, :8], None, 0.05, 0, 0.01, 0.1, 0))
    monkeypatch.setattr(limits, "MAX_TENSOR_BYTES", interp.largest_allocation(8)[0])
    with pytest.raises(NpusimError, match="a batch of 200 needs .* run smaller batches"):
        interp.run(np.zeros((200, 64, 64, 8), np.int8))
    assert interp.run(np.zeros((8, 64, 64, 8), np.int8)).shape == (8, 64, 64, 8)


@pytest.mark.parametrize("kind", sorted(STRUCTURED))
def test_each_structured_mutation_packs(kind):
    """The mutators themselves work: each kind changes a seed and the result still packs."""
    seed = prepare_seed("chain", chain_model())
    changed = 0
    for s in range(20):
        data = build_case(seed, [(kind, s)])
        changed += data is not None and data != seed.data
    assert changed >= 5


def test_real_seeds_are_chosen_by_what_a_model_is():
    """The float half of the shared float/int8 pair lies beside the int8 models but is no int8 seed;
    a generated float model is judged the same way, wherever it lies."""
    float_model = SHARED / "models" / "resnet8_cifar10_float.tflite"
    if not float_model.exists():
        pytest.skip(f"SHARED DATA MISSING: {float_model} not found (set NPU_SHARED)")
    assert not is_quantized(float_model.read_bytes())
    seeds = real_seeds()
    assert "resnet8_cifar10_int8" in seeds and "resnet8_cifar10_float" not in seeds
    assert all(is_quantized(data) for data in seeds.values())
