"""Pixels -> the model's input tensor, the way the model was trained to see them.

A model was trained on real inputs x = (pixel / 255 - mean) / std per channel (torchvision's
convention); its converter then chose the input quantization to cover the range of x. The mapping
is therefore either given (--mean/--std, or --input-range 0:255 | 0:1 | -1:1) or read back from
the quantization ("auto"): the real interval the input codes cover, (qmin - zp) * scale ..
(qmax - zp) * scale, is matched to [0, 255], [0, 1] or [-1, 1] within one code at each end.

Beyond the value mapping, the data are fitted to the tensor's geometry: resized to its own height
and width (bilinear), reduced to BT.601 luma for a 1-channel input, and transposed for NCHW.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from npusim.graph import Graph

from .data import resize_images
from .errors import ZoError

# --input-range name -> (mean, std) of the torchvision convention, identical for every channel.
RANGES = {"0:255": (0.0, 1.0 / 255.0), "0:1": (0.0, 1.0), "-1:1": (0.5, 0.5)}
INPUT_RANGES = ("auto",) + tuple(RANGES)
LUMA_BT601 = np.array([0.299, 0.587, 0.114])
CODE_LIMITS = {np.dtype(np.int8): (-128, 127), np.dtype(np.uint8): (0, 255)}
SATURATION_WARNING = 0.01  # fraction of a batch's input codes clipped to the dtype's limits


@dataclass(frozen=True)
class ImageInput:
    """The model's image input: its geometry and the quantization that says what its codes mean."""

    name: str
    dtype: np.dtype
    height: int
    width: int
    channels: int
    nchw: bool
    scale: float | None  # of the codes fed to the model (None for a float input)
    zero_point: int
    # The real interval the input can represent: the input's own codes, or for a float input the
    # codes of the QUANTIZE that reads it. None when nothing in the graph says.
    interval: tuple[float, float] | None
    code: float | None  # the real width of one code of that interval

    @classmethod
    def of(cls, graph: Graph) -> ImageInput:
        t = graph.input()
        shape = tuple(t.shape)
        if len(shape) == 4 and shape[3] in (1, 3):
            nchw, (h, w, c) = False, shape[1:]
        elif len(shape) == 4 and shape[1] in (1, 3):
            nchw, (c, h, w) = True, shape[1:]
        else:
            raise ZoError(
                f"model input {t.name!r} has shape {list(shape)}: expected an image, "
                "N x H x W x C or N x C x H x W with 1 or 3 channels"
            )
        dtype = np.dtype(t.dtype)
        if dtype not in CODE_LIMITS and dtype != np.float32:
            raise ZoError(f"model input {t.name!r} has dtype {dtype.name}: expected uint8, int8 or float32")
        quantized = t if dtype in CODE_LIMITS else _quantize_reader(graph)
        interval = code = None
        if quantized is not None and quantized.quant is not None:
            lo, hi = CODE_LIMITS[np.dtype(quantized.dtype)]
            s, zp = float(quantized.scale), quantized.zero_point
            interval, code = ((lo - zp) * s, (hi - zp) * s), s
        return cls(
            t.name,
            dtype,
            int(h),
            int(w),
            int(c),
            nchw,
            float(t.scale) if dtype in CODE_LIMITS and t.quant is not None else None,
            t.zero_point if dtype in CODE_LIMITS else 0,
            interval,
            code,
        )


def _quantize_reader(graph: Graph):
    """The int8/uint8 output of the QUANTIZE that reads a float input, if that is how the graph starts."""
    for op in graph.ops:
        if op.kind == "QUANTIZE" and op.inputs[0] == graph.inputs[0]:
            out = graph.tensors[op.outputs[0]]
            if np.dtype(out.dtype) in CODE_LIMITS:
                return out
    return None


