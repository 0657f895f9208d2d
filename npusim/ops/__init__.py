"""One module per operator; KERNELS maps the TFLite builtin name to its prepared kernel class."""

from .activations import HardSwish, LeakyRelu, Tanh
from .add import Add
from .batch_matmul import BatchMatMul
from .conv import Conv2D
from .depthwise import DepthwiseConv2D
from .fully_connected import FullyConnected
from .logistic import Logistic
from .mean import Mean
from .minmax import Maximum, Minimum
from .movement import Concatenation, Pad, Reshape, Transpose
from .mul import Mul
from .pack import Pack
from .pool import AveragePool2D, MaxPool2D
from .prelu import Prelu
from .quantize import Dequantize, Quantize
from .reduce import ReduceMax, Sum
from .resize import ResizeBilinear, ResizeNearestNeighbor
from .shapes import ExpandDims, Gather, Shape, Slice, Squeeze, Tile, Unpack
from .softmax import Softmax
from .split import Split, SplitV
from .strided_slice import StridedSlice
from .sub import Sub
from .transpose_conv import TransposeConv

KERNELS = {
    k.kind: k
    for k in (
        Add,
        AveragePool2D,
        BatchMatMul,
        Concatenation,
        Conv2D,
        DepthwiseConv2D,
        Dequantize,
        ExpandDims,
        FullyConnected,
        Gather,
        HardSwish,
        LeakyRelu,
        Logistic,
        MaxPool2D,
        Maximum,
        Mean,
        Minimum,
        Mul,
        Pack,
        Pad,
        Prelu,
        Quantize,
        ReduceMax,
        Reshape,
        ResizeBilinear,
        ResizeNearestNeighbor,
        Shape,
        Slice,
        Softmax,
        Split,
        SplitV,
        Squeeze,
        StridedSlice,
        Sub,
        Sum,
        Tanh,
        Tile,
        Transpose,
        TransposeConv,
        Unpack,
    )
}
KERNELS["PADV2"] = Pad

# The multiply-accumulate layers: their weights may carry a leading group axis (many weight
# versions in one call), they run on a MAC engine (engines/backend.py) and on the NPU's conv accelerators.
MAC_OPS = (Conv2D.kind, DepthwiseConv2D.kind, FullyConnected.kind)
