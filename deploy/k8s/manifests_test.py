#!/usr/bin/env python3
"""Validates deploy/k8s offline: every object of the kustomize base (base/) against the JSON
schema of its kind (Kubernetes and the ServiceMonitor CRD, committed under schemas/), the objects
against each other (selectors, ports, probes, RBAC, shutdown timing, GPU requests and --device,
downward API), the Prometheus scrape config and the Grafana dashboard; then every overlay under
overlays/, rendered by `kubectl kustomize`, through the same schema and consistency checks. Each
check is also shown to fail on a deliberately broken copy.

Runs with Debian's python3, python3-yaml and python3-jsonschema and a kubectl with kustomize v4 or
later built in (scripts/setup.sh).
"""

import copy
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import jsonschema
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
BASE = os.path.join(HERE, "base")
OVERLAYS = os.path.join(HERE, "overlays")
WORKER_POOLS = ("prefill", "decode", "encoder")
# Pools whose pods run on a GPU (one each); the vision encoder runs its tower on the CPU.
GPU_POOLS = ("prefill", "decode")

# What each overlay must render: the worker pools it deploys, those on a GPU, the image, the
# starting replicas per pool, kinds it must not contain, and the ReadWriteMany claims mounted on
# the given pools.
OVERLAYS_EXPECTED = {
    "cpu-demo": {
        "worker_pools": ("prefill", "decode"),
        "gpu_pools": (),
        "image": "deepinfer:latest",
        "replicas": {"router": 1, "prefill": 1, "decode": 1},
        "absent_kinds": {"ServiceMonitor", "PersistentVolumeClaim"},
        "rwx_claims": {},
    },
    "gpu": {
        "worker_pools": WORKER_POOLS,
        "gpu_pools": GPU_POOLS,
        "image": "registry.example.com/deepinfer:latest-cuda",
        "replicas": {"router": 1, "prefill": 2, "decode": 4, "encoder": 1},
        "absent_kinds": set(),
        "rwx_claims": {"deepinfer-store": ("prefill", "decode")},
    },
}

# The metric names the dashboard may use (and must all use): what the binaries are to export.
HISTOGRAMS = {
    "deepinfer_time_to_first_token_seconds",
    "deepinfer_inter_token_latency_seconds",
    "deepinfer_e2e_request_latency_seconds",
    "deepinfer_queue_time_seconds",
}
OTHER_METRICS = {
    "deepinfer_requests_total",
    "deepinfer_queue_depth",
    "deepinfer_kv_cache_usage_ratio",
    "deepinfer_prefix_cache_hit_ratio",
    "deepinfer_desired_replicas",
    "deepinfer_actual_replicas",
}


def read_yaml_docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def load_kustomization():
    with open(os.path.join(BASE, "kustomization.yaml")) as f:
        return yaml.safe_load(f)


def load_objects():
    """(file, object) for every object of every resource listed in kustomization.yaml."""
    out = []
    for res in load_kustomization()["resources"]:
        for doc in read_yaml_docs(os.path.join(BASE, res)):
            out.append((res, doc))
    return out


def load_schemas():
    with open(os.path.join(HERE, "schemas", "index.json")) as f:
        index = json.load(f)
    schemas = {}
    for key, name in index["kinds"].items():
        with open(os.path.join(HERE, "schemas", name)) as f:
            schemas[key] = json.load(f)
    return schemas


SCHEMAS = load_schemas()


