"""The geometry of a sliding-window MAC op (CONV_2D, DEPTHWISE_CONV_2D, and FULLY_CONNECTED as a
1x1 convolution), read once from the op's options at Prepare, as TFLM's OpData holds it. A pool's
window reads the same way (Pool2DOptions name stride and padding alike; no dilation): code outside
the simulator (zo's float ops) computes window geometry from here, not from prepared kernels."""

from __future__ import annotations

from dataclasses import dataclass

from .padding import compute_padding


@dataclass(frozen=True)
class ConvGeometry:
    kh: int
    kw: int
    in_channels: int
    stride: tuple  # (h, w)
    dilation: tuple  # (h, w)
    pad: tuple  # (top, left): the padding before the first row and column
    out_hw: tuple  # (out_h, out_w)

    @classmethod
    def from_options(cls, options: dict, input_shape, kh: int, kw: int) -> ConvGeometry:
        """input_shape [N, H, W, C]; options as tflite_io reads Conv2DOptions or DepthwiseConv2DOptions
        (absent fields take the schema's defaults)."""
        _, h, w, c = input_shape
        stride = (options.get("stride_h", 1), options.get("stride_w", 1))
        dilation = (options.get("dilation_h_factor", 1), options.get("dilation_w_factor", 1))
        out_h, pad_top = compute_padding(h, kh, stride[0], dilation[0], options.get("padding"))
        out_w, pad_left = compute_padding(w, kw, stride[1], dilation[1], options.get("padding"))
        return cls(kh, kw, c, stride, dilation, (pad_top, pad_left), (out_h, out_w))

    @classmethod
    def dense(cls, depth: int) -> ConvGeometry:
        """A matrix product over `depth` as a 1x1 convolution of one pixel per row."""
        return cls(1, 1, depth, (1, 1), (1, 1), (0, 0), (1, 1))

    @property
    def depth(self) -> int:
        """The reduction length: products summed into one accumulator."""
        return self.kh * self.kw * self.in_channels

    @property
    def out_h(self) -> int:
        return self.out_hw[0]

    @property
    def out_w(self) -> int:
        return self.out_hw[1]

    @property
    def pointwise(self) -> bool:
        """1x1, stride 1, no padding: the output pixels are the input pixels."""
        return (self.kh, self.kw, *self.stride, *self.pad) == (1, 1, 1, 1, 0, 0)

    def with_pad(self, pad) -> ConvGeometry:
        return ConvGeometry(
            self.kh, self.kw, self.in_channels, self.stride, self.dilation, tuple(pad), self.out_hw
        )


class SlidingWindow:
    """The geometry's numbers under the names TFLM's OpData gives them, for a kernel that holds a
    ConvGeometry as self.geometry."""

    geometry: ConvGeometry

    @property
    def kh(self) -> int:
        return self.geometry.kh

    @property
    def kw(self) -> int:
        return self.geometry.kw

    @property
    def out_h(self) -> int:
        return self.geometry.out_h

    @property
    def out_w(self) -> int:
        return self.geometry.out_w

    @property
    def pad_top(self) -> int:
        return self.geometry.pad[0]

    @property
    def pad_left(self) -> int:
        return self.geometry.pad[1]


def row_runs(kw: int, dilation_w: int) -> bool:
    """Whether the direct-convolution engines (vnni.py, avx2.py) read each filter row as one tap:
    with no dilation along the width, the kw taps of a row are kw * C contiguous elements of the
    padded copy and kw * C contiguous weights of the filter (whose reduction index is (ky, kx, c)).
    The micro-kernel's loop over taps, which re-derives its rows' addresses at each tap, then runs
    kh times instead of kh * kw (a 3-channel first layer: 3 taps of 3 quads for 9 taps of one), and
    odd C needs no padding channel. A run's last group may read past it into the next pixel, where
    it meets zero weights."""
    return dilation_w == 1 and kw > 1
