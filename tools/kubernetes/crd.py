"""Validate Kubernetes manifests against CustomResourceDefinition schemas, as the API server would.

A CRD's ``openAPIV3Schema`` is a *structural* schema: OpenAPI v3 keywords plus Kubernetes'
extensions. :func:`validate` checks what the API server checks on create, with strict
field validation (``kubectl apply --validate=strict``, kubectl's default): an unknown
field is an error, not silently pruned. Keywords: ``type`` (``integer`` and ``number``
apart; ``nullable``), ``properties``, ``required``, ``additionalProperties``,
``x-kubernetes-preserve-unknown-fields``, ``x-kubernetes-int-or-string``,
``x-kubernetes-embedded-resource``, ``items``, ``enum``, ``pattern`` (unanchored, as Go's
``MatchString``), ``format`` ``int32``/``int64``, ``minimum``/``maximum``,
``minLength``/``maxLength``, ``minItems``/``maxItems``, ``minProperties``/``maxProperties``,
``x-kubernetes-list-type`` ``set``/``map`` (unique items or keys), and ``allOf``/``anyOf``/
``oneOf``/``not``. ``metadata`` gets the ObjectMeta checks a create needs (a DNS-1123 name,
string labels and annotations). CEL rules (``x-kubernetes-validations``) are not evaluated:
:func:`cel_rules` counts them, so a caller can say so.

Schemas ship as data (:data:`CRDS`, see ``crds/README.md``); :func:`main` re-extracts them
from the CRD files of a checkout.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

CRDS = Path(__file__).parent / "crds"
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_META_FIELDS = {"name", "namespace", "labels", "annotations", "generateName", "finalizers", "ownerReferences"}
_INT_RANGE = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}


class SchemaNotFound(KeyError):
    """No shipped schema for a document's apiVersion and kind."""


def load_schema(api_version: str, kind: str, folder: Path = CRDS) -> dict[str, Any]:
    """The shipped ``openAPIV3Schema`` of ``kind`` in ``api_version`` (``group/version``).

    Raises:
        SchemaNotFound: none shipped; the message lists those that are.
    """
    known = []
    for path in sorted(folder.glob("*.json.gz")):
        entry = json.loads(gzip.decompress(path.read_bytes()))
        known.append(f"{entry['group']}/{entry['version']} {entry['kind']}")
        if f"{entry['group']}/{entry['version']}" == api_version and entry["kind"] == kind:
            return dict(entry["schema"])
    raise SchemaNotFound(f"no schema for {api_version} {kind}; shipped: {', '.join(known)}")


def validate(document: Any, schema: Mapping[str, Any], path: str = "") -> list[str]:
    """Every violation of ``schema`` in ``document``, as ``path: what is wrong`` lines (empty: valid)."""
    errors: list[str] = []
    _check(document, schema, path or ".", errors, top=not path)
    return errors


def validate_manifest(document: Mapping[str, Any], folder: Path = CRDS) -> list[str]:
    """Validate one manifest against the shipped schema of its ``apiVersion`` and ``kind``."""
    schema = load_schema(str(document.get("apiVersion")), str(document.get("kind")), folder)
    return validate(document, schema)


def cel_rules(schema: Any) -> int:
    """How many ``x-kubernetes-validations`` rules the schema holds (not evaluated here)."""
    if isinstance(schema, Mapping):
        own = len(schema.get("x-kubernetes-validations", []))
        return own + sum(cel_rules(value) for key, value in schema.items() if key != "x-kubernetes-validations")
    if isinstance(schema, list):
        return sum(cel_rules(value) for value in schema)
    return 0


def documents(path: Path) -> Iterator[dict[str, Any]]:
    """The YAML documents of a manifest file (empty ones skipped)."""
    with path.open() as stream:
        for doc in yaml.safe_load_all(stream):
            if doc:
                yield doc


# -- the checks ---------------------------------------------------------------------------------

def _check(value: Any, schema: Mapping[str, Any], path: str, errors: list[str], *, top: bool = False) -> None:
    if value is None:
        if not schema.get("nullable"):
            errors.append(f"{path}: null is not allowed")
        return
    if not _type_ok(value, schema, path, errors):
        return
    for keyword, checker in _KEYWORDS.items():
        if keyword in schema:
            checker(value, schema, path, errors)
    if isinstance(value, dict):
        _check_object(value, schema, path, errors, top=top)
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            _check(item, schema["items"], f"{path}[{i}]", errors)


