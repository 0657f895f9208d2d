"""docs/layout.md's "Adding a profile", followed: a new profile is one module (its kernel table, a
profiles.Kernels subclass) and one entry in profiles.PROFILES, and the Interpreter then runs it by its
name, asking its table once per op, with no other file touched."""

import importlib
import pickle
import sys
import textwrap

import numpy as np
import pytest

from npusim.profiles import PROFILES, Profile
from npusim.runtime.interpreter import Interpreter
from npusim.testing import oracle as O

# The profile's module: TFLM's arithmetic, but CMSIS-NN's single rounding on the convolutions; the
# other op kinds fall back to the builtin table (each op's own kernel class under this profile).
MODULE = """
from npusim.profiles import PROFILES, Kernels

ASKED = []


class ConvSingle(Kernels):
    def kernel_for(self, kernel_class, op, **extra):
        ASKED.append(op.index)
        if op.kind == "CONV_2D":
            return kernel_class(op, self.graph, PROFILES["single"], **extra)
        return super().kernel_for(kernel_class, op, **extra)
"""


@pytest.fixture
def scratch_profile(tmp_path, monkeypatch):
    (tmp_path / "scratch_profile_kernels.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = Profile(99, "scratch", kernels="scratch_profile_kernels:ConvSingle")  # the one table entry
    monkeypatch.setitem(PROFILES, "scratch", entry)
    yield importlib.import_module("scratch_profile_kernels")
    sys.modules.pop("scratch_profile_kernels", None)


def _conv():
    rng = np.random.default_rng(11)
    w = rng.integers(-127, 128, (6, 3, 3, 4)).astype(np.int8)
    b = rng.integers(-3000, 3000, 6).astype(np.int32)
    return O.conv2d_model((1, 8, 8, 4), w, b, 0.05, -3, rng.uniform(0.001, 0.01, 6), 0.3, 5)


def test_a_new_profile_is_one_module_and_one_table_entry(scratch_profile):
    model = _conv()
    interp = Interpreter(model, profile="scratch", warm=False)
    assert interp.profile == "scratch"
    assert scratch_profile.ASKED == [k.op.index for k in interp.kernels]  # once per op, in plan order
    x = np.random.default_rng(2).integers(-128, 128, (3, 8, 8, 4)).astype(np.int8)
    single = Interpreter(model, profile="single", warm=False).run(x)
    tflm = Interpreter(model, profile="tflm", warm=False).run(x)
    assert np.array_equal(interp.run(x), single)
    assert not np.array_equal(single, tflm)  # the model tells the two roundings apart
    assert pickle.loads(pickle.dumps(PROFILES["scratch"])).fields() == PROFILES["scratch"].fields()


def test_every_table_entry_has_a_kernel_table():
    """Each entry's `kernels` names a Kernels subclass; neural-art's refuses its bare entry (it runs
    as npusim.npu.NeuralArtProfile, the entry with its options)."""
    from npusim import npu
    from npusim.errors import NpusimError
    from npusim.profiles import Kernels

    graph = Interpreter(_conv(), warm=False).graph
    for name, profile in PROFILES.items():
        module, _, cls = profile.kernels.partition(":")
        assert issubclass(getattr(importlib.import_module(module), cls), Kernels), name
        try:
            assert isinstance(profile.table(graph), Kernels), name
        except NpusimError as e:
            assert "NeuralArtProfile" in str(e), name
    assert isinstance(npu.NeuralArtProfile().table(graph), Kernels)


def test_zo_offers_the_profiles_the_table_says_it_trains_on(scratch_profile, monkeypatch):
    """zo train --profile is the table's entries with Profile.zo: a new entry with zo=True is offered
    by zo_profiles() without touching zo; the fixed entries are tflm, single and xnnpack."""
    from npusim.profiles import zo_profiles
    from zo.cli import main

    (option,) = [p for p in main.commands["train"].params if p.name == "profile"]
    assert list(option.type.choices) == zo_profiles() == ["tflm", "single", "xnnpack"]
    assert "scratch" not in zo_profiles()  # the fixture's entry leaves zo at its default, False
    entry = Profile(99, "scratch", kernels="scratch_profile_kernels:ConvSingle", zo=True)
    monkeypatch.setitem(PROFILES, "scratch", entry)
    assert zo_profiles()[-1] == "scratch"
    assert pickle.loads(pickle.dumps(PROFILES["scratch"])).zo is True
