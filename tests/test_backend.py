"""The MAC backend selection (npusim/kernels/backend.py): what "auto" and each name choose, and that
an op runs on the engine chosen for its geometry; DEPTHWISE_CONV_2D's vector code follows it."""

from __future__ import annotations

import numpy as np
import pytest

import npusim
from npusim.kernels import backend, depthwise, host
from npusim.kernels.geometry import ConvGeometry
from npusim.testing import oracle as O

import cases as C


def conv_model(hw=20, cin=16, cout=16, k=3) -> bytes:
    rng = np.random.default_rng(0)
    w = rng.integers(-127, 128, (cout, k, k, cin), dtype=np.int8)
    return O.conv2d_model((1, hw, hw, cin), w, None, 0.05, -3, 0.01, 0.5, 2)


def test_names_and_fallbacks():
    assert [b.name for b in backend.BACKENDS] == ["amx", "vnni", "avx2", "blas"]
    assert backend.select("blas").backends == (backend.BACKENDS[3],)
    with pytest.raises(npusim.NpusimError, match="not known"):
        backend.select("gpu")
    if host.has_vnni():
        assert [b.name for b in backend.select("vnni").backends] == ["vnni", "avx2", "blas"]
        assert backend.select().name in ("amx", "vnni")
    else:
        with pytest.raises(npusim.NpusimError, match="does not run on this host"):
            backend.select("vnni")
        assert backend.select().name == ("avx2" if host.has_avx2() else "blas")
    if host.has_avx2():
        assert [b.name for b in backend.select("avx2").backends] == ["avx2", "blas"]
    else:
        with pytest.raises(npusim.NpusimError, match="does not run on this host"):
            backend.select("avx2")


def test_environment_excludes_from_auto(monkeypatch):
    monkeypatch.setenv("NPUSIM_AMX", "0")
    monkeypatch.setenv("NPUSIM_VNNI", "0")
    monkeypatch.setenv("NPUSIM_AVX2", "0")
    assert backend.select().name == "blas"
    monkeypatch.delenv("NPUSIM_AVX2")
    assert backend.select().name == ("avx2" if host.has_avx2() else "blas")
    monkeypatch.delenv("NPUSIM_VNNI")
    assert backend.select().name == ("vnni" if host.has_vnni() else "avx2" if host.has_avx2() else "blas")


NO_VNNI = pytest.mark.skipif(not host.has_vnni(), reason="no VNNI")
NO_AVX2 = pytest.mark.skipif(not host.has_avx2(), reason="no AVX2")


@pytest.mark.parametrize(
    "name", ["blas", pytest.param("vnni", marks=NO_VNNI), pytest.param("avx2", marks=NO_AVX2)]
)
def test_interpreter_runs_on_the_chosen_engine(name):
    model = conv_model()
    sim = npusim.Interpreter(model, backend=name)
    assert sim.kernels[0].engine.name == name
    x = np.random.default_rng(1).integers(-128, 128, (3, 20, 20, 16), dtype=np.int8)
    O.assert_same(npusim.Interpreter(model, backend="blas").run(x), sim.run(x), f"{name} against blas")


def test_geometry_from_options():
    g = ConvGeometry.from_options({"stride_h": 2, "stride_w": 1, "padding": "SAME"}, (1, 9, 8, 5), 3, 3)
    assert (g.out_hw, g.pad, g.depth, g.pointwise) == ((5, 8), (1, 1), 45, False)
    assert ConvGeometry.dense(7).pointwise and ConvGeometry.dense(7).depth == 7
    assert not backend.AmxBackend().usable(ConvGeometry.dense(64))  # rows of one pixel: never AMX