@dataclass(frozen=True)
class InputMapping:
    """pixel in 0..255 -> real input (pixel / 255 - mean) / std, per channel."""

    name: str  # "0:255", "0:1", "-1:1" or "mean/std"
    mean: tuple[float, ...]
    std: tuple[float, ...]
    source: str  # how it was chosen: "auto", "--input-range" or "--mean/--std"

    def real(self, pixels: np.ndarray) -> np.ndarray:
        """pixels [..., C] (any numeric type) -> float64 real input values."""
        mean, std = np.asarray(self.mean), np.asarray(self.std)
        return (pixels.astype(np.float64) / 255.0 - mean) / std

    def interval(self, channels: int) -> tuple[float, float]:
        """The real interval pixels 0..255 map to, over all channels."""
        ends = np.concatenate([self.real(np.zeros(channels)), self.real(np.full(channels, 255.0))])
        return float(ends.min()), float(ends.max())

    def describe(self) -> dict:
        return {"range": self.name, "mean": list(self.mean), "std": list(self.std), "source": self.source}

    def __str__(self) -> str:
        values = lambda v: ",".join(f"{x:g}" for x in v)  # noqa: E731
        what = (
            f"--input-range {self.name}"
            if self.name in RANGES
            else f"--mean {values(self.mean)} --std {values(self.std)}"
        )
        return f"{what} ({self.source})"


def parse_channels(option: str, text: str | None) -> tuple[float, ...] | None:
    if text is None:
        return None
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise ZoError(
            f"{option} {text!r}: expected comma-separated numbers, one per channel (R,G,B)"
        ) from None
    if not all(np.isfinite(values)):
        raise ZoError(f"{option} {text!r}: expected finite numbers")
    return values


def choose_mapping(image: ImageInput, input_range: str = "auto", mean=None, std=None) -> InputMapping:
    """The mapping the options ask for, checked against what the model's input can represent."""
    if input_range not in INPUT_RANGES:
        raise ZoError(f"--input-range {input_range!r}: expected one of {', '.join(INPUT_RANGES)}")
    if (mean is None) != (std is None):
        given, missing = ("--mean", "--std") if std is None else ("--std", "--mean")
        raise ZoError(
            f"{given} given without {missing}: expected both, one value per channel "
            "(torchvision's convention: (pixel/255 - mean) / std)"
        )
    if mean is not None:
        if input_range != "auto":
            raise ZoError(f"--input-range {input_range} and --mean/--std both given: expected one of them")
        for option, values in (("--mean", mean), ("--std", std)):
            if len(values) != image.channels:
                raise ZoError(
                    f"{option} has {len(values)} value(s), expected {image.channels} "
                    f"(model input {image.name!r} has {image.channels} channel(s))"
                )
        if any(s <= 0 for s in std):
            raise ZoError(f"--std {','.join(map(str, std))}: expected positive values")
        return InputMapping("mean/std", tuple(mean), tuple(std), "--mean/--std")
    if input_range != "auto":
        m, s = RANGES[input_range]
        mapping = InputMapping(input_range, (m,) * image.channels, (s,) * image.channels, "--input-range")
        if image.interval is not None and _contradicts(mapping.interval(image.channels), image):
            lo, hi = image.interval
            raise ZoError(
                f"--input-range {input_range} contradicts model input {image.name!r}: its codes cover "
                f"[{lo:.4g}, {hi:.4g}], expected a range that fills it (try --input-range auto)"
            )
        return mapping
    if image.interval is None:
        raise ZoError(
            f"model input {image.name!r} is {image.dtype.name} with no quantization to read its range from: "
            "pass --input-range 0:255|0:1|-1:1 or --mean R,G,B --std R,G,B"
        )
    lo, hi = image.interval
    for name, (m, s) in RANGES.items():
        mapping = InputMapping(name, (m,) * image.channels, (s,) * image.channels, "auto")
        want_lo, want_hi = mapping.interval(image.channels)
        if abs(lo - want_lo) <= image.code and abs(hi - want_hi) <= image.code:
            return mapping
    raise ZoError(
        f"model input {image.name!r} codes cover [{lo:.4g}, {hi:.4g}], which matches none of "
        "[0, 255], [0, 1], [-1, 1]: pass the model's normalization as --mean R,G,B --std R,G,B "
        "or choose --input-range"
    )


