#!/usr/bin/env python3
"""Checks deploy/k8s/ with the real tools (run by scripts/test).

For the base and for every overlay under overlays/:

- `kubectl kustomize` builds it (the kustomize in Debian's kubectl);
- every object it outputs of a built-in kind passes the Kubernetes JSON
  schemas, strictly (an unknown field is an error), of the oldest and the
  newest version checked (kubernetes-validate, which carries the schemas:
  nothing is fetched). The kinds of CRDs (ServiceMonitor, ScaledObject,
  TriggerAuthentication) have no schema here and are checked field by
  field below;
- the worker starts on what its pod would see: the image's files (the
  Dockerfile's COPY lines, at their paths), under the ConfigMap volumes the
  build mounts, laid out as the kubelet lays them out; `mailgate
  check-config` loads the settings file the pod names, with the pod's env,
  and renders every template;
- the fields that matter, against the settings the pod reads: probes on
  /healthz and /readyz, a grace period longer than the drain, memory above
  the measured peak, non-root, the URLs from the Secret, the disruption
  budget and the KEDA scaler on the Deployment and its jobs queue;
- one scrape story: the metrics Service's ServiceMonitor, and
  deploy/prometheus/prometheus.yml, scrape the job the alerts query, the
  README names that job, and nothing carries prometheus.io/* annotations
  (their scrape names the job otherwise: MailgateNoWorkerUp would fire for
  ever and the dashboard stay empty).

And every `kubectl apply -k`/`kubectl kustomize` path that README.md and
the manifests' comments give builds.

  python3 deploy/k8s/check.py
"""

import base64
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
# The oldest and newest Kubernetes whose schemas the objects must pass.
SCHEMAS = ["1.30.0", "1.37.0"]
# BENCHMARKS.md: the worker's peak RSS under full load, at most 59 MB.
PEAK_RSS_MI = 64
CRDS = {"ServiceMonitor", "ScaledObject", "TriggerAuthentication"}
KINDS = {"Deployment", "Service", "PodDisruptionBudget", "Secret", "ConfigMap", "Namespace"} | CRDS
# The names kustomize takes a folder's kustomization from.
KUSTOMIZATION = ("kustomization.yaml", "kustomization.yml", "Kustomization")
# The Secret of the URLs, which the base leaves to the operator's secret
# store: its keys, with stand-ins where a build does not hold it.
URLS_SECRET = "mailgate-urls"
URL_KEYS = {
    "MAILGATE__AMQP__URL": "amqp://mailgate:x@rabbitmq:5672/%2f",
    "MAILGATE__REDIS__URL": "redis://:x@redis:6379/0",
    "MAILGATE__SMTP__URL": "smtp://mailgate:x@smtp-relay:587?tls=required",
    "KEDA_AMQP_HOST": "amqp://mailgate:x@rabbitmq:5672/%2f",
}


def fail(why):
    sys.exit(f"deploy/k8s: {why}")


def seconds(duration):
    """A humantime duration of the config ("30s", "2m", "1m 30s")."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    total = 0.0
    for n, unit in re.findall(r"(\d+)\s*(ms|s|m|h)", duration):
        total += int(n) * units[unit]
    if total == 0:
        fail(f"cannot read the duration {duration!r}")
    return total


def build(path):
    """The objects `kubectl kustomize path` outputs."""
    done = subprocess.run(
        ["kubectl", "kustomize", str(path)], capture_output=True, text=True
    )
    if done.returncode != 0:
        fail(f"kubectl kustomize {path.relative_to(ROOT)} fails: {done.stderr.strip()}")
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def validate_schemas(name, objects):
    import kubernetes_validate

    for obj in objects:
        kind = obj.get("kind")
        if kind not in KINDS:
            fail(f"{name}: unexpected kind {kind}")
        if kind in CRDS:
            continue
        for version in SCHEMAS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                where = "/".join(str(p) for p in e.path)
                fail(f"{name}: {kind} {obj['metadata']['name']} fails Kubernetes {version}'s schema at {where}: {e.message}")


def secret_data(secret):
    """A Secret's keys and values: stringData, and data decoded."""
    values = {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}
    values.update(secret.get("stringData") or {})
    return values


