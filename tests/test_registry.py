"""The op registry (npusim/registry.py): every registered op declares everything it has, and the
places that used to keep their own op lists (KERNELS, the STM32N6 placement and fusion sets, the
oracle's op versions, the fuzz seeds, the docs' op lists) read it.

Each entry also says how --profile onnxruntime runs the op (branch `onnx-ort`, profiles/ort_kernels.py).

Every op has its float form (branch `validate`; tests/test_float_forms.py checks them against
LiteRT): FLOAT_FORM_NOT_YET stays empty, and an op added without one fails here.

The ONNX lowerings are the table of branch `onnx` (npusim/formats/onnx/table.py, LOWERINGS: ONNX op type ->
Rule(lowering, kinds it may emit)). Each entry names the ONNX types whose lowering produces it
(copied from that table); NO_ONNX_LOWERING lists, with the reason, the kinds no ONNX type lowers
to. test_onnx_lowerings_match_the_importer_table holds both to the table once it is importable
(skipped, saying so, on a branch without npusim/formats/onnx): every declared type exists and emits the
kind, every type of the table is declared by a kind it emits, every kind it emits is registered.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from ai_edge_litert import schema_py_generated as schema

from npusim import registry as R
from npusim.ops.base import Kernel

# Not yet (see the module docstring): none since branch `validate` gave every op its float form.
FLOAT_FORM_NOT_YET = frozenset()
# The kinds no ONNX op type lowers to (npusim/formats/onnx/table.py); a lowering added for one moves it out.
NO_ONNX_LOWERING = frozenset(
    {
        # no ONNX lowering in the importer yet
        "TRANSPOSE_CONV", "PRELU", "TANH", "SUM", "REDUCE_MAX", "SHAPE", "TILE", "GATHER",
        # ONNX's Squeeze, Unsqueeze and Split lower to RESHAPE and SPLIT_V; Slice to STRIDED_SLICE
        "SQUEEZE", "EXPAND_DIMS", "SLICE", "SPLIT", "PACK", "UNPACK",
        # QuantizeLinear and DequantizeLinear are read by the importer's walk (importer.py), not the table
        "QUANTIZE", "DEQUANTIZE",
        # ONNX's Transpose becomes a layout of the tensor (its lowering emits only a requantization);
        # TRANSPOSE is what other lowerings emit to change an input's layout
        "TRANSPOSE",
    }
)

SPECS = list(R.REGISTRY.values())
_OPERATOR_NAMES = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}


def _ids(specs):
    return [s.kind for s in specs]


@pytest.mark.parametrize("spec", SPECS, ids=_ids(SPECS))
def test_integer_kernel(spec):
    cls = spec.kernel_class()
    assert issubclass(cls, Kernel), spec.kernel
    same_kernel = [s.kind for s in SPECS if s.kernel == spec.kernel]
    assert cls.kind == spec.kind or cls.kind in same_kernel, f"{spec.kernel}.kind is {cls.kind}"


@pytest.mark.parametrize("spec", SPECS, ids=_ids(SPECS))
def test_float_form(spec):
    if spec.kind in FLOAT_FORM_NOT_YET:
        return
    assert spec.float_form() is not None, f"{spec.kernel} has no float_form"


def test_the_exception_sets_name_registered_ops_only():
    assert FLOAT_FORM_NOT_YET <= set(R.REGISTRY) and NO_ONNX_LOWERING <= set(R.REGISTRY)
    # an op with its float form or ONNX lowering declared is out of the set
    assert not {k for k in FLOAT_FORM_NOT_YET if getattr(R.REGISTRY[k].kernel_class(), "float_form", None)}
    assert not {k for k in NO_ONNX_LOWERING if R.REGISTRY[k].onnx}


@pytest.mark.parametrize("spec", SPECS, ids=_ids(SPECS))
def test_onnx_lowering(spec):
    assert isinstance(spec.onnx, tuple) and all(isinstance(t, str) and t for t in spec.onnx)
    if spec.kind not in NO_ONNX_LOWERING:
        assert spec.onnx, f"{spec.kind}: no ONNX op type lowers to it (or list it in NO_ONNX_LOWERING)"


def test_onnx_lowerings_match_the_importer_table():
    table = pytest.importorskip(
        "npusim.formats.onnx.table", reason="no ONNX importer on this branch"
    ).LOWERINGS
    for kind, spec in R.REGISTRY.items():
        for onnx_type in spec.onnx:
            assert onnx_type in table, f"{kind}: {onnx_type} is not in npusim/formats/onnx/table.py"
            assert kind in table[onnx_type].kinds, f"{onnx_type}'s lowering does not emit {kind}"
    for onnx_type, rule in table.items():
        assert set(rule.kinds) <= set(R.REGISTRY), (onnx_type, set(rule.kinds) - set(R.REGISTRY))
        made = set(rule.kinds) - {"QUANTIZE"}  # what it lowers to, beside the requantization it may append
        if made:
            assert any(onnx_type in R.REGISTRY[k].onnx for k in made), f"{onnx_type}: no entry names it"


@pytest.mark.parametrize("spec", SPECS, ids=_ids(SPECS))
def test_onnxruntime_profile_kernel(spec):
    """How --profile onnxruntime runs the op (profiles/ort_kernels.kernel_for): its own kernel (the kinds
    ort_kernels keeps, read from here), a model of ORT's QLinear kernel, or the float form then
    QuantizeLinear, which needs the float form."""
    from npusim.profiles import ort_kernels

    assert spec.onnxruntime in R.ORT_WAYS, spec.onnxruntime
    assert (spec.kind in ort_kernels.KINDS) == (spec.onnxruntime == R.ORT_OWN)
    if spec.onnxruntime == R.ORT_MODEL:
        assert spec.kind in ("AVERAGE_POOL_2D", "MEAN"), "ort_kernels.kernel_for models only these"
    if spec.onnxruntime != R.ORT_OWN:
        assert spec.float_form() is not None, f"{spec.kind}: no float form for FloatThenQuantize"


@pytest.mark.parametrize("spec", SPECS, ids=_ids(SPECS))
def test_placement_and_fusion_class(spec):
    assert spec.unit in (R.NPU, R.M55) and spec.placement.strip()
    assert spec.fusion in R.FUSION_CLASSES
    assert spec.unit == R.NPU or spec.fusion == R.LAYER, "an M55 op is a software epoch: a layer"
    assert not spec.conv_accelerator or spec.unit == R.NPU
    assert spec.family in R.FAMILIES


@pytest.mark.parametrize("spec", SPECS, ids=_ids(SPECS))
def test_oracle_builder_and_version(spec):
    from npusim.testing import oracle

    assert callable(getattr(oracle, spec.oracle, None)), f"no builder oracle.{spec.oracle}"
    assert isinstance(spec.version, int) and spec.version >= 1
    assert oracle._OP_VERSIONS[spec.kind] == spec.version


def test_builder_refuses_an_unregistered_op_without_its_version():
    from npusim.testing.oracle import ModelBuilder

    b = ModelBuilder()
    x = b.add_tensor((1, 4), np.int8, 0.1, 0)
    with pytest.raises(ValueError, match="ABS is not in npusim's registry"):
        b.add_op("ABS", [x], [x])
    b.add_op("ABS", [x], [x], version=1)  # an unsupported op for a refusal test: its version given


def _ops_in(model: bytes) -> list[tuple[str, int, list]]:
    """(kind, opcode version, input dtypes) of each op of a flatbuffer."""
    m = schema.ModelT.InitFromPackedBuf(model, 0)
    tensors = m.subgraphs[0].tensors
    out = []
    for op in m.subgraphs[0].operators:
        code = m.operatorCodes[op.opcodeIndex]
        kind = _OPERATOR_NAMES[max(code.builtinCode, code.deprecatedBuiltinCode)]
        out.append((kind, code.version, [tensors[i].type for i in op.inputs if i >= 0]))
    return out


@pytest.fixture(scope="module")
def fuzz_seeds():
    from test_fuzz import generated_seeds

    return {name: _ops_in(model) for name, model in generated_seeds().items()}


@pytest.mark.parametrize("spec", SPECS, ids=_ids(SPECS))
def test_fuzz_seeds(spec, fuzz_seeds):
    """Each named seed exists and holds the op at the registry's version (so the builder writes that
    version too); an op with a 16x8 path has a seed that runs it on int16 activations."""
    assert spec.fuzz, f"{spec.kind}: no fuzz seed"
    int16_seen = False
    for name in spec.fuzz:
        assert name in fuzz_seeds, f"{spec.kind}: no fuzz seed {name!r} in tests/test_fuzz.py"
        found = [(v, types) for kind, v, types in fuzz_seeds[name] if kind == spec.kind]
        assert found, f"fuzz seed {name!r} has no {spec.kind}"
        assert all(v == spec.version for v, _ in found), (name, found)
        int16_seen |= any(schema.TensorType.INT16 in types for _, types in found)
    assert int16_seen == spec.int16, f"{spec.kind}: int16={spec.int16}, int16 seed: {int16_seen}"


def test_every_fuzz_seed_op_is_registered(fuzz_seeds):
    seen = {kind for ops in fuzz_seeds.values() for kind, _, _ in ops}
    assert seen <= set(R.REGISTRY), seen - set(R.REGISTRY)


def test_kernels_and_mac_ops_come_from_the_registry():
    from npusim.npu import cost, fusion
    from npusim.ops import KERNELS, MAC_OPS

    assert set(KERNELS) == set(R.REGISTRY)
    assert MAC_OPS == ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED")
    assert set(cost.NPU_KIND_SOURCES) | set(cost.M55_KIND_SOURCES) == set(R.REGISTRY)
    assert fusion.CHAINABLE_KINDS == R.kinds(fusion=R.CHAIN)


def test_reading_the_registry_is_cheap():
    code = (
        "import json, sys; import npusim.registry as r; "
        "heavy = sorted(m for m in ('numba', 'numpy', 'npusim.ops') if m in sys.modules); "
        "print(json.dumps([len(r.REGISTRY), heavy]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    n, heavy = json.loads(done.stdout)
    assert n == len(R.REGISTRY) and heavy == [], heavy


def test_the_docs_op_lists_are_current():
    from experiments.tables import op_lists

    assert op_lists.stale() == [], "run `make op-lists` (python -m experiments.tables.op_lists)"
    assert all(k in op_lists.readme_block() for k in R.REGISTRY)


def test_the_uint8_kinds_are_test_uint8s():
    """The registry's uint8=True entries (what a uint8 model may hold, npusim/runtime/uint8.py) are
    exactly the kinds tests/test_uint8.py proves against LiteRT."""
    from test_uint8 import PROVEN

    assert R.kinds(uint8=True) == PROVEN, (R.kinds(uint8=True) ^ PROVEN)