def _contradicts(wanted: tuple[float, float], image: ImageInput) -> bool:
    """A range that spills out of the codes' interval by more than a code (saturating the input), or
    fills less than half of it (throwing away more than one bit of the input's resolution)."""
    lo, hi = image.interval
    spills = wanted[0] < lo - image.code or wanted[1] > hi + image.code
    return spills or (wanted[1] - wanted[0]) < 0.5 * (hi - lo)


def quantize_real(
    real: np.ndarray, dtype, scale: float = 1.0, zero_point: int = 0
) -> tuple[np.ndarray, float]:
    """Real values -> codes of dtype (round half away from zero, as TFLite's quantize, then clamp),
    and the fraction of values that were clipped to the dtype's limits. float32 passes through."""
    dtype = np.dtype(dtype)
    if dtype == np.float32:
        return real.astype(np.float32), 0.0
    if dtype not in CODE_LIMITS:
        raise ZoError(f"input dtype {dtype.name}: expected uint8, int8 or float32")
    if not scale > 0:
        raise ZoError(f"input scale {scale}: expected a positive scale")
    # Rounded to 1e-6 first: p / 255 / (1 / 255) must give p, not p - 1e-13, before the half-way test.
    v = np.round(real / scale + zero_point, 6)
    lo, hi = CODE_LIMITS[dtype]
    clipped = float(np.mean((v < lo - 0.5) | (v > hi + 0.5))) if v.size else 0.0
    q = np.sign(v) * np.floor(np.abs(v) + 0.5)
    return np.clip(q, lo, hi).astype(dtype), clipped


def model_inputs(
    x_uint8: np.ndarray, image: ImageInput, mapping: InputMapping, chunk: int = 64
) -> tuple[np.ndarray, float]:
    """uint8 N x H x W x 3 RGB images -> the model input tensor's values, and the clipped fraction.
    In chunks: the real values are float64, 8 bytes a pixel, too many for a whole data set at once;
    and Python handles Ctrl-C only between numpy's calls (a chunk of 256 128x128 images kept it
    waiting 0.3 to 0.6 s on a loaded machine, npusim/app/interrupt.py)."""
    shape = (
        (image.channels, image.height, image.width)
        if image.nchw
        else (image.height, image.width, image.channels)
    )
    codes = np.empty((len(x_uint8),) + shape, dtype=image.dtype)
    clipped = 0.0
    for i in range(0, len(x_uint8), chunk):
        x = resize_images(x_uint8[i : i + chunk], (image.height, image.width))
        pixels = (x @ LUMA_BT601)[..., None] if image.channels == 1 else x
        real = mapping.real(pixels)
        part, fraction = quantize_real(real, image.dtype, image.scale or 1.0, image.zero_point)
        if image.dtype == np.float32 and image.interval is not None:  # clipped by the QUANTIZE behind it
            lo, hi = image.interval
            fraction = float(np.mean((real < lo - image.code / 2) | (real > hi + image.code / 2)))
        codes[i : i + chunk] = part.transpose(0, 3, 1, 2) if image.nchw else part
        clipped += fraction * len(x)
    return codes, clipped / max(len(x_uint8), 1)


def prepare_inputs(
    x_uint8: np.ndarray, graph: Graph, input_range: str = "auto", mean=None, std=None
) -> np.ndarray:
    """uint8 RGB images -> values for graph's input, with the mapping the options choose
    (see choose_mapping)."""
    image = ImageInput.of(graph)
    return model_inputs(x_uint8, image, choose_mapping(image, input_range, mean, std))[0]
