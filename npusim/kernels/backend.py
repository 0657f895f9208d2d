"""The MAC engines that run CONV_2D and FULLY_CONNECTED, behind one interface.

Every engine computes the same exact int32 sums and the same output stage, so the choice changes
speed, never a bit of the result:
- amx: AMX-INT8 tiles (amx.py), for convolutions whose output rows hold 16 pixels or more;
- vnni: AVX-512 VNNI (vnni.py), for any reduction of at most vnni.MAX_DEPTH products;
- avx2: VPMADDWD on int16-widened operands (avx2.py), for any reduction of at most avx2.MAX_DEPTH
  products, on every x86 CPU with AVX2 (an AVX-512 host included);
- blas: im2col and an exact float32 GEMM (gemm.py), on every host and for any shape.

A selection is an engine and the ones after it in that order, which take the shapes it cannot run:
"amx" is AMX where it applies, then VNNI, AVX2, BLAS; "vnni" is VNNI, then AVX2, BLAS; "avx2" is AVX2,
then BLAS; "blas" is BLAS alone. "auto" starts at the first engine this host runs, skipping those
that the environment excludes (NPUSIM_AMX=0, NPUSIM_VNNI=0, NPUSIM_AVX2=0; read when a selection is
made, not at import).

DEPTHWISE_CONV_2D has no reduction for an engine, but its vector code follows the selection too
(Selection.depthwise_variant): its VNNI form where the selection holds an engine that runs VNNI
(amx, vnni), its AVX2 form on "avx2", else the generic form, as a host without either runs it (so
"blas" runs no VNNI instruction at all, and tests can hold each form to TFLM in one process).
"""

from __future__ import annotations

import functools
import os

from ..errors import NpusimError
from . import amx, avx2, gemm, host, vnni
from .geometry import ConvGeometry


class Backend:
    """One MAC engine. convolve: x [N, H, W, C] int8, w [G, O, kh, kw, C] int8 (G weight groups, see
    conv.py), bias [G or 1, O] or None, stage an OutputStage, profile the rounding profile id;
    shared: every group reads the whole batch; workspace an aligned.Workspace and memo a
    base.WeightMemo (each or None). Returns int8 [G * P, O], P output pixels per group."""

    name = ""
    env_switch = ""  # an environment variable that, set to 0, leaves this engine out of "auto"
    module = None  # amx, vnni or avx2: its convolve takes the parts of the geometry (stride, ...)

    def available(self) -> bool:
        """Whether this host runs the engine (detected once, see host.py)."""
        return True

    def usable(self, g: ConvGeometry) -> bool:
        return True

    def runs_vnni(self) -> bool:
        """Whether a selection with this engine may run AVX-512 VNNI code outside the engines too (the
        vector code of DEPTHWISE_CONV_2D): the engine uses VNNI, or needs a CPU that has it."""
        return False

    def runs_avx2(self) -> bool:
        """As runs_vnni, for AVX2 code."""
        return False

    def convolve(
        self,
        g: ConvGeometry,
        x,
        w,
        bias,
        input_zero_point,
        stage,
        profile,
        shared=False,
        workspace=None,
        memo=None,
    ):
        return self.module.convolve(
            x,
            w,
            bias,
            input_zero_point,
            g.stride,
            g.dilation,
            g.pad,
            g.out_hw,
            stage,
            profile,
            shared,
            workspace,
            memo,
        )


class AmxBackend(Backend):
    name, env_switch, module = "amx", "NPUSIM_AMX", amx

    def available(self) -> bool:
        return host.has_amx()

    def runs_vnni(self) -> bool:
        return host.has_vnni()  # every CPU with AMX-INT8 has it; asked all the same

    def usable(self, g: ConvGeometry) -> bool:
        # amx.convolve runs a pointwise convolution over whole images as rows (if C needs no padding).
        row_pixels = g.out_h * g.out_w if g.pointwise and g.in_channels % 4 == 0 else g.out_w
        return amx.usable(g.depth, g.in_channels, row_pixels)


class DirectBackend(Backend):
    """An engine of the direct-convolution micro-kernel (microkernel.py) on one ISA: any reduction
    of at most module.MAX_DEPTH products."""

    def usable(self, g: ConvGeometry) -> bool:
        return g.depth <= self.module.MAX_DEPTH


class VnniBackend(DirectBackend):
    name, env_switch, module = "vnni", "NPUSIM_VNNI", vnni

    def available(self) -> bool:
        return host.has_vnni()

    runs_vnni = available


class Avx2Backend(DirectBackend):
    name, env_switch, module = "avx2", "NPUSIM_AVX2", avx2

    def available(self) -> bool:
        return host.has_avx2()

    runs_avx2 = available


class BlasBackend(Backend):
    name = "blas"

    def convolve(
        self, g, x, w, bias, input_zero_point, stage, profile, shared=False, workspace=None, memo=None
    ):
        return gemm.convolve(x, w, bias, input_zero_point, g, stage, profile, shared)


BACKENDS = (AmxBackend(), VnniBackend(), Avx2Backend(), BlasBackend())  # in order of preference
NAMES = ("auto",) + tuple(b.name for b in BACKENDS)


class Selection:
    """The engines an interpreter may use, in order: each op runs on the first that suits its shape."""

    def __init__(self, backends):
        self.backends = tuple(backends)

    @property
    def name(self) -> str:
        return self.backends[0].name

    def runs_vnni(self) -> bool:
        """Whether ops outside the engines (DEPTHWISE_CONV_2D) take their VNNI form: "blas" holds
        them to their generic vector code, as a host without VNNI runs it."""
        return any(b.runs_vnni() for b in self.backends)

    def depthwise_variant(self) -> str:
        """The form of DEPTHWISE_CONV_2D's vector code (depthwise.VARIANTS) on this selection: the
        widest instructions that one of its engines runs."""
        if self.runs_vnni():
            return "vnni"
        return "avx2" if any(b.runs_avx2() for b in self.backends) else "generic"

    def for_geometry(self, g: ConvGeometry) -> Backend:
        return next(b for b in self.backends if b.usable(g))  # blas, last in every selection, runs any shape

    def __repr__(self):
        return f"Selection({', '.join(b.name for b in self.backends)})"


def _excluded(b: Backend) -> bool:
    return bool(b.env_switch) and os.environ.get(b.env_switch, "1") == "0"


@functools.cache
def _auto(excluded: frozenset) -> Selection:
    return Selection(b for b in BACKENDS if b.name not in excluded and b.available())


def select(name: str = "auto") -> Selection:
    """The Selection for "auto" or an engine's name (which must run on this host)."""
    if name == "auto":
        return _auto(frozenset(b.name for b in BACKENDS if _excluded(b)))
    names = [b.name for b in BACKENDS]
    if name not in names:
        raise NpusimError(f"backend {name!r} is not known, expected one of {', '.join(NAMES)}")
    first = BACKENDS[names.index(name)]
    if not first.available():
        raise NpusimError(f"backend {name!r} does not run on this host (see npusim/kernels/host.py)")
    return Selection(b for b in BACKENDS[names.index(name) :] if b.available())