def _type_ok(value: Any, schema: Mapping[str, Any], path: str, errors: list[str]) -> bool:
    if schema.get("x-kubernetes-int-or-string"):
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            errors.append(f"{path}: {value!r} is not an integer or a string")
            return False
        return True
    want = schema.get("type")
    if want is None:
        return True
    ok = {
        "object": isinstance(value, dict),
        "array": isinstance(value, list),
        "string": isinstance(value, str),
        "boolean": isinstance(value, bool),
        "integer": isinstance(value, int) and not isinstance(value, bool),
        "number": isinstance(value, (int, float)) and not isinstance(value, bool),
    }.get(want, True)
    if not ok:
        errors.append(f"{path}: {value!r} is a {type(value).__name__}, the schema wants {want}")
    return ok


def _check_object(value: dict[str, Any], schema: Mapping[str, Any], path: str, errors: list[str], *,
                  top: bool) -> None:
    properties = schema.get("properties", {})
    for name in schema.get("required", []):
        if name not in value:
            errors.append(f"{_join(path, name)}: required, missing")
    extra = schema.get("additionalProperties")
    embedded = schema.get("x-kubernetes-embedded-resource")
    for name, item in value.items():
        where = _join(path, name)
        if top and name == "metadata":
            _check_metadata(item, where, errors)
            continue
        if name in properties:
            _check(item, properties[name], where, errors)
        elif isinstance(extra, Mapping):
            _check(item, extra, where, errors)
        elif (extra is True or schema.get("x-kubernetes-preserve-unknown-fields")
              or embedded and name in ("apiVersion", "kind", "metadata")):
            continue
        elif properties or extra is False or schema.get("type") == "object":
            known = ", ".join(sorted(properties)) or "none"
            errors.append(f"{where}: unknown field {name!r} (known here: {known})")


def _check_metadata(meta: Any, path: str, errors: list[str]) -> None:
    if not isinstance(meta, dict):
        errors.append(f"{path}: metadata must be an object")
        return
    for name in sorted(set(meta) - _META_FIELDS):
        errors.append(f"{_join(path, name)}: unknown field {name!r} in metadata")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        errors.append(f"{_join(path, 'name')}: required, missing")
    elif len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        errors.append(f"{_join(path, 'name')}: {name!r} is not a DNS-1123 subdomain (lower case, digits, '-', '.')")
    for key in ("labels", "annotations"):
        entries = meta.get(key, {})
        if not isinstance(entries, dict) or not all(isinstance(v, str) for v in entries.values()):
            errors.append(f"{_join(path, key)}: must map strings to strings (quote numbers and booleans)")


def _enum(value: Any, schema: Mapping[str, Any], path: str, errors: list[str]) -> None:
    if value not in schema["enum"]:
        errors.append(f"{path}: {value!r} is not one of {schema['enum']}")


def _pattern(value: Any, schema: Mapping[str, Any], path: str, errors: list[str]) -> None:
    if isinstance(value, str) and not re.search(schema["pattern"], value):
        errors.append(f"{path}: {value!r} does not match {schema['pattern']!r}")


def _format(value: Any, schema: Mapping[str, Any], path: str, errors: list[str]) -> None:
    low_high = _INT_RANGE.get(schema["format"])
    if low_high and isinstance(value, int) and not isinstance(value, bool) and not low_high[0] <= value <= low_high[1]:
        errors.append(f"{path}: {value} is outside {schema['format']}")


def _bound(keyword: str, test: Any, measure: Any, words: str) -> Any:
    def check(value: Any, schema: Mapping[str, Any], path: str, errors: list[str]) -> None:
        size = measure(value)
        if size is not None and not test(size, schema[keyword]):
            errors.append(f"{path}: {words} {schema[keyword]} ({size})")
    return check


def _number(value: Any) -> float | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _list_type(value: Any, schema: Mapping[str, Any], path: str, errors: list[str]) -> None:
    if not isinstance(value, list):
        return
    kind = schema["x-kubernetes-list-type"]
    if kind == "set":
        seen = [json.dumps(item, sort_keys=True) for item in value]
        if len(set(seen)) != len(seen):
            errors.append(f"{path}: a set with repeated items")
    elif kind == "map":
        keys = schema.get("x-kubernetes-list-map-keys", [])
        seen = [tuple(str(item.get(k)) for k in keys) for item in value if isinstance(item, dict)]
        if len(set(seen)) != len(seen):
            errors.append(f"{path}: items repeat the key {keys}")


def _all_of(value: Any, schema: Mapping[str, Any], path: str, errors: list[str]) -> None:
    for sub in schema["allOf"]:
        _check_constraints(value, sub, path, errors)


def _any_of(value: Any, schema: Mapping[str, Any], path: str, errors: list[str]) -> None:
    if not any(not _constraint_errors(value, sub, path) for sub in schema["anyOf"]):
        errors.append(f"{path}: {value!r} matches none of anyOf {schema['anyOf']}")


