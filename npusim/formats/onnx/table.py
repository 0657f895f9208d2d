"""The one table of ONNX op types npusim lowers: each with its lowering function and the TFLite op
kinds it may emit (the op registry lists, per kind, the ONNX ops that lower to it). QuantizeLinear,
DequantizeLinear and Constant are handled by the walk itself (importer.py)."""

from __future__ import annotations

from dataclasses import dataclass

from . import lower_conv as conv
from . import lower_elementwise as ew
from . import lower_integer as integer
from . import lower_movement as mv
from . import lower_pool as pool
from . import lower_qoperator as qop


@dataclass(frozen=True)
class Rule:
    lower: object
    kinds: tuple


_PAD = ("PAD",)
_CONV = ("CONV_2D", "DEPTHWISE_CONV_2D", "SPLIT", "CONCATENATION") + _PAD
_REQ = ("QUANTIZE",)  # a requantization to the QuantizeLinear's scale
_LAYOUT = ("TRANSPOSE",)  # a layout change of an input (context.Lowering.physical)

LOWERINGS = {
    "Conv": Rule(conv.lower_conv, _CONV + _LAYOUT),
    "QLinearConv": Rule(qop.lower_qlinearconv, _CONV + _LAYOUT),
    "MatMul": Rule(conv.lower_matmul, ("FULLY_CONNECTED", "BATCH_MATMUL") + _LAYOUT),
    "QLinearMatMul": Rule(qop.lower_qlinearmatmul, ("FULLY_CONNECTED", "BATCH_MATMUL") + _LAYOUT),
    "Gemm": Rule(conv.lower_gemm, ("FULLY_CONNECTED",) + _LAYOUT),
    "QGemm": Rule(qop.lower_qgemm, ("FULLY_CONNECTED",) + _LAYOUT),
    "Add": Rule(ew.lower_binary("ADD"), ("ADD",) + _LAYOUT),
    "Sub": Rule(ew.lower_binary("SUB"), ("SUB",) + _LAYOUT),
    "Mul": Rule(ew.lower_binary("MUL"), ("MUL",) + _LAYOUT),
    "QLinearAdd": Rule(qop.lower_qbinary("ADD"), ("ADD",) + _LAYOUT),
    "QLinearMul": Rule(qop.lower_qbinary("MUL"), ("MUL",) + _LAYOUT),
    "Div": Rule(ew.lower_div, ("MUL",) + _LAYOUT),
    "Neg": Rule(ew.lower_neg, ("MUL",)),
    "Sigmoid": Rule(ew.lower_sigmoid, ("LOGISTIC",) + _REQ),
    "QLinearSigmoid": Rule(qop.lower_qunary(ew.lower_sigmoid), ("LOGISTIC",) + _REQ),
    "Relu": Rule(ew.lower_relu, ("MAXIMUM",) + _REQ),
    "Clip": Rule(ew.lower_clip, ("MAXIMUM", "MINIMUM") + _REQ),
    "LeakyRelu": Rule(ew.lower_leakyrelu, ("LEAKY_RELU",)),
    "QLinearLeakyRelu": Rule(qop.lower_qunary(ew.lower_leakyrelu), ("LEAKY_RELU",)),
    "HardSwish": Rule(ew.lower_hardswish, ("HARD_SWISH",)),
    "HardSigmoid": Rule(ew.lower_hardsigmoid, ("MUL", "ADD", "MAXIMUM", "MINIMUM")),
    "Concat": Rule(mv.lower_concat, ("CONCATENATION",) + _REQ + _LAYOUT),
    "QLinearConcat": Rule(qop.lower_qlinearconcat, ("CONCATENATION",) + _REQ + _LAYOUT),
    "Split": Rule(mv.lower_split, ("SPLIT_V",) + _REQ),
    "Slice": Rule(mv.lower_slice, ("STRIDED_SLICE",) + _REQ),
    "Reshape": Rule(mv.lower_reshape, ("RESHAPE",) + _REQ + _LAYOUT),
    "Flatten": Rule(mv.lower_reshape, ("RESHAPE",) + _REQ + _LAYOUT),
    "Squeeze": Rule(mv.lower_reshape, ("RESHAPE",) + _REQ + _LAYOUT),
    "Unsqueeze": Rule(mv.lower_reshape, ("RESHAPE",) + _REQ + _LAYOUT),
    "Transpose": Rule(mv.lower_transpose, _REQ),
    "Pad": Rule(mv.lower_pad, ("PAD", "PADV2") + _REQ),
    "Resize": Rule(mv.lower_resize, ("RESIZE_NEAREST_NEIGHBOR", "RESIZE_BILINEAR") + _REQ + _LAYOUT),
    "MaxPool": Rule(pool.lower_maxpool, ("MAX_POOL_2D", "PADV2") + _REQ + _LAYOUT),
    "AveragePool": Rule(pool.lower_averagepool, ("AVERAGE_POOL_2D", "PAD") + _REQ + _LAYOUT),
    "QLinearAveragePool": Rule(
        qop.lower_qunary(pool.lower_averagepool), ("AVERAGE_POOL_2D", "PAD") + _REQ + _LAYOUT
    ),
    "GlobalAveragePool": Rule(pool.lower_globalaveragepool, ("MEAN",) + _LAYOUT),
    "QLinearGlobalAveragePool": Rule(qop.lower_qunary(pool.lower_globalaveragepool), ("MEAN",) + _LAYOUT),
    "ReduceMean": Rule(pool.lower_reducemean, ("MEAN",)),
    "Softmax": Rule(pool.lower_softmax, ("SOFTMAX",) + _REQ + _LAYOUT),
    "QLinearSoftmax": Rule(qop.lower_qlinearsoftmax, ("SOFTMAX",) + _REQ + _LAYOUT),
    # BatchNormalization is folded into the Conv in front of it (lower_conv.batchnorm_fold);
    # alone it is refused.
    "BatchNormalization": Rule(conv.lower_batchnorm, ()),
    "ConvInteger": Rule(integer.lower_integer, _CONV + _LAYOUT),
    "MatMulInteger": Rule(integer.lower_integer, ("FULLY_CONNECTED",) + _LAYOUT),
    # refused with its reason (lower_integer.py): a per-run scale is no deployed integer graph
    "DynamicQuantizeLinear": Rule(integer.lower_dynamic_quantize, ()),
}
