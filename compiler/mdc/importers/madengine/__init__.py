"""madengine's additional-context JSON as an mdc spec.

madengine (ROCm/madengine) reads one JSON object, its *additional context*
(``--additional-context-file``), merges its presets into it and renders launch
scripts from the result. :func:`translate` turns that object into an mdc spec
that keeps madengine's meaning: the deployment target (``k8s``/``kubernetes`` ->
the kubernetes backend, ``slurm`` -> slurm, neither -> local), the launcher and
its per-target default, the node and GPU counts from the keys madengine reads on
that target, the rendezvous port (``launcher.master_port`` on Kubernetes,
``distributed.port`` on SLURM, 29500 otherwise), and the environment its preset
layers add. Every key that is not carried over unchanged gets a warning saying
what happened to it and why, located at the key in the madengine file; the
returned document's source map points every mdc value at the madengine key it
came from, so later schema and plan errors land in the JSON too.

Warnings (the report): MDC500 dropped, MDC501 not a madengine key, MDC502 a
value mdc needs that madengine takes from elsewhere (a placeholder to edit),
MDC503 a madengine default applied, MDC504 reinterpreted, MDC505 a madengine
bug mdc does not copy. Errors (madengine refuses these too): MDC530 both
``k8s`` and ``slurm``, MDC531 ``deploy`` contradicts the blocks, MDC532 a block
that must be an object is not, MDC533 not a madengine context at all.

The modules: :mod:`.tables` (madengine's keys, presets and why keys are dropped),
:mod:`.builder` (the spec, its source map and the report), :mod:`.detection` (is this
a madengine context), :mod:`.translation` (the entry point and the order of the steps),
whose steps are :mod:`.context` (the blocks, nulls and unknown keys every step reads),
:mod:`.resolution` (target, vendor, name, launcher, counts), :mod:`.launch` ([job], the
master port, the launcher's tables), :mod:`.backends` ([kubernetes], [slurm]),
:mod:`.environment` ([job] env) and :mod:`.leftovers` (the report on the keys left),
and :mod:`.render` (the spec as text). The command, ``mdc import madengine``, is
:mod:`mdc.cli.import_madengine`.
"""

from __future__ import annotations

from .detection import detect
from .render import render_spec
from .translation import translate

__all__ = ["detect", "render_spec", "translate"]
