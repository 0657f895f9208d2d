"""How each ST Edge AI version requantizes a convolution's 16-bit CONVACC output to int8: one object
per compiler family (`--n6-compiler`, N6Options.compiler), so no other module asks for a version.

* 3.0 (the readable trace, tests/test_neural_art_trace.py): one per-channel ARITH "off_bias",
  A[c] = round(M[c] 2^T) with M[c] = float32(s_x s_w[c]) / s_y, shift_o = T - S, BC[c] at shift_o
  (neural_art.bc_vector).
* 2.1 and 2.2 (the shared 2.1 compile's blobs, tests/test_ec_blob.py): two ARITHs.
  - "mul_scale", per channel: A1[c] = round(a[c] 2^e1), a[c] = s_x * s_w[c] in float32, e1 the
    largest shift keeping every A1 within int16; no B or C; 16-bit output, rounded and saturated;
    shift s1 = e1 + e2 - 20 - S.
  - "off_bias": the scalar A2 = round(2^e2 / s_y), e2 the shift normalising it to int16, written per
    channel, with the per-channel BC[c] at shift 20 (the bias rule of 3.0 at shift 20), 8-bit output;
    a bias-free layer's off_bias is one scalar ARITH (A_scalar A2, BC = z_y << 20).
  So A1 A2 / 2^(S + s1 + 20) = M[c] to the coefficients' rounding, and the 16-bit intermediate
  rounds and saturates: a value 3.0 keeps exact. Found on 186 of 186 conv layers of the 2.1
  compile: every field exact on every layer and channel (tests/test_ec_blob.py).
"""

from __future__ import annotations

import numpy as np

A2_SHIFT = 20  # the 2.x off_bias's shift_o: 20 on every layer of the shared 2.1 compile


class SingleStage:
    """ST Edge AI 3.0: one per-channel off_bias ARITH."""

    name = "3.0"

    def requantize(self, rule, a, y_scale, s, b_steps, y_zero_point, no_bias) -> list[dict]:
        # s_x * s_w[c] as the compiler holds it, in float32 (the bias scale), then over s_y in double:
        # ST's A on all 12,082 channels of the 3.0 trace (in double, 7 ties x.5 went the other way)
        m = a.astype(np.float32).astype(np.float64) / np.float64(y_scale)
        total = rule.normalised_shift(float(m.max()))  # T: A = M * 2^T fits int16
        shift_o = total - s
        bc = rule.bc(b_steps, shift_o, y_zero_point)
        if no_bias:
            b_sc, c_sc = rule.split_bc(bc[0])
            st = rule.arith(role="off_bias", B_scalar=b_sc, C_scalar=c_sc, vec_precision=[16, 16, 16])
        else:
            st = rule.arith(role="off_bias", C_vector=bc, vec_precision=[16, 16, 32])
        st.update(_per_channel(shift_o, [rule.round(float(v) * 2.0**total) for v in m]))
        return [st]


class TwoStage:
    """ST Edge AI 2.x: a per-channel 16-bit scale A1, then a scalar A2 with a per-channel BC."""

    def __init__(self, name: str):
        self.name = name

    def requantize(self, rule, a, y_scale, s, b_steps, y_zero_point, no_bias) -> list[dict]:
        a32 = a.astype(np.float32).astype(np.float64)  # s_x * s_w[c] as the compiler holds it
        e1 = rule.normalised_shift(float(a32.max()))
        inverse = 1.0 / np.float64(y_scale)
        e2 = rule.normalised_shift(inverse)
        a2 = rule.round(inverse * 2.0**e2)
        channels = len(a32)
        mul = rule.arith(
            role="mul_scale",
            outbytes_o=2,
            B_vector=[0] * channels,
            C_vector=[0] * channels,
            vec_precision=[16, 16, 16],
            combinebc=0,
        )
        mul.update(_per_channel(e1 + e2 - A2_SHIFT - s, [rule.round(float(v) * 2.0**e1) for v in a32]))
        mul["combinebc"] = 0
        bc = rule.bc(b_steps, A2_SHIFT, y_zero_point)
        if no_bias:  # one BC for every channel, and A2 is one value: a scalar ARITH
            b_sc, c_sc = rule.split_bc(bc[0])
            off = rule.arith(
                role="off_bias", A_scalar=a2, B_scalar=b_sc, C_scalar=c_sc, vec_precision=[16, 16, 16]
            )
            off.update(
                scalar=1, dualinput=0, combinebc=1, bcast="ARITH_BCAST_SCALAR", inbytes_x=2, shift_o=A2_SHIFT
            )
        else:
            off = rule.arith(role="off_bias", C_vector=bc, vec_precision=[16, 16, 32])
            off.update(_per_channel(A2_SHIFT, [a2] * channels))
        return [mul, off]


def _per_channel(shift_o: int, a: list[int]) -> dict:
    return {
        "scalar": 0,
        "dualinput": 0,
        "combinebc": 1,
        "bcast": "ARITH_BCAST_CHAN",
        "inbytes_x": 2,
        "shift_o": shift_o,
        "A_vector": a,
    }


COMPILERS = {"3.0": SingleStage(), "2.2": TwoStage("2.2"), "2.1": TwoStage("2.1")}
VERSIONS = tuple(COMPILERS)  # newest first: the default


def compiler(version: str):
    return COMPILERS[version]
