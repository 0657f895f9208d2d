"""Where the tests find ../shared (models and data, never copied into the repository).

NPU_SHARED overrides the default, the folder beside the repository. Tests that need it skip
loudly, naming what is missing, only where it is absent.
"""

import os
from pathlib import Path

import pytest

SHARED = Path(os.environ.get("NPU_SHARED", Path(__file__).resolve().parents[1].parent / "shared"))
RESNET = SHARED / "models" / "resnet8_cifar10_int8.tflite"
MOBILENET = SHARED / "models" / "mobilenet_v2_0.35_128_flowers_int8.tflite"


def need(path: Path) -> str:
    """path as a string, or skip the test loudly when the shared folder does not hold it."""
    if not path.exists():
        pytest.skip(f"SHARED DATA MISSING: {path} not found (set NPU_SHARED to the shared directory)")
    return str(path)
