#!/usr/bin/env python3
"""Writes the JSON schemas that //deploy/k8s:manifests_test validates the manifests against.

Only the kinds the manifests use are written, each as one self-contained Draft 2020-12 schema
(every reachable definition inlined under $defs, descriptions dropped), so the test runs offline
with Debian's python3-jsonschema.

Inputs (nothing is downloaded by this script; see deploy/k8s/schemas/README.md for how the inputs
were obtained):
  --kubernetes_validate_wheel  a kubernetes-validate wheel (PyPI); it ships the Kubernetes
                               OpenAPI schemas converted to JSON schema per release
                               (kubernetes_validate/kubernetes-json-schema/v<ver>-local-strict/);
  --kubernetes_version         which release's schemas to take, e.g. 1.33.0;
  --servicemonitor_crd         prometheus-operator's monitoring.coreos.com_servicemonitors.yaml
                               (a CustomResourceDefinition); its v1 openAPIV3Schema becomes the
                               ServiceMonitor schema, made strict (unknown fields rejected) and
                               with metadata checked as Kubernetes ObjectMeta.

  python3 tools/k8s_schemas/generate_schemas.py \\
      --kubernetes_validate_wheel /tmp/kubernetes_validate-1.37.0-py3-none-any.whl \\
      --kubernetes_version 1.33.0 \\
      --servicemonitor_crd /tmp/monitoring.coreos.com_servicemonitors.yaml \\
      --out deploy/k8s/schemas
"""

import argparse
import copy
import json
import os
import re
import sys
import zipfile

import yaml

# (apiVersion, kind) -> file stem in the kubernetes-validate layout.
KINDS = {
    ("v1", "ConfigMap"): "configmap-v1",
    ("v1", "PersistentVolumeClaim"): "persistentvolumeclaim-v1",
    ("v1", "Service"): "service-v1",
    ("v1", "ServiceAccount"): "serviceaccount-v1",
    ("apps/v1", "Deployment"): "deployment-apps-v1",
    ("rbac.authorization.k8s.io/v1", "Role"): "role-rbac-v1",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "rolebinding-rbac-v1",
}
SERVICEMONITOR_STEM = "servicemonitor-monitoring-v1"
DEFS_REF = re.compile(r"^(?:(?:/api/)?_definitions\.json)?#/\$defs/(.+)$")
DRAFT = "https://json-schema.org/draft/2020-12/schema"


def strip_descriptions(node):
    """Drops 'description' annotations (they are most of the bytes and validate nothing)."""
    if isinstance(node, dict):
        return {k: strip_descriptions(v) for k, v in node.items()
                if not (k == "description" and isinstance(v, str))}
    if isinstance(node, list):
        return [strip_descriptions(v) for v in node]
    return node


def localize(node, needed):
    """Rewrites refs into _definitions.json to local '#/$defs/X', collecting X into needed."""
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            if k == "$ref" and isinstance(v, str):
                m = DEFS_REF.match(v)
                if not m:
                    raise ValueError("unexpected $ref %r" % v)
                needed.append(m.group(1))
                out[k] = "#/$defs/" + m.group(1)
            else:
                out[k] = localize(v, needed)
        return out
    if isinstance(node, list):
        return [localize(v, needed) for v in node]
    return node


def standalone(root, definitions):
    """root with every definition it reaches (transitively) under $defs."""
    needed = []
    schema = localize(root, needed)
    schema.pop("$id", None)
    defs = {}
    while needed:
        name = needed.pop()
        if name in defs:
            continue
        defs[name] = localize(definitions[name], needed)
    schema["$schema"] = DRAFT
    if defs:
        schema["$defs"] = dict(sorted(defs.items()))
    return strip_descriptions(schema)


