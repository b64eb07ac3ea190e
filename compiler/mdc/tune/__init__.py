"""mdc tune: search the layouts a spec leaves open, predict each one's throughput, and
choose. :mod:`mdc.tune.flops` counts model FLOPs, :mod:`mdc.tune.perf` predicts a step by
adding up the terms of :mod:`mdc.tune.terms` (constants in :mod:`mdc.tune.records`, measured
curves through :mod:`mdc.tune.kernels`), :mod:`mdc.tune.search` enumerates and compiles
candidates, :mod:`mdc.tune.report` prints.
"""
