"""One module per operator; KERNELS maps the TFLite builtin name to its prepared kernel class, as
the registry (npusim/registry.py) declares it."""

from ..registry import MAC_OPS, REGISTRY

KERNELS = {kind: spec.kernel_class() for kind, spec in REGISTRY.items()}

# The multiply-accumulate layers: their weights may carry a leading group axis (many weight
# versions in one call), they run on a MAC engine (engines/backend.py) and on the NPU's conv
# accelerators.
__all__ = ["KERNELS", "MAC_OPS"]