def strict_crd_schema(node):
    """An openAPIV3Schema made into a JSON schema that rejects unknown fields.

    Kubernetes prunes unknown fields of structural schemas unless x-kubernetes-preserve-unknown-
    fields is set; a manifest carrying them is wrong even though the API server would accept it
    silently, so they are rejected here. 'nullable' becomes a null type alternative.
    """
    if isinstance(node, list):
        return [strict_crd_schema(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if k in ("properties", "patternProperties"):
            out[k] = {name: strict_crd_schema(s) for name, s in v.items()}
        elif k in ("items", "additionalProperties", "not") and isinstance(v, dict):
            out[k] = strict_crd_schema(v)
        elif k in ("allOf", "anyOf", "oneOf"):
            out[k] = [strict_crd_schema(s) for s in v]
        elif k == "nullable" or k.startswith("x-kubernetes-"):
            continue
        else:
            out[k] = v
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if node.get("x-kubernetes-int-or-string") and "type" not in out and "anyOf" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if ("properties" in out and "additionalProperties" not in out
            and not node.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def servicemonitor_schema(crd_path, definitions):
    with open(crd_path) as f:
        crds = [d for d in yaml.safe_load_all(f) if d]
    crd = next(d for d in crds if d.get("kind") == "CustomResourceDefinition"
               and d["spec"]["names"]["kind"] == "ServiceMonitor")
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    schema = strict_crd_schema(copy.deepcopy(version["schema"]["openAPIV3Schema"]))
    group = crd["spec"]["group"]
    schema["properties"]["apiVersion"] = {"type": "string", "enum": [group + "/v1"]}
    schema["properties"]["kind"] = {"type": "string", "enum": ["ServiceMonitor"]}
    schema["properties"]["metadata"] = {
        "$ref": "_definitions.json#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}
    schema["required"] = sorted(set(schema.get("required", [])) | {"apiVersion", "kind", "spec"})
    schema["additionalProperties"] = False
    annotations = crd["metadata"].get("annotations", {})
    provenance = "ServiceMonitor CRD %s/v1, prometheus-operator %s" % (
        group, annotations.get("operator.prometheus.io/version", "unknown"))
    return standalone(schema, definitions), provenance


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubernetes_validate_wheel", required=True)
    parser.add_argument("--kubernetes_version", required=True, help="e.g. 1.33.0")
    parser.add_argument("--servicemonitor_crd", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    prefix = "kubernetes_validate/kubernetes-json-schema/v%s-local-strict/" % (
        args.kubernetes_version)
    with zipfile.ZipFile(args.kubernetes_validate_wheel) as wheel:
        try:
            definitions = json.loads(wheel.read(prefix + "_definitions.json"))["$defs"]
            roots = {key: json.loads(wheel.read(prefix + stem + ".json"))
                     for key, stem in KINDS.items()}
        except KeyError as e:
            sys.exit("generate_schemas: %s not in the wheel (is %s a version it ships?)" % (
                e, args.kubernetes_version))
        wheel_name = os.path.basename(args.kubernetes_validate_wheel)

    os.makedirs(args.out, exist_ok=True)
    index = {"kubernetes_version": args.kubernetes_version, "source": wheel_name, "kinds": {}}
    for (api_version, kind), stem in sorted(KINDS.items(), key=lambda kv: kv[1]):
        write(os.path.join(args.out, stem + ".json"), standalone(roots[(api_version, kind)],
                                                               definitions))
        index["kinds"]["%s/%s" % (api_version, kind)] = stem + ".json"
    sm, provenance = servicemonitor_schema(args.servicemonitor_crd, definitions)
    write(os.path.join(args.out, SERVICEMONITOR_STEM + ".json"), sm)
    index["kinds"]["monitoring.coreos.com/v1/ServiceMonitor"] = SERVICEMONITOR_STEM + ".json"
    index["servicemonitor_source"] = provenance
    write(os.path.join(args.out, "index.json"), index)


def write(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.write("\n")
    print("wrote %s (%d bytes)" % (path, os.path.getsize(path)))


if __name__ == "__main__":
    main()