def kubectl_kustomize(directory):
    """The objects `kubectl kustomize directory` renders. Raises AssertionError with kubectl's
    message when it fails (or is missing, or too old for the base's kustomization fields)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise AssertionError("kubectl not on PATH (%s): scripts/setup.sh installs one" %
                             os.environ.get("PATH"))
    run = subprocess.run([kubectl, "kustomize", directory], capture_output=True, text=True)
    if run.returncode != 0:
        version = subprocess.run([kubectl, "version", "--client"], capture_output=True,
                                 text=True).stdout.strip()
        raise AssertionError("kubectl kustomize %s failed (%s; needs kustomize v4 or later):\n%s"
                             % (directory, version, run.stderr.strip()))
    return [d for d in yaml.safe_load_all(run.stdout) if d is not None]


def copy_tree():
    """A real copy of base/ and overlays/ in a new temporary directory (Bazel's runfiles are
    symlinks, which kustomize's load restrictions reject); returns its path."""
    tmp = tempfile.mkdtemp(prefix="k8s.", dir=os.environ.get("TEST_TMPDIR"))
    for sub in ("base", "overlays"):
        shutil.copytree(os.path.join(HERE, sub), os.path.join(tmp, sub), symlinks=False)
    return tmp


def replica_errors(objects, worker_pools):
    """Each pool's starting replicas must lie within the router's --<pool>_min/max_replicas (else
    its scaler resizes the pool as soon as it starts)."""
    errs = []
    deployments = by_kind(objects, "Deployment")
    router = deployments.get("deepinfer-router")
    args = router["spec"]["template"]["spec"]["containers"][0].get("args", []) if router else []
    for pool in worker_pools:
        d = deployments.get("deepinfer-" + pool)
        lo, hi = flag(args, pool + "_min_replicas"), flag(args, pool + "_max_replicas")
        if d is None or lo is None or hi is None:
            continue
        n = d["spec"].get("replicas", 1)
        if not int(lo) <= n <= int(hi):
            errs.append("Deployment/deepinfer-%s: replicas %d outside the router's "
                        "--%s_min/max_replicas %s..%s" % (pool, n, pool, lo, hi))
    return errs


def schema_errors(obj):
    """Schema violations of one object, each as 'Kind/name: path: message'."""
    key = "%s/%s" % (obj.get("apiVersion"), obj.get("kind"))
    where = "%s/%s" % (obj.get("kind"), (obj.get("metadata") or {}).get("name"))
    if key not in SCHEMAS:
        return ["%s: no schema for %s (schemas/index.json lists %s)" % (
            where, key, sorted(SCHEMAS))]
    validator = jsonschema.Draft202012Validator(SCHEMAS[key])
    errors = []
    for e in sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path)):
        path = ".".join(str(p) for p in e.absolute_path) or "(root)"
        errors.append("%s: %s: %s" % (where, path, e.message))
    return errors


def parse_duration(text):
    """Seconds in an absl/Go duration such as 30s, 2m, 1m30s, 500ms."""
    total, pos = 0.0, 0
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    for m in re.finditer(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text):
        if m.start() != pos:
            raise ValueError("bad duration %r" % text)
        total += float(m.group(1)) * units[m.group(2)]
        pos = m.end()
    if pos != len(text) or not text:
        raise ValueError("bad duration %r" % text)
    return total


def flag(args, name):
    for a in args:
        if a.startswith("--%s=" % name):
            return a.split("=", 1)[1]
    return None


