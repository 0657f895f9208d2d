"""Test configuration: hypothesis profiles and the tests directory on sys.path (for oracle, cases).

HYPOTHESIS_PROFILE=npusim (default): derandomized, no example database written into the repo, so
`make test` is reproducible. HYPOTHESIS_PROFILE=random: fresh random examples on every run.
NPUSIM_TEST_SCALE=k multiplies the number of examples of the op tests (e.g. 10 for a deeper run).
"""
import os
import sys

from hypothesis import HealthCheck, settings

sys.path.insert(0, os.path.dirname(__file__))

_common = dict(database=None, deadline=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("npusim", derandomize=True, **_common)
settings.register_profile("random", **_common)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "npusim"))
