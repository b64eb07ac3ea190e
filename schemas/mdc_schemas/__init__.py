"""mdc's JSON Schemas (draft 2020-12), shipped as package data.

``job.v1.schema.json`` is the core schema; ``plugins/<name>.v1.schema.json``
are the built-in plugins' fragments for their own top-level tables.
"""