def by_kind(objects, kind):
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def matches(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


def consistency_errors(objects, worker_pools=WORKER_POOLS, gpu_pools=GPU_POOLS):
    """Cross-object problems, one line each. worker_pools: the pools that must be deployed;
    gpu_pools: those whose pods take one GPU each and run --device=cuda (the others must not)."""
    errs = []
    metrics_pools = ("router",) + tuple(worker_pools)
    deployments = by_kind(objects, "Deployment")
    services = by_kind(objects, "Service")
    roles = by_kind(objects, "Role")
    bindings = by_kind(objects, "RoleBinding")
    accounts = by_kind(objects, "ServiceAccount")
    claims = by_kind(objects, "PersistentVolumeClaim")

    for pool in ("router",) + tuple(worker_pools):
        if "deepinfer-" + pool not in deployments:
            errs.append("Deployment/deepinfer-%s: missing" % pool)
    if "deepinfer-router" not in services:
        errs.append("Service/deepinfer-router: missing")

    for name, d in deployments.items():
        where = "Deployment/" + name
        spec = d["spec"]
        pod = spec["template"]["spec"]
        pod_labels = spec["template"]["metadata"].get("labels", {})
        selector = spec["selector"].get("matchLabels", {})
        if not selector or not matches(selector, pod_labels):
            errs.append("%s: selector %s does not match pod labels %s" % (
                where, selector, pod_labels))
        for other_name, other in deployments.items():
            if other_name != name and matches(selector, other["spec"]["template"]["metadata"]
                                              .get("labels", {})):
                errs.append("%s: selector also matches Deployment/%s's pods" % (where, other_name))
        sa = pod.get("serviceAccountName", "default")
        if sa not in accounts:
            errs.append("%s: serviceAccountName %s is not a ServiceAccount here" % (where, sa))
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for v in volumes.values():
            claim = (v.get("persistentVolumeClaim") or {}).get("claimName")
            if claim is not None and claim not in claims:
                errs.append("%s: volume %s claims %s, not a PersistentVolumeClaim here" % (
                    where, v["name"], claim))
        grace = pod.get("terminationGracePeriodSeconds", 30)
        for c in pod["containers"]:
            cw = "%s container %s" % (where, c["name"])
            ports = {p["containerPort"]: p.get("name") for p in c.get("ports", [])}
            port_names = {n for n in ports.values() if n}
            for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
                probe = c.get(probe_name)
                if probe is None:
                    errs.append("%s: no %s" % (cw, probe_name))
                    continue
                if "grpc" not in probe:
                    errs.append("%s: %s is not a grpc probe" % (cw, probe_name))
                    continue
                if probe["grpc"]["port"] not in ports:
                    errs.append("%s: %s port %s is not a declared containerPort %s" % (
                        cw, probe_name, probe["grpc"]["port"], sorted(ports)))
                elif ports[probe["grpc"]["port"]] != "grpc":
                    errs.append("%s: %s probes port %s, not the grpc port" % (
                        cw, probe_name, probe["grpc"]["port"]))
            has_metrics = name in ["deepinfer-" + p for p in metrics_pools]
            if has_metrics and ("metrics" not in port_names or ports.get(9090) != "metrics"):
                errs.append("%s: expected containerPort 9090 named metrics" % cw)
            args = c.get("args", [])
            listen = flag(args, "listen")
            grpc_ports = [p for p, n in ports.items() if n == "grpc"]
            if listen is None or not grpc_ports or listen != "0.0.0.0:%d" % grpc_ports[0]:
                errs.append("%s: --listen=%s does not serve the grpc containerPort %s" % (
                    cw, listen, grpc_ports))
            if has_metrics and flag(args, "metrics_listen") != "0.0.0.0:9090":
                errs.append("%s: --metrics_listen must be 0.0.0.0:9090" % cw)
            for m in c.get("volumeMounts", []):
                if m["name"] not in volumes:
                    errs.append("%s: mounts undeclared volume %s" % (cw, m["name"]))
            drain = flag(args, "drain_timeout")
            if drain is None:
                errs.append("%s: no --drain_timeout" % cw)
            else:
                pre_stop = ((c.get("lifecycle") or {}).get("preStop") or {}).get("sleep", {})
                need = parse_duration(drain) + pre_stop.get("seconds", 0) + 5
                if grace < need:
                    errs.append("%s: terminationGracePeriodSeconds %s < preStop + "
                                "--drain_timeout (%s) + 5s" % (cw, grace, drain))
                live = c.get("livenessProbe") or {}
                if live.get("periodSeconds", 10) * live.get("failureThreshold", 3) <= \
                        parse_duration(drain):
                    errs.append("%s: livenessProbe gives up before --drain_timeout %s ends" % (
                        cw, drain))
            model = flag(args, "model")
            if model is None or not any(model.startswith(m["mountPath"].rstrip("/") + "/")
                                        for m in c.get("volumeMounts", [])):
                errs.append("%s: --model=%s is not under a mounted volume" % (cw, model))
            if name == "deepinfer-router":
                continue
            # Workers.
            gpu_req = c.get("resources", {}).get("requests", {}).get("nvidia.com/gpu")
            gpu_lim = c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
            device = flag(args, "device")
            if name in ["deepinfer-" + p for p in gpu_pools]:
                if gpu_req != 1 or gpu_lim != 1:
                    errs.append("%s: expected nvidia.com/gpu 1 in requests and limits, got "
                                "%s/%s" % (cw, gpu_req, gpu_lim))
                if device != "cuda":
                    errs.append("%s: has a GPU but --device=%s, not cuda" % (cw, device))
            else:
                if gpu_req is not None or gpu_lim is not None:
                    errs.append("%s: runs on the CPU; expected no nvidia.com/gpu, got %s/%s" % (
                        cw, gpu_req, gpu_lim))
                if device not in (None, "cpu"):
                    errs.append("%s: has no GPU but --device=%s" % (cw, device))
            env = {e["name"]: e for e in c.get("env", [])}
            if flag(args, "advertise_host") != "$(POD_IP)":
                errs.append("%s: expected --advertise_host=$(POD_IP)" % cw)
            pod_ip = (env.get("POD_IP", {}).get("valueFrom") or {}).get("fieldRef", {})
            if pod_ip.get("fieldPath") != "status.podIP":
                errs.append("%s: env POD_IP must come from fieldRef status.podIP" % cw)
            for ref in re.findall(r"\$\(([A-Z_]+)\)", " ".join(args)):
                if ref not in env:
                    errs.append("%s: args use $(%s), which env does not define" % (cw, ref))
            router = flag(args, "router") or ""
            host, _, port = router.rpartition(":")
            svc = services.get(host)
            if svc is None or not any(str(p["port"]) == port for p in svc["spec"]["ports"]):
                errs.append("%s: --router=%s is not a Service port here" % (cw, router))

    for name, s in services.items():
        where = "Service/" + name
        sel = s["spec"].get("selector", {})
        targets = [d for d in deployments.values()
                   if sel and matches(sel, d["spec"]["template"]["metadata"].get("labels", {}))]
        if not targets:
            errs.append("%s: selector %s matches no Deployment's pods" % (where, sel))
        for p in s["spec"]["ports"]:
            target = p.get("targetPort", p["port"])
            for d in targets:
                decl = [cp for c in d["spec"]["template"]["spec"]["containers"]
                        for cp in c.get("ports", [])]
                ok = any(cp.get("name") == target if isinstance(target, str)
                         else cp["containerPort"] == target for cp in decl)
                if not ok:
                    errs.append("%s: port %s targets %s, not a containerPort of "
                                "Deployment/%s" % (where, p.get("name"), target,
                                                   d["metadata"]["name"]))
        if name in ["deepinfer-" + p for p in metrics_pools] and \
                "metrics" not in {p.get("name") for p in s["spec"]["ports"]}:
            errs.append("%s: no port named metrics" % where)

    for pool in worker_pools:
        svc = services.get("deepinfer-" + pool)
        if svc is not None and svc["spec"].get("clusterIP") != "None":
            errs.append("Service/deepinfer-%s: expected headless (clusterIP: None)" % pool)

    # RBAC: the router's account may get and patch deployments/scale of every worker pool.
    router = deployments.get("deepinfer-router")
    router_sa = router["spec"]["template"]["spec"].get("serviceAccountName") if router else None
    granted = set()
    for b in bindings.values():
        if not any(s.get("kind") == "ServiceAccount" and s.get("name") == router_sa
                   for s in b.get("subjects", [])):
            continue
        ref = b["roleRef"]
        if ref["kind"] != "Role" or ref["name"] not in roles:
            errs.append("RoleBinding/%s: roleRef %s/%s is not a Role here" % (
                b["metadata"]["name"], ref["kind"], ref["name"]))
            continue
        for rule in roles[ref["name"]].get("rules", []):
            if "apps" not in rule.get("apiGroups", []) and "*" not in rule.get("apiGroups", []):
                continue
            if "deployments/scale" not in rule.get("resources", []):
                continue
            names = rule.get("resourceNames") or ["*"]
            for verb in rule.get("verbs", []):
                for n in names:
                    granted.add((verb, n))
    for pool in worker_pools:
        for verb in ("get", "patch", "update"):
            if (verb, "deepinfer-" + pool) not in granted and (verb, "*") not in granted:
                errs.append("RBAC: ServiceAccount %s may not %s deployments/scale of "
                            "deepinfer-%s" % (router_sa, verb, pool))

    # The router authenticates callers: a tenants file mounted from a Secret, or anonymous access
    # said out loud (the router refuses to start with neither).
    router = deployments.get("deepinfer-router")
    if router is not None:
        pod = router["spec"]["template"]["spec"]
        c = pod["containers"][0]
        args = c.get("args", [])
        tenants = flag(args, "tenants_file")
        if tenants is None and "--allow_anonymous" not in args:
            errs.append("Deployment/deepinfer-router: neither --tenants_file nor --allow_anonymous")
        if tenants is not None:
            volumes = {v["name"]: v for v in pod.get("volumes", [])}
            mounted = [m for m in c.get("volumeMounts", [])
                       if tenants.startswith(m["mountPath"].rstrip("/") + "/")]
            if not mounted or "secret" not in volumes.get(mounted[0]["name"], {}):
                errs.append("Deployment/deepinfer-router: --tenants_file=%s is not on a Secret "
                            "volume" % tenants)

    # ServiceMonitor: selects every Service, each of which has its endpoint port.
    for sm in by_kind(objects, "ServiceMonitor").values():
        sel = sm["spec"]["selector"].get("matchLabels", {})
        picked = [s for s in services.values() if matches(sel, s["metadata"].get("labels", {}))]
        for pool in metrics_pools:
            if "deepinfer-" + pool not in [s["metadata"]["name"] for s in picked]:
                errs.append("ServiceMonitor/%s: does not select Service/deepinfer-%s" % (
                    sm["metadata"]["name"], pool))
        for ep in sm["spec"]["endpoints"]:
            for s in [s for s in picked
                      if s["metadata"]["name"] in ["deepinfer-" + p for p in metrics_pools]]:
                if ep.get("port") not in {p.get("name") for p in s["spec"]["ports"]}:
                    errs.append("ServiceMonitor/%s: endpoint port %s not on Service/%s" % (
                        sm["metadata"]["name"], ep.get("port"), s["metadata"]["name"]))
            if ep.get("path", "/metrics") != "/metrics":
                errs.append("ServiceMonitor/%s: path %s" % (sm["metadata"]["name"],
                                                             ep.get("path")))
    return errs


def dashboard_errors(dash):
    errs = []
    ids = [p.get("id") for p in dash.get("panels", [])]
    if len(ids) != len(set(ids)):
        errs.append("panel ids not unique: %s" % ids)
    used = set()
    for p in dash.get("panels", []):
        if not p.get("targets"):
            errs.append("panel %r: no targets" % p.get("title"))
        for t in p.get("targets", []):
            expr = t.get("expr", "")
            for m in re.findall(r"\bdeepinfer_[a-z0-9_]+", expr):
                base = re.sub(r"_(bucket|sum|count)$", "", m)
                if base in HISTOGRAMS:
                    if not m.endswith("_bucket") or "histogram_quantile" not in expr or \
                            "by (le)" not in expr.replace("by(le)", "by (le)"):
                        errs.append("panel %r: %s should be histogram_quantile over "
                                    "sum by (le) of %s_bucket" % (p.get("title"), m, base))
                    used.add(base)
                elif m in OTHER_METRICS:
                    used.add(m)
                else:
                    errs.append("panel %r: unknown metric %s" % (p.get("title"), m))
    for missing in sorted((HISTOGRAMS | OTHER_METRICS) - used):
        errs.append("no panel shows %s" % missing)
    return errs


class ManifestsTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.objects = [o for _, o in load_objects()]

    def test_kustomization_lists_every_manifest(self):
        kust = load_kustomization()
        listed = set(kust["resources"])
        on_disk = {os.path.basename(p) for p in glob.glob(os.path.join(BASE, "*.yaml"))}
        on_disk.discard("kustomization.yaml")
        self.assertEqual(listed, on_disk)
        for gen in kust.get("configMapGenerator", []):
            for f in gen.get("files", []):
                self.assertTrue(os.path.isfile(os.path.join(BASE, f)), f)

    def test_every_object_matches_its_kind_schema(self):
        kinds = set()
        for res, obj in load_objects():
            kinds.add(obj["kind"])
            self.assertEqual(schema_errors(obj), [], res)
            self.assertNotIn("namespace", obj["metadata"], "%s: keep manifests namespace-"
                             "agnostic" % res)
        self.assertTrue({"Deployment", "Service", "ServiceAccount", "Role", "RoleBinding",
                         "ConfigMap", "PersistentVolumeClaim", "ServiceMonitor"} <= kinds)

    def test_objects_are_consistent(self):
        self.assertEqual(consistency_errors(self.objects), [])

    def test_broken_copy_on_disk_fails_schema(self):
        docs = read_yaml_docs(os.path.join(HERE, "testdata", "broken-router-deployment.yaml"))
        errors = [e for d in docs for e in schema_errors(d)]
        text = "\n".join(errors)
        # A misspelt field, a named port where the grpc probe takes a number, a string count.
        self.assertIn("'containerPorts' was unexpected", text)
        self.assertIn("readinessProbe.grpc.port", text)
        self.assertIn("spec.replicas", text)

    def mutated(self, kind, name, mutate):
        objects = copy.deepcopy(self.objects)
        target = by_kind(objects, kind)[name]
        mutate(target)
        return objects, target

    def test_schema_rejects_wrong_fields(self):
        cases = [
            ("Deployment", "deepinfer-decode",
             lambda d: d["spec"]["template"]["spec"]["containers"][0].update(
                 {"resource": {"limits": {"nvidia.com/gpu": 1}}}), "resource"),
            ("Deployment", "deepinfer-prefill",
             lambda d: d["spec"]["template"]["spec"].update(
                 {"terminationGracePeriodSeconds": "40s"}), "terminationGracePeriodSeconds"),
            ("Service", "deepinfer-router",
             lambda s: s["spec"]["ports"][0].update({"port": "grpc"}), "spec.ports.0.port"),
            ("Role", "deepinfer-router-scaler",
             lambda r: r["rules"][0].update({"verb": ["patch"]}), "rules.0"),
            ("ServiceMonitor", "deepinfer",
             lambda s: s["spec"]["endpoints"][0].update({"portName": "metrics"}),
             "spec.endpoints.0"),
            ("ServiceMonitor", "deepinfer",
             lambda s: s["spec"]["endpoints"][0].update({"scheme": "gopher"}),
             "spec.endpoints.0.scheme"),
            ("ConfigMap", "deepinfer-prometheus-scrape-config",
             lambda c: c.update({"data": {"prometheus.yml": 3}}), "data.prometheus.yml"),
            ("PersistentVolumeClaim", "deepinfer-models",
             lambda c: c["spec"].update({"accessMode": "ReadOnlyMany"}), "spec"),
        ]
        for kind, name, mutate, where in cases:
            with self.subTest(kind=kind, name=name, where=where):
                _, obj = self.mutated(kind, name, mutate)
                errors = schema_errors(obj)
                self.assertTrue(any(where in e for e in errors), errors)

    def test_consistency_checks_catch_each_mistake(self):
        def container(d):
            return d["spec"]["template"]["spec"]["containers"][0]

        def set_arg(d, name, value):
            args = container(d)["args"]
            args[:] = [a for a in args if not a.startswith("--%s=" % name)]
            if value is not None:
                args.append("--%s=%s" % (name, value))

        cases = [
            ("Deployment", "deepinfer-decode",
             lambda d: d["spec"]["template"]["metadata"]["labels"].update(
                 {"app.kubernetes.io/component": "decoder"}), "does not match pod labels"),
            ("Deployment", "deepinfer-prefill",
             lambda d: container(d)["readinessProbe"]["grpc"].update({"port": 50099}),
             "readinessProbe port 50099 is not a declared containerPort"),
            ("Deployment", "deepinfer-router",
             lambda d: container(d)["livenessProbe"]["grpc"].update({"port": 9090}),
             "livenessProbe probes port 9090, not the grpc port"),
            ("Deployment", "deepinfer-router",
             lambda d: container(d)["ports"][0].update({"name": "rpc"}),
             "targets grpc, not a containerPort"),
            ("Service", "deepinfer-prefill",
             lambda s: s["spec"]["ports"][1].update({"targetPort": 9091}),
             "targets 9091, not a containerPort"),
            ("Service", "deepinfer-decode",
             lambda s: s["spec"]["selector"].update({"app.kubernetes.io/component": "dec"}),
             "matches no Deployment"),
            ("Role", "deepinfer-router-scaler",
             lambda r: r["rules"][0].update({"verbs": ["get", "update"]}),
             "may not patch deployments/scale of deepinfer-prefill"),
            ("Role", "deepinfer-router-scaler",
             lambda r: r["rules"][0].update({"resourceNames": ["deepinfer-prefill"]}),
             "may not get deployments/scale of deepinfer-decode"),
            ("RoleBinding", "deepinfer-router-scaler",
             lambda b: b["subjects"][0].update({"name": "default"}),
             "may not patch deployments/scale"),
            ("Deployment", "deepinfer-decode",
             lambda d: d["spec"]["template"]["spec"].update(
                 {"terminationGracePeriodSeconds": 60}),
             "terminationGracePeriodSeconds 60 < preStop + --drain_timeout (120s)"),
            ("Deployment", "deepinfer-router",
             lambda d: set_arg(d, "drain_timeout", "1m"),
             "terminationGracePeriodSeconds 45 < preStop + --drain_timeout (1m)"),
            ("Deployment", "deepinfer-prefill",
             lambda d: container(d)["resources"]["limits"].pop("nvidia.com/gpu"),
             "expected nvidia.com/gpu 1"),
            ("Deployment", "deepinfer-decode",
             lambda d: set_arg(d, "advertise_host", "$(HOSTNAME)"),
             "expected --advertise_host=$(POD_IP)"),
            ("Deployment", "deepinfer-decode",
             lambda d: container(d)["env"][0]["valueFrom"]["fieldRef"].update(
                 {"fieldPath": "status.hostIP"}), "POD_IP must come from fieldRef status.podIP"),
            ("Deployment", "deepinfer-prefill",
             lambda d: set_arg(d, "router", "deepinfer-router:50052"),
             "--router=deepinfer-router:50052 is not a Service port"),
            ("Deployment", "deepinfer-prefill",
             lambda d: set_arg(d, "listen", "0.0.0.0:50051"),
             "does not serve the grpc containerPort"),
            ("Deployment", "deepinfer-decode",
             lambda d: d["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]
             .update({"claimName": "models"}), "claims models, not a PersistentVolumeClaim"),
            ("Deployment", "deepinfer-router",
             lambda d: set_arg(d, "model", "/data/model"), "is not under a mounted volume"),
            ("Deployment", "deepinfer-encoder",
             lambda d: set_arg(d, "metrics_listen", None),
             "--metrics_listen must be 0.0.0.0:9090"),
            ("Deployment", "deepinfer-encoder",
             lambda d: container(d)["ports"].pop(1),
             "expected containerPort 9090 named metrics"),
            ("Service", "deepinfer-encoder",
             lambda s: s["spec"]["ports"].pop(1),
             "Service/deepinfer-encoder: no port named metrics"),
            ("ServiceMonitor", "deepinfer",
             lambda s: s["spec"]["selector"]["matchLabels"].update(
                 {"app.kubernetes.io/component": "prefill"}),
             "does not select Service/deepinfer-encoder"),
            ("Deployment", "deepinfer-encoder",
             lambda d: container(d)["resources"]["limits"].update({"nvidia.com/gpu": 1}),
             "runs on the CPU; expected no nvidia.com/gpu"),
            ("Deployment", "deepinfer-decode",
             lambda d: set_arg(d, "device", "cpu"), "has a GPU but --device=cpu, not cuda"),
            ("Deployment", "deepinfer-encoder",
             lambda d: set_arg(d, "router", "deepinfer-router:9091"),
             "--router=deepinfer-router:9091 is not a Service port"),
            ("Role", "deepinfer-router-scaler",
             lambda r: r["rules"][0].update(
                 {"resourceNames": ["deepinfer-prefill", "deepinfer-decode"]}),
             "may not get deployments/scale of deepinfer-encoder"),
            ("ServiceMonitor", "deepinfer",
             lambda s: s["spec"]["endpoints"][0].update({"port": "http-metrics"}),
             "endpoint port http-metrics not on Service/deepinfer-router"),
            ("Service", "deepinfer-decode",
             lambda s: s["metadata"]["labels"].pop("app.kubernetes.io/name"),
             "does not select Service/deepinfer-decode"),
            ("Deployment", "deepinfer-router", lambda d: set_arg(d, "tenants_file", None),
             "neither --tenants_file nor --allow_anonymous"),
            ("Deployment", "deepinfer-router",
             lambda d: set_arg(d, "tenants_file", "/models/model/tenants.json"),
             "is not on a Secret volume"),
        ]
        for kind, name, mutate, expected in cases:
            with self.subTest(kind=kind, name=name, expected=expected):
                objects, _ = self.mutated(kind, name, mutate)
                errors = consistency_errors(objects)
                self.assertTrue(any(expected in e for e in errors), errors)

    def test_prometheus_scrape_config(self):
        cm = by_kind(self.objects, "ConfigMap")["deepinfer-prometheus-scrape-config"]
        config = yaml.safe_load(cm["data"]["prometheus.yml"])
        jobs = {j["job_name"]: j for j in config["scrape_configs"]}
        job = jobs["deepinfer"]
        self.assertEqual(job["metrics_path"], "/metrics")
        self.assertEqual(job["kubernetes_sd_configs"][0]["role"], "pod")
        keeps = {(tuple(r["source_labels"]), r["regex"]) for r in job["relabel_configs"]
                 if r.get("action") == "keep"}
        self.assertIn((("__meta_kubernetes_pod_container_port_name",), "metrics"), keeps)
        self.assertIn((("__meta_kubernetes_pod_label_app_kubernetes_io_name",), "deepinfer"),
                      keeps)
        # Every pod's metrics port is the one this job keeps.
        for d in by_kind(self.objects, "Deployment").values():
            labels = d["spec"]["template"]["metadata"]["labels"]
            self.assertEqual(labels["app.kubernetes.io/name"], "deepinfer")

    def test_grafana_dashboard(self):
        with open(os.path.join(BASE, "grafana", "deepinfer.json")) as f:
            dash = json.load(f)
        self.assertEqual(dashboard_errors(dash), [])
        broken = copy.deepcopy(dash)
        broken["panels"][0]["targets"][0]["expr"] = broken["panels"][0]["targets"][0][
            "expr"].replace("deepinfer_time_to_first_token_seconds_bucket",
                            "deepinfer_ttft_seconds_bucket")
        broken["panels"][1]["targets"][0]["expr"] = \
            "avg(rate(deepinfer_inter_token_latency_seconds_sum[5m]))"
        errors = dashboard_errors(broken)
        self.assertTrue(any("unknown metric deepinfer_ttft_seconds_bucket" in e for e in errors))
        self.assertTrue(any("should be histogram_quantile" in e for e in errors), errors)

    def test_schemas_record_their_provenance(self):
        with open(os.path.join(HERE, "schemas", "index.json")) as f:
            index = json.load(f)
        self.assertRegex(index["kubernetes_version"], r"^\d+\.\d+\.\d+$")
        self.assertIn("kubernetes_validate", index["source"])
        self.assertIn("prometheus-operator", index["servicemonitor_source"])


class OverlaysTest(unittest.TestCase):
    """Every overlay rendered by `kubectl kustomize`, validated as the base is."""

    @classmethod
    def setUpClass(cls):
        cls.tree = copy_tree()
        cls.addClassCleanup(shutil.rmtree, cls.tree)
        cls.rendered = {name: kubectl_kustomize(os.path.join(cls.tree, "overlays", name))
                        for name in sorted(os.listdir(OVERLAYS))}

    def test_every_overlay_has_expectations(self):
        self.assertEqual(set(self.rendered), set(OVERLAYS_EXPECTED))

    def test_base_renders_to_its_files(self):
        rendered = kubectl_kustomize(os.path.join(self.tree, "base"))
        for obj in rendered:
            self.assertEqual(schema_errors(obj), [])
            self.assertEqual(obj["metadata"]["labels"].get("app.kubernetes.io/part-of"),
                             "deepinfer", obj["metadata"]["name"])
        names = lambda objs: sorted((o["kind"], o["metadata"]["name"]) for o in objs)
        # The files' objects plus the generated dashboard ConfigMap.
        self.assertEqual(names(rendered), sorted(
            names([o for _, o in load_objects()]) +
            [("ConfigMap", "deepinfer-grafana-dashboard")]))

    def test_overlays_match_schemas_and_are_consistent(self):
        for name, objects in self.rendered.items():
            want = OVERLAYS_EXPECTED[name]
            with self.subTest(overlay=name):
                errors = [e for o in objects for e in schema_errors(o)]
                errors += consistency_errors(objects, want["worker_pools"], want["gpu_pools"])
                errors += replica_errors(objects, want["worker_pools"])
                self.assertEqual(errors, [])

    def test_overlay_settings(self):
        for name, objects in self.rendered.items():
            want = OVERLAYS_EXPECTED[name]
            with self.subTest(overlay=name):
                deployments = by_kind(objects, "Deployment")
                self.assertEqual({n: d["spec"]["replicas"] for n, d in deployments.items()},
                                 {"deepinfer-" + p: n for p, n in want["replicas"].items()})
                for d in deployments.values():
                    for c in d["spec"]["template"]["spec"]["containers"]:
                        self.assertEqual(c["image"], want["image"], d["metadata"]["name"])
                self.assertFalse({o["kind"] for o in objects} & want["absent_kinds"])
                claims = by_kind(objects, "PersistentVolumeClaim")
                for claim, pools in want["rwx_claims"].items():
                    self.assertEqual(claims[claim]["spec"]["accessModes"], ["ReadWriteMany"])
                    for pool in pools:
                        pod = deployments["deepinfer-" + pool]["spec"]["template"]["spec"]
                        vol = [v["name"] for v in pod["volumes"]
                               if (v.get("persistentVolumeClaim") or {}).get("claimName") == claim]
                        self.assertEqual(len(vol), 1, pool)
                        self.assertIn(vol[0], [m["name"] for m in
                                               pod["containers"][0]["volumeMounts"]], pool)

    def test_checks_catch_a_broken_overlay(self):
        objects = copy.deepcopy(self.rendered["cpu-demo"])
        decode = by_kind(objects, "Deployment")["deepinfer-decode"]
        args = decode["spec"]["template"]["spec"]["containers"][0]["args"]
        args[:] = [a if a != "--device=cpu" else "--device=cuda" for a in args]
        by_kind(objects, "Deployment")["deepinfer-prefill"]["spec"]["replicas"] = 9
        errors = consistency_errors(objects, ("prefill", "decode"), ())
        self.assertTrue(any("deepinfer-decode container decode: has no GPU but --device=cuda"
                            in e for e in errors), errors)
        errors = replica_errors(objects, ("prefill", "decode"))
        self.assertTrue(any("replicas 9 outside" in e for e in errors), errors)

    def test_render_fails_when_the_base_moves_a_patched_argument(self):
        # The overlays' JSON patches `test` the argument they replace: a base whose --device
        # argument moved must fail the render, not patch the wrong argument.
        tree = copy_tree()
        self.addCleanup(shutil.rmtree, tree)
        path = os.path.join(tree, "base", "decode.yaml")
        with open(path) as f:
            text = f.read()
        with open(path, "w") as f:
            f.write(text.replace("- --device=cuda\n", "- --device=cuda:0\n"))
        with self.assertRaisesRegex(AssertionError, "test failed"):
            kubectl_kustomize(os.path.join(tree, "overlays", "cpu-demo"))


if __name__ == "__main__":
    unittest.main(verbosity=2)
