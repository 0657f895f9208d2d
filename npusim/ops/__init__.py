"""One module per operator; KERNELS maps the TFLite builtin name to its prepared kernel class, as
the registry (npusim/registry.py) declares it."""

from collections.abc import Mapping

from ..registry import MAC_OPS, REGISTRY


class _Kernels(Mapping):
    """Every registered op's kernel class, its module imported on first lookup: a model loads the
    modules (and Numba kernels) of its own ops only, a one-shot run does not pay for the rest."""

    def __init__(self):
        self._classes = {}

    def __getitem__(self, kind):
        if kind not in self._classes:
            self._classes[kind] = REGISTRY[kind].kernel_class()  # KeyError for an unknown op
        return self._classes[kind]

    def __contains__(self, kind):
        return kind in REGISTRY

    def __iter__(self):
        return iter(REGISTRY)

    def __len__(self):
        return len(REGISTRY)


KERNELS = _Kernels()

# The multiply-accumulate layers: their weights may carry a leading group axis (many weight
# versions in one call), they run on a MAC engine (kernels/backend.py) and on the NPU's conv
# accelerators.
__all__ = ["KERNELS", "MAC_OPS"]
