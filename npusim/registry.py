"""One entry per TFLite operator the simulator runs, declaring everything the op has: its integer
kernel (int8 and, where TFLM has one, 16x8), its float form, the ONNX op types that lower to it,
its STM32N6 placement and fusion class, the test oracle's builder with the op version a converter
writes, its fuzz seeds, and how the onnxruntime profile runs it. tests/test_registry.py fails when
an entry lacks any of them, and the op lists of docs/numerics.md and docs/stm32n6.md are generated
from here (experiments/tables/op_lists.py).

Adding an operator: its module in npusim/ops/, its entry here, its tests.

Plain data, stdlib only: reading the registry imports no kernel (OpSpec.kernel_class imports the
op's module when asked). npusim.ops builds KERNELS from it, npu/cost.py and npu/fusion.py their
placement and fusion sets, testing/oracle.py its op versions, profiles/ort_kernels.py the kinds that
keep their own kernel under --profile onnxruntime.

Placement sources. ST Edge AI Core documentation, "ST Neural-ART NPU - Supported operators and
limitations" (stedgeai-dc.st.com/assets/embedded-docs/stneuralart_operator_support.html, Core
3.0.0 r1.2), is the reference. Its operator rows could not be fetched here; the entries marked "ST
table (summary)" come from a third-party digest of the Core 2.2.0 page (a "Modeling Constraints
Cheat-Sheet" for the STM32N6 found by code search, which lists the HW and SW_FLOAT/SW_INT
operators), ONNX names in brackets. "ASSUMPTION": not in that digest; placed by the Neural-ART's
hardware units and the first thing to correct from a `stedgeai analyze` report.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

NPU, M55 = "NPU", "M55"

# Fusion classes (npu/fusion.py): how ST's compiler folds an op into the epochs around it.
LAYER = "layer"  # an epoch of its own
CHAIN = "chain"  # chained into the producing layer's epoch as an epilogue
RESHAPE = "reshape"  # a view: moves nothing
STRIDED_READ = "strided read"  # a stream-engine strided read of its input
PAD_TAKEN = "pad"  # its padding taken over by the one CONV_2D or DEPTHWISE_CONV_2D that reads it
CONCAT = "concat"  # its inputs written in place into the output
FUSION_CLASSES = (LAYER, CHAIN, RESHAPE, STRIDED_READ, PAD_TAKEN, CONCAT)

# The families of the generated op lists, in their order.
FAMILIES = {
    "mac": "multiply-accumulate",
    "binary": "binary elementwise",
    "activation": "activations",
    "reduce": "pooling and reductions",
    "resize": "resizing",
    "movement": "data movement and shapes",
    "quantize": "quantization at the graph edges",
}

ST_DIGEST = "ST table (summary of Core 2.2.0)"

# How the onnxruntime profile runs an op (OpSpec.onnxruntime, profiles/ort_kernels.OrtKernels).
ORT_OWN = "own kernel"
ORT_MODEL = "ORT kernel model"
ORT_FLOAT = "float then QuantizeLinear"
ORT_WAYS = (ORT_OWN, ORT_MODEL, ORT_FLOAT)


@dataclass(frozen=True)
class OpSpec:
    kind: str  # the TFLite builtin operator name
    kernel: str  # "module:Class" under npusim.ops: the integer kernel (Prepare in __init__, Eval in __call__)
    family: str  # a key of FAMILIES
    unit: str  # NPU or M55: where ST's compiler runs it (npu/cost.placement refines by operands)
    fusion: str  # one of FUSION_CLASSES (ops on the M55 are layers: software epochs)
    oracle: str  # the one-op model builder in npusim.testing.oracle
    version: int  # the operator version a converter writes for int8 (TFLM ignores it)
    placement: str  # the source of the placement
    fuzz: tuple  # names of its seeds in tests/test_fuzz.generated_seeds
    int16: bool = False  # has TFLM's 16x8 path (int16 activations)
    mac: bool = False  # runs on a MAC engine (npusim/kernels/backend.py); weights may carry a group axis
    conv_accelerator: bool = False  # on the NPU, runs on the convolution accelerators (CONVACC)
    onnx: tuple = ()  # the ONNX op types that lower to it (npusim/formats/onnx/table.py LOWERINGS)
    # How --profile onnxruntime runs it (profiles/ort_kernels.py): ORT_OWN, its integer kernel, which then
    # follows ORT's arithmetic; ORT_MODEL, an exact model of ORT's QLinear kernel; ORT_FLOAT, ORT's
    # unfused QDQ group: DequantizeLinear, the float form, QuantizeLinear.
    onnxruntime: str = ORT_FLOAT
    # Runs in a legacy uint8 model (--profile xnnpack, npusim/runtime/uint8.py): proven equal to LiteRT
    # by tests/test_uint8.py's one-op uint8 models (tests/test_registry.py holds the two lists equal).
    # A uint8 model with an op not marked is refused before any work (interpreter.check_int8).
    uint8: bool = False

    def kernel_class(self):
        """The integer kernel class (imports its module, and with it Numba)."""
        module, name = self.kernel.split(":")
        return getattr(importlib.import_module(f"npusim.ops.{module}"), name)

    def float_form(self):
        """The op's float definition beside its integer kernel (the kernel class's float_form), or
        None where the kernel has none."""
        return getattr(self.kernel_class(), "float_form", None)


def _ops(*specs: OpSpec) -> dict:
    return {s.kind: s for s in specs}


def _st(what: str) -> str:
    return f"{ST_DIGEST}: {what}"


_STREAM = "ASSUMPTION: stream-engine strided read (not in the digest)"

REGISTRY = _ops(
    # -- multiply-accumulate ---------------------------------------------------------------------
    OpSpec(
        "CONV_2D",
        "conv:Conv2D",
        "mac",
        NPU,
        LAYER,
        "conv2d_model",
        3,
        placement="ST table (convolution)",
        fuzz=("conv2d", "conv2d_1x1", "conv2d_int16"),
        int16=True,
        mac=True,
        conv_accelerator=True,
        onnx=("Conv", "QLinearConv", "ConvInteger"),
        onnxruntime=ORT_OWN,
        uint8=True,
    ),
    OpSpec(
        "DEPTHWISE_CONV_2D",
        "depthwise:DepthwiseConv2D",
        "mac",
        NPU,
        LAYER,
        "depthwise_model",
        3,
        placement="ST table (depthwise convolution)",
        fuzz=("depthwise", "depthwise_int16"),
        int16=True,
        mac=True,
        conv_accelerator=True,
        onnx=("Conv", "QLinearConv", "ConvInteger"),
        onnxruntime=ORT_OWN,
        uint8=True,
    ),
    OpSpec(
        "FULLY_CONNECTED",
        "fully_connected:FullyConnected",
        "mac",
        NPU,
        LAYER,
        "fully_connected_model",
        4,
        placement="ST table (dense: Gemm, MatMul with a constant operand)",
        fuzz=("fully_connected", "fully_connected_int16"),
        int16=True,
        mac=True,
        conv_accelerator=True,
        onnx=("MatMul", "QLinearMatMul", "Gemm", "QGemm", "MatMulInteger"),
        onnxruntime=ORT_OWN,
        uint8=True,
    ),
    OpSpec(
        "TRANSPOSE_CONV",
        "transpose_conv:TransposeConv",
        "mac",
        NPU,
        LAYER,
        "transpose_conv_model",
        3,
        placement="ASSUMPTION: convolution accelerators (ConvTranspose is not in the digest)",
        fuzz=("transpose_conv",),
        conv_accelerator=True,
        onnxruntime=ORT_OWN,
        uint8=True,
    ),
    OpSpec(
        "BATCH_MATMUL",
        "batch_matmul:BatchMatMul",
        "mac",
        M55,
        LAYER,
        "batch_matmul_model",
        4,
        placement="ST table: MatMul is HW only with a constant operand; both are activations here",
        fuzz=("batch_matmul",),
        # not uint8: LiteRT runs no uint8 BATCH_MATMUL (its XNNPACK delegate fails to prepare it, its
        # builtin kernel takes float32, int8 and int16), so nothing proves it: a uint8 model with it
        # is refused
        onnx=("MatMul", "QLinearMatMul"),
        onnxruntime=ORT_OWN,
    ),
    # -- binary elementwise ----------------------------------------------------------------------
    OpSpec(
        "ADD",
        "add:Add",
        "binary",
        NPU,
        CHAIN,
        "add_model",
        2,
        placement="ST table (element-wise add)",
        fuzz=("add_broadcast", "add_const_vector", "add_int16"),
        int16=True,
        onnx=("Add", "QLinearAdd", "HardSigmoid"),
        onnxruntime=ORT_OWN,
        uint8=True,
    ),
    OpSpec(
        "SUB",
        "sub:Sub",
        "binary",
        NPU,
        CHAIN,
        "binary_model",
        2,
        placement=_st("Sub"),
        fuzz=("sub_const", "sub_int16"),
        int16=True,
        onnx=("Sub",),
        uint8=True,
    ),
    OpSpec(
        "MUL",
        "mul:Mul",
        "binary",
        NPU,
        CHAIN,
        "binary_model",
        2,
        placement=_st("Mul"),
        fuzz=("mul_broadcast", "mul_int16"),
        int16=True,
        onnx=("Mul", "QLinearMul", "Div", "Neg", "HardSigmoid"),
        onnxruntime=ORT_OWN,
        uint8=True,
    ),
    OpSpec(
        "MAXIMUM",
        "minmax:Maximum",
        "binary",
        NPU,
        CHAIN,
        "plain_binary_model",
        2,
        placement=_st("Max"),
        fuzz=("maximum",),
        onnx=("Relu", "Clip", "HardSigmoid"),
        onnxruntime=ORT_OWN,
        uint8=True,
    ),
    OpSpec(
        "MINIMUM",
        "minmax:Minimum",
        "binary",
        NPU,
        CHAIN,
        "plain_binary_model",
        2,
        placement=_st("Min"),
        fuzz=("minimum_const",),
        onnx=("Clip", "HardSigmoid"),
        onnxruntime=ORT_OWN,
        uint8=True,
    ),
    OpSpec(
        "PRELU",
        "prelu:Prelu",
        "binary",
        NPU,
        CHAIN,
        "plain_binary_model",
        1,
        placement=_st("PRelu"),
        fuzz=("prelu",),
        uint8=True,
    ),
    # -- activations -----------------------------------------------------------------------------
    OpSpec(
        "LOGISTIC",
        "logistic:Logistic",
        "activation",
        NPU,
        CHAIN,
        "logistic_model",
        2,
        placement=_st("Sigmoid"),
        fuzz=("logistic", "logistic_int16"),
        int16=True,
        onnx=("Sigmoid", "QLinearSigmoid"),
        onnxruntime=ORT_OWN,
        uint8=True,
    ),
    OpSpec(
        "TANH",
        "activations:Tanh",
        "activation",
        NPU,
        CHAIN,
        "unary_model",
        2,
        placement=_st("Tanh"),
        fuzz=("tanh",),
        uint8=True,
    ),
    OpSpec(
        "HARD_SWISH",
        "activations:HardSwish",
        "activation",
        NPU,
        CHAIN,
        "unary_model",
        1,
        placement=_st("HardSwish"),
        fuzz=("hard_swish",),
        onnx=("HardSwish",),
        uint8=True,
    ),
    OpSpec(
        "LEAKY_RELU",
        "activations:LeakyRelu",
        "activation",
        NPU,
        CHAIN,
        "leaky_relu_model",
        2,
        placement=_st("LeakyRelu"),
        fuzz=("leaky_relu",),
        onnx=("LeakyRelu", "QLinearLeakyRelu"),
        onnxruntime=ORT_OWN,
        uint8=True,
    ),
    # ST table: Softmax is HW only with the compiler's --expand-softmax, SW_INT otherwise (quoted by the
    # "STM32N6 Deployment Zoo" README, found by code search); ST's profiles do not pass the flag.
    OpSpec(
        "SOFTMAX",
        "softmax:Softmax",
        "activation",
        M55,
        LAYER,
        "softmax_model",
        2,
        placement="ST table: SW_INT unless compiled with --expand-softmax",
        fuzz=("softmax", "softmax_int16"),
        int16=True,
        onnx=("Softmax", "QLinearSoftmax"),
        uint8=True,
    ),
    # -- pooling and reductions ------------------------------------------------------------------
    OpSpec(
        "AVERAGE_POOL_2D",
        "pool:AveragePool2D",
        "reduce",
        NPU,
        LAYER,
        "avg_pool_model",
        2,
        placement="ST table (pooling; windows above 3x3 are decomposed)",
        fuzz=("avg_pool",),
        onnx=("AveragePool", "QLinearAveragePool"),
        onnxruntime=ORT_MODEL,
        uint8=True,
    ),
    OpSpec(
        "MAX_POOL_2D",
        "pool:MaxPool2D",
        "reduce",
        NPU,
        LAYER,
        "max_pool_model",
        2,
        placement="ST table (pooling; windows above 3x3 are decomposed)",
        fuzz=("max_pool",),
        onnx=("MaxPool",),
        onnxruntime=ORT_OWN,
        uint8=True,
    ),
    OpSpec(
        "MEAN",
        "mean:Mean",
        "reduce",
        NPU,
        LAYER,
        "mean_model",
        2,
        placement="ST table (ReduceMean as global average pooling; H and W only, see placement())",
        fuzz=("mean",),
        onnx=("GlobalAveragePool", "QLinearGlobalAveragePool", "ReduceMean"),
        onnxruntime=ORT_MODEL,
        uint8=True,
    ),
    OpSpec(
        "SUM",
        "reduce:Sum",
        "reduce",
        M55,
        LAYER,
        "mean_model",
        2,
        placement=_st("ReduceSum is SW_FLOAT"),
        fuzz=("sum",),
        uint8=True,
    ),
    OpSpec(
        "REDUCE_MAX",
        "reduce:ReduceMax",
        "reduce",
        NPU,
        LAYER,
        "mean_model",
        2,
        placement=_st("ReduceMax as global max pooling; H and W only, see placement()"),
        fuzz=("reduce_max",),
        onnxruntime=ORT_OWN,
        uint8=True,
    ),
    # -- resizing --------------------------------------------------------------------------------
    OpSpec(
        "RESIZE_NEAREST_NEIGHBOR",
        "resize:ResizeNearestNeighbor",
        "resize",
        NPU,
        LAYER,
        "resize_nearest_model",
        2,
        placement="ASSUMPTION: pixel copies (the digest lists bilinear Resize only)",
        fuzz=("resize_nearest",),
        onnx=("Resize",),
        onnxruntime=ORT_OWN,
        uint8=True,
    ),
    # ST Edge AI Core 2.1 reports of MoveNet Lightning on the STM32N6 list its Resize bilinear layers as
    # software epochs (Politecnico di Milano STM32N6 case studies,
    # giacomocolosio02.github.io/stm32n6-docs/casestudies_page.html).
    OpSpec(
        "RESIZE_BILINEAR",
        "resize:ResizeBilinear",
        "resize",
        M55,
        LAYER,
        "resize_nearest_model",
        3,
        placement=_st("bilinear Resize is SW_FLOAT (and in MoveNet's ST reports)"),
        fuzz=("resize_bilinear",),
        onnx=("Resize",),
        uint8=True,
    ),
    # -- data movement and shapes ----------------------------------------------------------------
    OpSpec(
        "RESHAPE",
        "movement:Reshape",
        "movement",
        NPU,
        RESHAPE,
        "reshape_model",
        1,
        placement="ST table (reshape)",
        fuzz=("reshape",),
        onnx=("Reshape", "Flatten", "Squeeze", "Unsqueeze"),
        onnxruntime=ORT_OWN,
        uint8=True,
    ),
    OpSpec(
        "SQUEEZE",
        "shapes:Squeeze",
        "movement",
        NPU,
        RESHAPE,
        "squeeze_model",
        1,
        placement=_st("Squeeze"),
        fuzz=("squeeze",),
        onnxruntime=ORT_OWN,
        uint8=True,
    ),
    OpSpec(
        "EXPAND_DIMS",
        "shapes:ExpandDims",
        "movement",
        NPU,
        RESHAPE,
        "expand_dims_model",
        1,
        placement=_st("Unsqueeze"),
        fuzz=("expand_dims",),
        onnxruntime=ORT_OWN,
        uint8=True,
    ),
    OpSpec(
        "SHAPE",
        "shapes:Shape",
        "movement",
        M55,
        LAYER,
        "shape_model",
        1,
        placement="int32 output: the NPU runs int8 only",
        fuzz=("shape_reshape",),
        onnxruntime=ORT_OWN,
        uint8=True,
    ),
    OpSpec(
        "PAD",
        "movement:Pad",
        "movement",
        NPU,
        PAD_TAKEN,
        "pad_model",
        2,
        placement="ST table (padding)",
        fuzz=("pad",),
        onnx=("Pad",),
        onnxruntime=ORT_OWN,
        uint8=True,
    ),
    OpSpec(
        "PADV2",
        "movement:Pad",
        "movement",
        NPU,
        PAD_TAKEN,
        "pad_model",
        2,
        placement="ST table (padding)",
        fuzz=("padv2",),
        onnx=("Pad",),
        onnxruntime=ORT_OWN,
        uint8=True,
    ),
    OpSpec(
        "TRANSPOSE",
        "movement:Transpose",
        "movement",
        NPU,
        LAYER,
        "transpose_model",
        2,
        placement="ST table (limited transpose; rank <= 4, see placement())",
        fuzz=("transpose",),
        onnxruntime=ORT_OWN,
        uint8=True,
    ),
    OpSpec(
        "CONCATENATION",
        "movement:Concatenation",
        "movement",
        NPU,
        CONCAT,
        "concat_model",
        2,
        placement="ST table (concatenation)",
        fuzz=("concat", "concat_two_inputs"),
        onnx=("Concat", "QLinearConcat"),
        onnxruntime=ORT_OWN,
        uint8=True,
    ),
    OpSpec(
        "STRIDED_SLICE",
        "strided_slice:StridedSlice",
        "movement",
        NPU,
        STRIDED_READ,
        "strided_slice_model",
        2,
        placement=_STREAM,
        fuzz=("strided_slice",),
        onnx=("Slice",),
        onnxruntime=ORT_OWN,
        uint8=True,
    ),
    OpSpec(
        "SLICE",
        "shapes:Slice",
        "movement",
        NPU,
        STRIDED_READ,
        "slice_model",
        2,
        placement=_STREAM,
        fuzz=("slice",),
        onnxruntime=ORT_OWN,
        uint8=True,
    ),
    OpSpec(
        "SPLIT",
        "split:Split",
        "movement",
        NPU,
        STRIDED_READ,
        "split_model",
        2,
        placement=_STREAM,
        fuzz=("split",),
        onnxruntime=ORT_OWN,
        uint8=True,
    ),
    OpSpec(
        "SPLIT_V",
        "split:SplitV",
        "movement",
        NPU,
        STRIDED_READ,
        "split_v_model",
        2,
        placement=_STREAM,
        fuzz=("split_v",),
        onnx=("Split",),
        onnxruntime=ORT_OWN,
        uint8=True,
    ),
    OpSpec(
        "PACK",
        "pack:Pack",
        "movement",
        NPU,
        LAYER,
        "pack_model",
        2,
        placement="ASSUMPTION: stream-engine data movement, as CONCATENATION (not in the digest)",
        fuzz=("pack",),
        onnxruntime=ORT_OWN,
        uint8=True,
    ),
    OpSpec(
        "UNPACK",
        "shapes:Unpack",
        "movement",
        NPU,
        LAYER,
        "unpack_model",
        2,
        placement="ASSUMPTION: stream-engine data movement (not in the digest)",
        fuzz=("unpack",),
        onnxruntime=ORT_OWN,
        uint8=True,
    ),
    OpSpec(
        "TILE",
        "shapes:Tile",
        "movement",
        M55,
        LAYER,
        "tile_model",
        1,
        placement="ASSUMPTION: software epoch (not in the digest)",
        fuzz=("tile",),
        onnxruntime=ORT_OWN,
        uint8=True,
    ),
    OpSpec(
        "GATHER",
        "shapes:Gather",
        "movement",
        M55,
        LAYER,
        "gather_model",
        2,
        placement=_st("Gather is SW_FLOAT"),
        fuzz=("gather",),
        onnxruntime=ORT_OWN,
        uint8=True,
    ),
    # -- quantization at the graph edges ---------------------------------------------------------
    OpSpec(
        "QUANTIZE",
        "quantize:Quantize",
        "quantize",
        M55,
        LAYER,
        "quantize_model",
        2,
        placement=_st("QuantizeLinear at the float boundary is SW_FLOAT"),
        fuzz=("quantize_float", "quantize_uint8", "quantize_int8"),
        onnxruntime=ORT_OWN,
        uint8=True,
    ),
    OpSpec(
        "DEQUANTIZE",
        "quantize:Dequantize",
        "quantize",
        M55,
        LAYER,
        "dequantize_model",
        2,
        placement=_st("DequantizeLinear is SW_FLOAT (and in ST validate reports)"),
        fuzz=("dequantize",),
        onnxruntime=ORT_OWN,
        uint8=True,
    ),
)


def kinds(**fields) -> frozenset:
    """The kinds whose entries have the given field values: kinds(unit=NPU), kinds(mac=True)."""
    return frozenset(k for k, s in REGISTRY.items() if all(getattr(s, f) == v for f, v in fields.items()))


# The multiply-accumulate layers on a MAC engine, in the registry's order.
MAC_OPS = tuple(k for k, s in REGISTRY.items() if s.mac)