def _one_of(value: Any, schema: Mapping[str, Any], path: str, errors: list[str]) -> None:
    matched = sum(1 for sub in schema["oneOf"] if not _constraint_errors(value, sub, path))
    if matched != 1:
        errors.append(f"{path}: {value!r} matches {matched} of oneOf, not exactly 1")


def _not(value: Any, schema: Mapping[str, Any], path: str, errors: list[str]) -> None:
    if not _constraint_errors(value, schema["not"], path):
        errors.append(f"{path}: {value!r} matches what 'not' forbids")


def _constraint_errors(value: Any, schema: Mapping[str, Any], path: str) -> list[str]:
    """Errors of a value against a structural schema's value constraints (anyOf branches may
    not declare fields or types of their own beyond the enclosing schema's; they may test them)."""
    found: list[str] = []
    _check_constraints(value, schema, path, found)
    return found


def _check_constraints(value: Any, schema: Mapping[str, Any], path: str, errors: list[str]) -> None:
    if "type" in schema and not _type_ok(value, schema, path, errors):
        return
    for keyword, checker in _KEYWORDS.items():
        if keyword in schema:
            checker(value, schema, path, errors)
    if isinstance(value, dict):
        for name in schema.get("required", []):
            if name not in value:
                errors.append(f"{_join(path, name)}: required, missing")


_KEYWORDS: dict[str, Any] = {
    "enum": _enum,
    "pattern": _pattern,
    "format": _format,
    "minLength": _bound("minLength", lambda n, b: n >= b, lambda v: len(v) if isinstance(v, str) else None,
                        "shorter than minLength"),
    "maxLength": _bound("maxLength", lambda n, b: n <= b, lambda v: len(v) if isinstance(v, str) else None,
                        "longer than maxLength"),
    "minItems": _bound("minItems", lambda n, b: n >= b, lambda v: len(v) if isinstance(v, list) else None,
                       "fewer items than minItems"),
    "maxItems": _bound("maxItems", lambda n, b: n <= b, lambda v: len(v) if isinstance(v, list) else None,
                       "more items than maxItems"),
    "minProperties": _bound("minProperties", lambda n, b: n >= b, lambda v: len(v) if isinstance(v, dict) else None,
                            "fewer fields than minProperties"),
    "maxProperties": _bound("maxProperties", lambda n, b: n <= b, lambda v: len(v) if isinstance(v, dict) else None,
                            "more fields than maxProperties"),
    "minimum": _bound("minimum", lambda n, b: n >= b, _number, "below minimum"),
    "maximum": _bound("maximum", lambda n, b: n <= b, _number, "above maximum"),
    "x-kubernetes-list-type": _list_type,
    "allOf": _all_of,
    "anyOf": _any_of,
    "oneOf": _one_of,
    "not": _not,
}


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path != "." else f".{name}"


# -- extracting the schemas from a checkout ------------------------------------------------------

def extract(crd_text: str, *, source: Mapping[str, str]) -> dict[str, Any]:
    """The served storage version's schema of a CRD file's text, with where it came from."""
    crd = next(doc for doc in yaml.safe_load_all(crd_text) if doc)
    version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
    return {"group": crd["spec"]["group"], "kind": crd["spec"]["names"]["kind"], "version": version["name"],
            "source": dict(source), "schema": version["schema"]["openAPIV3Schema"]}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tools.kubernetes.crd CHECKOUT REPOSITORY COMMIT PATH...``: (re)write the shipped schemas."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("checkout", type=Path, help="a git checkout (or bare repository) of the CRDs' project")
    parser.add_argument("repository", help="its name, e.g. kubeflow/mpi-operator")
    parser.add_argument("commit", help="the commit to read the files at")
    parser.add_argument("paths", nargs="+", help="CRD files in the repository")
    parser.add_argument("--out", type=Path, default=CRDS)
    args = parser.parse_args(argv)
    import subprocess

    for path in args.paths:
        text = subprocess.run(["git", "-C", str(args.checkout), "show", f"{args.commit}:{path}"], check=True,
                              capture_output=True, text=True).stdout
        entry = extract(text, source={"repository": args.repository, "commit": args.commit, "path": path})
        target = args.out / f"{entry['group']}_{entry['version']}_{entry['kind'].lower()}.json.gz"
        data = json.dumps(entry, sort_keys=True, separators=(",", ":")).encode()
        target.write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
        print(f"{target}: {entry['group']}/{entry['version']} {entry['kind']} from {args.repository}@{args.commit[:12]} "
              f"{path} ({cel_rules(entry['schema'])} CEL rules not evaluated)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
