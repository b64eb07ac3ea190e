"""Offline validation of Kubernetes documents (no cluster), shared by the k8s backend tests.

- Built-in kinds (Job, Service, ConfigMap, ...): the strict JSON schemas that the
  ``kubernetes-validate`` wheel ships, used with ``jsonschema`` directly so that
  every error is collected (its own ``validate()`` stops at the first).
- Custom resources: the served version's ``openAPIV3Schema`` of the CRD in
  ``<CRDS>/<group>/<Kind>.yaml`` (``tests.tools.CRD_PLACES``: $MDC_CRDS or
  ``../shared/crds`` beside the checkout), made
  strict the way the apiserver is with strict field validation: every object
  that has ``properties`` is closed, a required field that has a default counts
  as present, ``nullable`` allows null, int-or-string allows both, and list-map
  keys must be unique.

Import it from a test::

    from tests.integration.k8s.validate import validate_builtin, validate_custom, validate_document
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Iterator, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from referencing import Registry, Resource
from tests.tools import CRD_PLACES

#: the CRDs, found as tests/conftest.py's shared_crds fixture finds them (this module is
#: imported outside pytest's fixtures too)
CRDS = next((p for p in CRD_PLACES if p.is_dir()), CRD_PLACES[0])
#: the oldest Kubernetes version mdc's manifests must validate against
OLDEST = "1.30"


def schema_root() -> Path:
    """The wheel's ``kubernetes-json-schema`` directory."""
    return Path(str(resources.files("kubernetes_validate").joinpath("kubernetes-json-schema")))


def builtin_versions() -> list[str]:
    """Every ``X.Y`` the wheel has strict schemas for, oldest first."""
    found = []
    for entry in schema_root().iterdir():
        match = re.fullmatch(r"v(\d+)\.(\d+)\.0-local-strict", entry.name)
        if match:
            found.append((int(match.group(1)), int(match.group(2))))
    return [f"{a}.{b}" for a, b in sorted(found)]


def newest() -> str:
    """The newest Kubernetes version the wheel ships schemas for."""
    return builtin_versions()[-1]


@functools.cache
def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def builtin_schema_path(doc: Mapping[str, Any], version: str) -> Path:
    """The strict schema file for ``doc``'s kind and apiVersion (``batch/v1`` -> ``batch-v1``)."""
    api = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", str(doc.get("apiVersion", "")))
    return (
        schema_root()
        / f"v{version}.0-local-strict"
        / f"{str(doc.get('kind', '')).lower()}-{api}.json"
    )


def is_builtin(doc: Mapping[str, Any], version: str = OLDEST) -> bool:
    """A kind the wheel has a schema for, and no CRD (``batch.volcano.sh/v1alpha1`` Job is one)."""
    group = str(doc.get("apiVersion", "")).rpartition("/")[0]
    if "." in group and not group.endswith(".k8s.io") or group.endswith(".x-k8s.io"):
        return False
    return builtin_schema_path(doc, version).is_file()


def _path(error: jsonschema.ValidationError) -> str:
    return ".".join(str(p) for p in error.absolute_path) or "<root>"


def validate_builtin(doc: Mapping[str, Any], version: str) -> list[str]:
    """Every error of ``doc`` against the strict schema of Kubernetes ``version`` (``"1.30"``)."""
    path = builtin_schema_path(doc, version)
    if not path.is_file():
        return [
            (
                f"no schema for kind {doc.get('kind')!r} apiVersion {doc.get('apiVersion')!r} "
                f"in Kubernetes {version}"
            )
        ]
    validator = _builtin_validator(path)
    return sorted(f"{_path(e)}: {e.message}" for e in validator.iter_errors(doc))


@functools.cache
def _builtin_validator(path: Path) -> Any:
    schema = _read_json(path)
    definitions = _read_json(path.parent / "_definitions.json")
    registry: Registry[Any] = Resource.from_contents(schema) @ Registry()
    registry = Resource.from_contents(definitions) @ registry
    return jsonschema.Draft202012Validator(schema, registry=registry)


# ---------------------------------------------------------------- custom resources


def crd_path(doc: Mapping[str, Any]) -> Path:
    group = str(doc.get("apiVersion", "")).rpartition("/")[0]
    return CRDS / group / f"{doc.get('kind')}.yaml"


@functools.cache
def _crd(path: Path) -> Any:
    return yaml.load(
        path.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    )


