"""mdc's benchmarks and fits, run from the repository root: ``python -m bench.tune_fit``,
``bench.tune_targets``, ``bench.serving_fit``, ``bench.run``. :mod:`bench.published` builds
the published runs' specs for them and for tests/published."""
