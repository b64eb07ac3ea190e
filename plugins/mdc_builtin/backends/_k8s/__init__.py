"""The helpers the Kubernetes backends share (kubernetes, jobset, leaderworkerset, pytorchjob,
trainjob, kuberay); :mod:`.common` is the one module those backends import. Not a plugin:
no entry point names this package."""