def _strict(schema: Any) -> Any:
    """The apiserver's structural schema as strict JSON Schema (see the module docstring)."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {
        k: _strict(v) for k, v in schema.items() if k not in ("properties", "default", "example")
    }
    if "properties" in schema:
        props = {k: _strict(v) for k, v in schema["properties"].items()}
        if schema.get("x-kubernetes-embedded-resource"):
            for key in ("apiVersion", "kind", "metadata"):
                props.setdefault(key, {})
        out["properties"] = props
        if "additionalProperties" not in schema and not schema.get(
            "x-kubernetes-preserve-unknown-fields"
        ):
            out["additionalProperties"] = False
        defaults = {
            k for k, v in schema["properties"].items() if isinstance(v, dict) and "default" in v
        }
        if "required" in schema:
            out["required"] = [r for r in schema["required"] if r not in defaults]
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["type"] = ["integer", "string"]
    if schema.get("nullable") and "type" in out:
        kinds = out["type"] if isinstance(out["type"], list) else [out["type"]]
        out["type"] = [*kinds, "null"]
    return out


def _list_map_keys(validator: Any, keys: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if not isinstance(instance, list) or schema.get("x-kubernetes-list-type") != "map":
        return
    seen: set[str] = set()
    for item in instance:
        if not isinstance(item, dict):
            continue
        key = json.dumps([item.get(k) for k in keys])
        if key in seen:
            yield jsonschema.ValidationError(
                f"duplicate list-map key {dict(zip(keys, json.loads(key), strict=True))}"
            )
        seen.add(key)


def _set_items(validator: Any, kind: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if kind == "set" and isinstance(instance, list):
        texts = [json.dumps(i, sort_keys=True) for i in instance]
        if len(set(texts)) != len(texts):
            yield jsonschema.ValidationError("duplicate entries in a set list")


StrictValidator = jsonschema.validators.extend(  # type: ignore[no-untyped-call]
    jsonschema.Draft202012Validator,
    {"x-kubernetes-list-map-keys": _list_map_keys, "x-kubernetes-list-type": _set_items},
)


def custom_schema(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    """The strict schema of the served version ``doc`` names, or None (no such CRD/version)."""
    path = crd_path(doc)
    if not path.is_file():
        return None
    return _custom_schema(path, str(doc.get("apiVersion", "")).rpartition("/")[2])


@functools.cache
def _custom_validator(path: Path, version: str) -> Any:
    return StrictValidator(_custom_schema(path, version))


@functools.cache
def _custom_schema(path: Path, version: str) -> dict[str, Any] | None:
    for entry in _crd(path)["spec"]["versions"]:
        if entry["name"] == version and entry.get("served", False):
            schema = copy.deepcopy(entry["schema"]["openAPIV3Schema"])
            strict: dict[str, Any] = _strict(schema)
            return strict
    return None


def validate_custom(doc: Mapping[str, Any]) -> list[str]:
    """Every error of a custom resource against its CRD's served version (strict, see above)."""
    schema = custom_schema(doc)
    if schema is None:
        return [
            (
                f"no served CRD version for kind {doc.get('kind')!r} apiVersion "
                f"{doc.get('apiVersion')!r} under {CRDS}"
            )
        ]
    validator = _custom_validator(crd_path(doc), str(doc.get("apiVersion", "")).rpartition("/")[2])
    errors = [f"{_path(e)}: {e.message}" for e in validator.iter_errors(doc)]
    meta = doc.get("metadata")
    if not isinstance(meta, dict) or not meta.get("name"):
        errors.append("metadata.name: is required")
    return sorted(errors)


def validate_document(doc: Mapping[str, Any], versions: tuple[str, ...] = ()) -> list[str]:
    """Built-in kinds against every version in ``versions`` (default: 1.30 and the newest),
    other kinds against their CRD; each error prefixed with kind/name (and version)."""
    name = f"{doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"
    if is_builtin(doc):
        return [
            f"{name} [{v}] {e}"
            for v in (versions or (OLDEST, newest()))
            for e in validate_builtin(doc, v)
        ]
    return [f"{name} {e}" for e in validate_custom(doc)]


def kubelet_env(entries: list[dict[str, Any]], namespace: str = "default") -> dict[str, str]:
    """A container's ``env`` as its process sees it: the downward API's ``metadata.namespace``
    resolved, and ``$(NAME)`` in a value replaced by an earlier entry's value (the kubelet's
    dependent environment variables; an unknown name is left as written)."""
    out: dict[str, str] = {}
    for entry in entries:
        if "valueFrom" in entry:
            path = entry["valueFrom"]["fieldRef"]["fieldPath"]
            assert path == "metadata.namespace", entry
            out[entry["name"]] = namespace
        else:
            out[entry["name"]] = re.sub(
                r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                lambda m: out.get(m.group(1), m.group(0)),
                entry["value"],
            )
    return out
