"""Hypothesis profiles of the fuzz tier: ``ci`` (bounded, the default) and ``deep``.

``pytest tests/fuzz`` runs the ``ci`` profile: a fixed, derandomized set of examples per
property, the whole directory within about three minutes on two cores.
``pytest tests/fuzz --hypothesis-profile=deep`` runs :data:`DEEP_EXAMPLES` random examples per
property.

Hypothesis registers a profile of its own named ``ci`` and loads it when it sees a CI
variable (``CI``, ``GITHUB_ACTIONS``, ...). The ``ci`` registered here replaces it (hypothesis
applies a re-registered active profile at once) with the same values hypothesis's own has
(100 examples, derandomized, no database, no deadline, too_slow not a failure), so the other
tiers run exactly as they would without this file. The fuzz tests do not rely on which profile
happens to be active: they take their settings from ``fuzz_settings()`` in each test module, which is ``deep``
only when that profile was asked for and ``ci`` otherwise, whether or not CI is set.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

#: examples per property in the ci profile (the fuzz tier's share of the CI time)
CI_EXAMPLES = 100
#: examples per property in the deep profile
DEEP_EXAMPLES = 10_000

settings.register_profile(
    "ci",
    max_examples=CI_EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "deep",
    max_examples=DEEP_EXAMPLES,
    derandomize=False,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