def urls(objects, name):
    """The keys and values of the Secret `name` the worker reads its URLs
    from: the build's (a generator's, under a name kustomize made), or
    stand-ins for the one the base leaves to the operator."""
    found = [o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"] == name]
    if found:
        return secret_data(found[0])
    if name == URLS_SECRET:
        return dict(URL_KEYS)
    fail(f"the worker reads its URLs from the Secret {name}, which the build lacks")


def worker(spec):
    """The Deployment's container named worker."""
    found = [c for c in spec["containers"] if c["name"] == "worker"]
    if len(found) != 1:
        fail("the Deployment needs one container named worker")
    return found[0]


def one(objects, kind, name=None):
    found = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    if len(found) != 1:
        fail(f"expected one {kind}{' ' + name if name else ''}, found {len(found)}")
    return found[0]


class Image:
    """What the Dockerfile's final stage puts where: its COPY lines from the
    build context, its WORKDIR and its ENV."""

    def __init__(self):
        text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
        stage = text.split("\nFROM ")[-1].splitlines()
        self.copies, self.env, self.workdir = [], {}, "/"
        for line in stage:
            words = line.split()
            if not words:
                continue
            if words[0] == "COPY" and not any(w.startswith("--from") for w in words):
                self.copies.append((words[1], words[2]))
            elif words[0] == "WORKDIR":
                self.workdir = words[1]
            elif words[0] == "ENV":
                for pair in words[1:]:
                    key, _, value = pair.partition("=")
                    self.env[key] = value


def configmap_volume(folder, data):
    """Writes a ConfigMap's data as the kubelet mounts it: the files in a
    hidden timestamped folder, `..data` linking to it, each key a link
    through `..data`."""
    stamp = folder / "..2026_01_01_00_00_00.000000000"
    stamp.mkdir(parents=True)
    for key, value in data.items():
        (stamp / key).write_text(value)
        (folder / key).symlink_to(pathlib.Path("..data") / key)
    (folder / "..data").symlink_to(stamp.name)


def mailgate_binary():
    done = subprocess.run(
        ["cargo", "build", "--quiet", "--locked", "--bin", "mailgate", "--message-format=json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        fail(f"cargo build --bin mailgate fails: {done.stderr.strip()}")
    for line in done.stdout.splitlines():
        message = json.loads(line)
        if message.get("executable") and message["target"]["name"] == "mailgate":
            return message["executable"]
    fail("cargo build gave no mailgate executable")


class Pod:
    """The worker's container as the build runs it: its filesystem (the
    image's files under the ConfigMaps mounted over them) and its env."""

    def __init__(self, objects, image, root):
        """Lays the pod's filesystem out under `root`."""
        deployment = one(objects, "Deployment")
        spec = deployment["spec"]["template"]["spec"]
        self.container = worker(spec)
        if self.container.get("command") or self.container.get("args") != ["worker"]:
            fail(f"the worker container must run the image's mailgate with args [worker], not {self.container.get('command')} {self.container.get('args')}")
        self.root = root
        self.workdir = self.container.get("workingDir", image.workdir)
        maps = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ConfigMap"}
        secrets = {o["metadata"]["name"]: secret_data(o) for o in objects if o["kind"] == "Secret"}

        def source(kind, name):
            if kind == "secret":
                if name in secrets:
                    return secrets[name]
                if name == URLS_SECRET:
                    return dict(URL_KEYS)
            elif name in maps:
                return maps[name].get("data", {})
            fail(f"the worker reads the {kind} {name}, which the build lacks")

        self.env = dict(image.env)
        for ref in self.container.get("envFrom", []):
            kind = "secret" if "secretRef" in ref else "configMap"
            self.env.update(source(kind, ref[f"{kind}Ref"]["name"]))
        for var in self.container.get("env", []):
            if "value" in var:
                self.env[var["name"]] = var["value"]
                continue
            ref = var.get("valueFrom", {})
            kind = "secret" if "secretKeyRef" in ref else "configMap" if "configMapKeyRef" in ref else None
            if kind is None:
                fail(f"check.py does not model the env {var['name']}'s source {ref}")
            key = ref[f"{kind}KeyRef"]
            self.env[var["name"]] = source(kind, key["name"])[key["key"]]
        for source_dir, target in image.copies:
            if (ROOT / source_dir).is_dir():
                shutil.copytree(ROOT / source_dir, self.path(target), dirs_exist_ok=True)
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        group = (spec.get("securityContext") or {}).get("fsGroup")
        for mount in self.container.get("volumeMounts", []):
            volume = volumes.get(mount["name"])
            if volume is None or "configMap" not in volume:
                fail(f"the worker mounts {mount['name']}, which is no ConfigMap volume")
            name = volume["configMap"]["name"]
            if name not in maps or volume["configMap"].get("items"):
                fail(f"the volume {mount['name']} must mount the ConfigMap {name} whole")
            mode = volume["configMap"].get("defaultMode", 0o644)
            if not (mode & 0o004 or (group and mode & 0o040)):
                fail(f"the volume {mount['name']}'s files (mode {mode:o}) are root's: the worker (uid 10001) cannot read them")
            shutil.rmtree(self.path(mount["mountPath"]), ignore_errors=True)
            configmap_volume(self.path(mount["mountPath"]), maps[name]["data"])

    def path(self, inside):
        """Where a path of the pod's filesystem lies here."""
        return self.root / pathlib.Path(self.workdir, inside).relative_to("/")

    def settings(self):
        """The settings the worker reads: MAILGATE_CONFIG, under the pod's
        MAILGATE__SECTION__KEY variables."""
        settings = tomllib.loads(self.path(self.env["MAILGATE_CONFIG"]).read_text())
        for var, value in self.env.items():
            if var.startswith("MAILGATE__"):
                section, key = var.removeprefix("MAILGATE__").lower().split("__", 1)
                settings.setdefault(section, {})[key] = value
        return settings

    def check_config(self, binary):
        env = {k: v for k, v in os.environ.items() if not k.startswith("MAILGATE")}
        env.update(self.env)
        env["MAILGATE_CONFIG"] = str(self.path(self.env["MAILGATE_CONFIG"]))
        env["MAILGATE_LOG_FORMAT"] = "pretty"
        done = subprocess.run(
            [binary, "check-config"],
            cwd=self.path("."),
            env=env,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            fail(f"the worker does not start on what its pod would see:\n{done.stdout}{done.stderr}")


def check_deployment(objects, settings, container):
    deployment = one(objects, "Deployment")
    labels = deployment["spec"]["selector"]["matchLabels"]
    pod = deployment["spec"]["template"]
    if any(pod["metadata"]["labels"].get(k) != v for k, v in labels.items()):
        fail("the Deployment's pods do not carry its selector's labels")
    spec = pod["spec"]
    port = {p["name"]: p["containerPort"] for p in container["ports"]}
    listen = settings["http"]["listen"]
    if not listen.startswith("0.0.0.0:") or int(listen.rsplit(":", 1)[1]) != port["http"]:
        fail(f"the settings listen on {listen}; the probes reach port {port['http']} on the pod's IP")
    for probe, path in [
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
        ("startupProbe", "/healthz"),
    ]:
        get = container.get(probe, {}).get("httpGet", {})
        if get.get("path") != path or get.get("port") not in ("http", port["http"]):
            fail(f"{probe} must GET {path} on the http port, not {get}")
    grace = spec.get("terminationGracePeriodSeconds", 30)
    drain = seconds(settings["worker"]["shutdown_timeout"])
    if grace <= drain:
        fail(f"terminationGracePeriodSeconds {grace} must exceed shutdown_timeout ({drain:.0f}s)")
    memory = container["resources"]["requests"]["memory"]
    if not memory.endswith("Mi") or int(memory[:-2]) < PEAK_RSS_MI:
        fail(f"requests.memory {memory} is below the measured peak RSS ({PEAK_RSS_MI}Mi)")
    security = spec.get("securityContext", {})
    if not security.get("runAsNonRoot") or not security.get("runAsUser"):
        fail("the pod must run as a non-root user (runAsNonRoot, runAsUser)")
    refs = [e["secretRef"]["name"] for e in container.get("envFrom", []) if "secretRef" in e]
    if len(refs) != 1:
        fail(f"the worker must take its URLs from one Secret ({URLS_SECRET}), not {refs}")
    secret = urls(objects, refs[0])
    for key in URL_KEYS:
        if key not in secret:
            fail(f"the Secret {refs[0]} lacks {key}")
    pdb = one(objects, "PodDisruptionBudget")
    if pdb["spec"]["selector"]["matchLabels"] != labels:
        fail("the PodDisruptionBudget does not select the Deployment's pods")
    scaled = one(objects, "ScaledObject")
    if scaled["spec"]["scaleTargetRef"]["name"] != deployment["metadata"]["name"]:
        fail("the ScaledObject does not scale the Deployment")
    (trigger,) = scaled["spec"]["triggers"]
    if scaled["spec"].get("minReplicaCount", 0) < 1 or "replicas" in deployment["spec"]:
        fail("KEDA owns the replica count (minReplicaCount at least 1, no Deployment replicas, which each apply would reset)")
    queue = trigger["metadata"].get("queueName")
    if trigger["type"] != "rabbitmq" or queue != settings["amqp"]["jobs_queue"]:
        fail(f"the KEDA trigger must watch {settings['amqp']['jobs_queue']!r}, not {queue!r}")
    auth = trigger.get("authenticationRef", {}).get("name")
    for ref in one(objects, "TriggerAuthentication", auth)["spec"]["secretTargetRef"]:
        if ref["name"] != refs[0] or ref["key"] not in secret:
            fail(f"KEDA reads {ref['key']} from the Secret {ref['name']}; the worker's is {refs[0]}")


def check_scrape(objects, base):
    """One scrape story, found by review twice: the alerts queried
    job="mailgate" and nothing shipped scraped under that name; then the
    Deployment carried prometheus.io/* annotations the alerts warn against."""
    for obj in objects:
        for meta in (obj["metadata"], obj.get("spec", {}).get("template", {}).get("metadata", {})):
            marked = [a for a in (meta.get("annotations") or {}) if a.startswith("prometheus.io/")]
            if marked:
                fail(f"{obj['kind']} {obj['metadata']['name']} carries {marked}: that scrape names the job otherwise, and the alerts and dashboard read job \"mailgate\"")
    alerts = (ROOT / "deploy" / "prometheus" / "alerts.yml").read_text()
    jobs = set(re.findall(r'job="([^"]+)"', alerts))
    deployment = one(objects, "Deployment")
    labels = deployment["spec"]["selector"]["matchLabels"]
    port = {p["name"]: p["containerPort"] for p in worker(deployment["spec"]["template"]["spec"])["ports"]}
    service = one(objects, "Service")
    if service["spec"].get("publishNotReadyAddresses") is not True:
        fail("the metrics Service must publish not-ready addresses: a worker that is not ready is the one whose metrics say why")
    if service["spec"]["selector"] != labels:
        fail("the Service does not select the Deployment's pods")
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    if "http" not in ports or ports["http"]["port"] != port["http"]:
        fail("the Service must expose the pods' http port as http")
    monitor = one(objects, "ServiceMonitor")
    if monitor["spec"]["selector"]["matchLabels"].items() - service["metadata"]["labels"].items():
        fail("the ServiceMonitor does not select the Service")
    if [e.get("port") for e in monitor["spec"]["endpoints"]] != ["http"]:
        fail("the ServiceMonitor must scrape the http port")
    # The Operator names the job after the Service's jobLabel label, else
    # after the Service (which an overlay's namePrefix renames).
    label = monitor["spec"].get("jobLabel")
    job = service["metadata"]["labels"].get(label) if label else service["metadata"]["name"]
    if jobs != {job}:
        fail(f"the alerts query job {sorted(jobs)}; the ServiceMonitor scrapes job {job!r}")
    prometheus = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    scraped = [c["job_name"] for c in prometheus["scrape_configs"]]
    if scraped != [job]:
        fail(f"deploy/prometheus/prometheus.yml scrapes {scraped}; the alerts query job {job!r}")
    readme = (ROOT / "README.md").read_text()
    if f"scrape job `{job}`" not in readme or "prometheus.io/scrape" in readme:
        fail(f"README.md must tell the same scrape story: the scrape job `{job}`, no prometheus.io/scrape")
    # prometheus.yml finds the base's pods (a team renaming them edits it).
    for config in prometheus["scrape_configs"] if base else []:
        for sd in config.get("dns_sd_configs", []):
            for name in sd["names"]:
                if not name.startswith(f"{service['metadata']['name']}.") or sd.get("port") != port["http"]:
                    fail(f"prometheus.yml looks up {name}:{sd.get('port')}, not the Service's pods")


def check_overlay(path, objects):
    """An overlay names the image as a registry serves it, never latest."""
    image = worker(one(objects, "Deployment")["spec"]["template"]["spec"])["image"]
    name, _, tag = image.rpartition(":")
    if "/" not in name or tag in ("", "latest"):
        fail(f"{path.relative_to(ROOT)} runs the image {image!r}: name a registry's image and a release tag")


def documented_paths():
    """Every folder README.md and the manifests' comments tell people to
    build (kubectl apply -k PATH, kubectl kustomize PATH)."""
    texts = [ROOT / "README.md", *K8S.rglob("*.yaml")]
    found = set()
    for text in texts:
        for match in re.finditer(r"kubectl (?:apply -k|kustomize) (deploy/k8s\S*)", text.read_text()):
            found.add(match.group(1).rstrip(".,;:)`'"))
    return found


def main():
    try:
        import kubernetes_validate  # noqa: F401
    except ImportError:
        fail("kubernetes-validate is missing (pip install kubernetes-validate)")
    if shutil.which("kubectl") is None:
        fail("kubectl is missing (apt-get install kubectl): it carries kustomize")
    image = Image()
    binary = mailgate_binary()
    builds = []
    for folder in sorted({p.parent for name in KUSTOMIZATION for p in K8S.rglob(name)}):
        (found,) = [folder / n for n in KUSTOMIZATION if (folder / n).exists()]
        if yaml.safe_load(found.read_text()).get("kind", "Kustomization") == "Kustomization":
            builds.append(folder)
    for path in sorted(documented_paths()):
        if (ROOT / path).resolve() not in builds:
            fail(f"README.md or a manifest says to build {path}, which is no kustomization here")
    counts = []
    for path in builds:
        name = str(path.relative_to(ROOT))
        objects = build(path)
        validate_schemas(name, objects)
        with tempfile.TemporaryDirectory() as root:
            pod = Pod(objects, image, pathlib.Path(root))
            pod.check_config(binary)
            check_deployment(objects, pod.settings(), pod.container)
        check_scrape(objects, path == K8S / "base")
        if path != K8S / "base":
            check_overlay(path, objects)
        counts.append(f"{name} ({len(objects)} objects)")
    print(
        f"deploy/k8s: kubectl kustomize built {', '.join(counts)}; the built-in kinds pass "
        f"Kubernetes {' and '.join(SCHEMAS)}'s schemas; the worker loads each one's settings and templates"
    )


if __name__ == "__main__":
    main()