@pytest.mark.parametrize(
    "name",
    ["auto", "blas", pytest.param("vnni", marks=NO_VNNI), pytest.param("avx2", marks=NO_AVX2)],
)
def test_depthwise_vector_code_follows_the_selection(name):
    """DEPTHWISE_CONV_2D takes its VNNI form where the selection has an engine that runs VNNI, its
    AVX2 form where the widest engine runs AVX2, the generic one on "blas"; the bits are the same
    (the oracle tests hold each form to TFLM)."""
    case = C.depthwise_case(32, (5, 9), (1, 1))
    sim = npusim.Interpreter(case.model, backend=name)
    (dw,) = [k for k in sim.kernels if k.kind == "DEPTHWISE_CONV_2D"]
    vnni = name in ("auto", "vnni") and host.has_vnni()
    avx2 = not vnni and name in ("auto", "avx2") and host.has_avx2()
    assert sim.backends.runs_vnni() == vnni
    assert dw.variant == ("vnni" if vnni else "avx2" if avx2 else "generic")
    O.assert_same(O.run_tflm(case.model, case.xs), sim.run(case.xs), f"{name}: {case.desc}")


def test_depthwise_variants_have_their_own_cache_entries():
    """Numba's cache is keyed by qualified name: each variant, serial and threaded, has its own."""
    variants = ["generic"] + (["vnni"] if host.has_vnni() else []) + (["avx2"] if host.has_avx2() else [])
    kernels = [depthwise.depthwise_kernel(v) for v in variants]
    names = [f.py_func.__qualname__ for k in kernels for f in (k.serial, k.threaded)]
    assert len(set(names)) == len(names) == 2 * len(variants)
    # the vector run (interior and border stages) is compiled per variant, with its instructions
    stages = [k.serial.py_func.__globals__["vector_run"] for k in kernels]
    assert len({id(s.py_func.__globals__["tap_quads_run"]) for s in stages}) == len(variants)
    if not host.has_vnni():
        with pytest.raises(npusim.NpusimError, match="does not run on this host"):
            depthwise.depthwise_kernel("vnni")
    if not host.has_avx2():
        with pytest.raises(npusim.NpusimError, match="does not run on this host"):
            depthwise.depthwise_kernel("avx2")


@pytest.mark.parametrize("name", ["vnni", "avx2"])
def test_a_convolution_takes_threads_by_its_multiply_adds(name, monkeypatch):
    """The direct-convolution kernels pick their threaded form by multiply-adds (microkernel.conv_work),
    not by their largest array: YOLOv8n-256's 16x16x64 3x3 layers at batch 8 have arrays under
    jit.PARALLEL_MIN_WORK elements and 75 MMAC, and ran on one thread. A layer of a few hundred
    multiply-adds stays serial. Both equal TFLM."""
    from npusim.kernels import avx2, jit, vnni

    if not (host.has_vnni() if name == "vnni" else host.has_avx2()):
        pytest.skip(f"this CPU cannot run the {name} engine: its thread choice is NOT tested here")
    kernel = vnni.conv_vnni if name == "vnni" else avx2.conv_avx2
    calls = []
    for form in ("serial", "threaded"):
        compiled = getattr(kernel, form)
        monkeypatch.setattr(kernel, form, lambda *a, f=compiled, form=form: calls.append(form) or f(*a))
    # the subject is the work rule; the cores free under load are tests/test_free_cores.py's
    monkeypatch.setattr(host, "free_cores", lambda: 2)
    rng = np.random.default_rng(1)
    for hw, channels, n, expected in ((16, 64, 8, "threaded"), (4, 8, 1, "serial")):
        w = rng.integers(-127, 128, (channels, 3, 3, channels), dtype=np.int8)
        model = O.conv2d_model((1, hw, hw, channels), w, None, 0.05, -3, 0.01, 0.5, 2)
        x = rng.integers(-128, 128, (n, hw, hw, channels), dtype=np.int8)
        calls.clear()
        got = npusim.Interpreter(model, backend=name, warm=False).run(x)
        assert calls == [expected], (hw, channels, n, calls)
        if expected == "threaded":  # every array of the layer is under the element threshold
            assert n * (hw + 2) ** 2 * channels < jit.PARALLEL_MIN_WORK
        O.assert_same(O.run_tflm(model, x), got, f"{name} {hw}x{hw}x{channels} batch {n}")
