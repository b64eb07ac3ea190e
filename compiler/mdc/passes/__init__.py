"""The compile's semantic passes, one module each, in the order :mod:`mdc.pipeline` runs them:
:mod:`.accelerator` (the catalogue entry and its tensor cores), :mod:`.serving` (whole
servers, [workload], the serving memory estimate), :mod:`.contract` (the plugins' checks,
the launcher's Launch, unread plugin tables) and :mod:`.env` ([job] env values);
:mod:`.calls` attributes a failure in plugin code to its plugin."""
