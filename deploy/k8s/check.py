#!/usr/bin/env python3
"""Checks the Kubernetes manifests in deploy/k8s/ (run by scripts/test).

No schema validator for Kubernetes runs offline (they fetch the schemas),
so this parses every manifest and asserts the fields that matter:

- every document has apiVersion, kind and metadata.name, and its kind is
  one of the expected ones;
- the Deployment probes /healthz (liveness, startup) and /readyz
  (readiness) on its HTTP port, waits longer than the config's
  [worker] shutdown_timeout before killing a pod, requests memory above
  the measured peak RSS, and runs as a non-root user;
- the PodDisruptionBudget and the KEDA ScaledObject select that
  Deployment; the ScaledObject's queue is the config's [amqp] jobs_queue;
- configmap.yaml holds exactly config/docker.toml and templates/, and the
  Deployment mounts every template file at its path;
- kustomization.yaml (the base) lists every manifest, and
  overlays/example builds on it and names the image a registry serves;
- the Service selects the Deployment's pods on their http port, the
  ServiceMonitor scrapes it, and both it and deploy/prometheus/prometheus.yml
  scrape under the job name the alerts query.

  python3 deploy/k8s/check.py           # check
  python3 deploy/k8s/check.py --write   # regenerate configmap.yaml and the
                                        # Deployment's template items
"""

import pathlib
import re
import sys
import tomllib

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
CONFIG = ROOT / "config" / "docker.toml"
TEMPLATES = ROOT / "templates"
# BENCHMARKS.md: the worker's peak RSS under full load, at most 59 MB.
PEAK_RSS_MI = 64
KINDS = {
    "Deployment",
    "Service",
    "ServiceMonitor",
    "PodDisruptionBudget",
    "ConfigMap",
    "Secret",
    "ScaledObject",
    "TriggerAuthentication",
}
ITEMS_MARK = "# items: generated"


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


def template_files():
    """(ConfigMap key, path under templates/) of every template file."""
    files = sorted(p for p in TEMPLATES.rglob("*") if p.is_file())
    return [
        (str(p.relative_to(TEMPLATES)).replace("/", "."), str(p.relative_to(TEMPLATES)))
        for p in files
    ]


def configmaps():
    header = (
        "# The settings and templates, as ConfigMaps: generated from\n"
        "# config/docker.toml and templates/ by python3 deploy/k8s/check.py --write\n"
        "# (mailgate's CI checks they agree). To change them for your cluster, patch\n"
        "# them in an overlay (deploy/k8s/overlays/example), or set a single key as\n"
        "# MAILGATE__SECTION__KEY in the Deployment's env.\n"
    )
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "mailgate-config"},
        "data": {"mailgate.toml": CONFIG.read_text()},
    }
    templates = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "mailgate-templates"},
        "data": {key: (TEMPLATES / path).read_text() for key, path in template_files()},
    }

    class Literal(yaml.SafeDumper):
        pass

    def text(dumper, s):
        style = "|" if "\n" in s else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", s, style=style)

    Literal.add_representer(str, text)
    body = yaml.dump_all(
        [config, templates], Dumper=Literal, sort_keys=False, allow_unicode=True, width=1000
    )
    return header + body


def items_block(indent):
    lines = []
    for key, path in template_files():
        lines.append(f"{indent}- key: {key}")
        lines.append(f"{indent}  path: {path}")
    return lines


def with_items(deployment_text):
    """The Deployment's text with its template items regenerated."""
    lines = deployment_text.splitlines()
    at = next((i for i, l in enumerate(lines) if l.strip() == ITEMS_MARK), None)
    if at is None:
        fail(f"deployment.yaml lacks the {ITEMS_MARK!r} line")
    indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
    end = at + 1
    while end < len(lines) and lines[end].startswith(indent) and lines[end].strip():
        end += 1
    return "\n".join(lines[: at + 1] + items_block(indent) + lines[end:]) + "\n"


def documents():
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is None:
                continue
            for field in ("apiVersion", "kind"):
                if not doc.get(field):
                    fail(f"{path.name}: a document without {field}")
            if not (doc.get("metadata") or {}).get("name"):
                fail(f"{path.name}: a {doc['kind']} without metadata.name")
            if doc["kind"] not in KINDS:
                fail(f"{path.name}: unexpected kind {doc['kind']}")
            docs.append((path.name, doc))
    return docs


def one(docs, kind, name=None):
    found = [d for _, d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    if len(found) != 1:
        fail(f"expected one {kind}{' ' + name if name else ''}, found {len(found)}")
    return found[0]


def check(docs):
    config = tomllib.loads(CONFIG.read_text())
    deployment = one(docs, "Deployment")
    labels = deployment["spec"]["selector"]["matchLabels"]
    pod = deployment["spec"]["template"]
    if any(pod["metadata"]["labels"].get(k) != v for k, v in labels.items()):
        fail("the Deployment's pods do not carry its selector's labels")
    spec = pod["spec"]
    (container,) = spec["containers"]
    port = {p["name"]: p["containerPort"] for p in container["ports"]}
    listen = config["http"]["listen"]
    if not listen.startswith("0.0.0.0:") or int(listen.rsplit(":", 1)[1]) != port["http"]:
        fail(f"the config listens on {listen}; the probes reach port {port['http']} on the pod's IP")
    for probe, path in [
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
        ("startupProbe", "/healthz"),
    ]:
        get = container.get(probe, {}).get("httpGet", {})
        if get.get("path") != path or get.get("port") not in ("http", port["http"]):
            fail(f"{probe} must GET {path} on the http port, not {get}")
    grace = spec.get("terminationGracePeriodSeconds", 30)
    drain = seconds(config["worker"]["shutdown_timeout"])
    if grace <= drain:
        fail(f"terminationGracePeriodSeconds {grace} must exceed shutdown_timeout ({drain:.0f}s)")
    memory = container["resources"]["requests"]["memory"]
    if not memory.endswith("Mi") or int(memory[:-2]) < PEAK_RSS_MI:
        fail(f"requests.memory {memory} is below the measured peak RSS ({PEAK_RSS_MI}Mi)")
    security = spec.get("securityContext", {})
    if not security.get("runAsNonRoot") or not security.get("runAsUser"):
        fail("the pod must run as a non-root user (runAsNonRoot, runAsUser)")
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    if env.get("MAILGATE_CONFIG") != "/etc/mailgate/config/mailgate.toml":
        fail("MAILGATE_CONFIG must name the ConfigMap's mailgate.toml")
    secret = one(docs, "Secret", "mailgate-urls")
    refs = [e["secretRef"]["name"] for e in container.get("envFrom", []) if "secretRef" in e]
    if refs != ["mailgate-urls"]:
        fail("the worker must take its URLs from the mailgate-urls Secret")
    for key in ("MAILGATE__AMQP__URL", "MAILGATE__REDIS__URL", "MAILGATE__SMTP__URL"):
        if key not in secret.get("stringData", {}):
            fail(f"the Secret lacks {key}")
    volumes = {v["name"]: v for v in spec["volumes"]}
    items = volumes["templates"]["configMap"].get("items", [])
    if [(i["key"], i["path"]) for i in items] != template_files():
        fail("the Deployment's template items differ from templates/: run check.py --write")

    pdb = one(docs, "PodDisruptionBudget")
    if pdb["spec"]["selector"]["matchLabels"] != labels:
        fail("the PodDisruptionBudget does not select the Deployment's pods")
    scaled = one(docs, "ScaledObject")
    if scaled["spec"]["scaleTargetRef"]["name"] != deployment["metadata"]["name"]:
        fail("the ScaledObject does not scale the Deployment")
    (trigger,) = scaled["spec"]["triggers"]
    queue = trigger["metadata"].get("queueName")
    if trigger["type"] != "rabbitmq" or queue != config["amqp"]["jobs_queue"]:
        fail(f"the KEDA trigger must watch {config['amqp']['jobs_queue']!r}, not {queue!r}")
    auth = trigger.get("authenticationRef", {}).get("name")
    one(docs, "TriggerAuthentication", auth)

    # Scraped as the job the alerts query (found by review: they queried
    # job="mailgate", and nothing shipped scraped under that name).
    alerts = (ROOT / "deploy" / "prometheus" / "alerts.yml").read_text()
    jobs = set(re.findall(r'job="([^"]+)"', alerts))
    service = one(docs, "Service")
    if service["spec"].get("publishNotReadyAddresses") is not True:
        fail("the metrics Service must publish not-ready addresses: a worker that is not ready is the one whose metrics say why")
    if service["spec"]["selector"] != labels:
        fail("the Service does not select the Deployment's pods")
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    if "http" not in ports or ports["http"]["port"] != port["http"]:
        fail("the Service must expose the pods' http port as http")
    monitor = one(docs, "ServiceMonitor")
    if monitor["spec"]["selector"]["matchLabels"].items() - service["metadata"]["labels"].items():
        fail("the ServiceMonitor does not select the Service")
    if [e.get("port") for e in monitor["spec"]["endpoints"]] != ["http"]:
        fail("the ServiceMonitor must scrape the http port")
    # Without jobLabel, the Operator names the job after the Service.
    job = service["metadata"]["name"]
    if monitor["spec"].get("jobLabel") or jobs != {job}:
        fail(f"the alerts query job {sorted(jobs)}; the ServiceMonitor scrapes job {job!r}")
    prometheus = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    scraped = [c["job_name"] for c in prometheus["scrape_configs"]]
    if scraped != [job]:
        fail(f"deploy/prometheus/prometheus.yml scrapes {scraped}; the alerts query job {job!r}")


def check_kustomize(docs):
    """The base lists every manifest; the example overlay builds on it and
    names the Deployment's image, as a registry serves it."""
    base = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    if base.get("kind") != "Kustomization":
        fail("kustomization.yaml is not a Kustomization")
    manifests = sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
    if sorted(base.get("resources", [])) != manifests:
        fail(f"kustomization.yaml lists {sorted(base.get('resources', []))}, not {manifests}")
    overlay = yaml.safe_load((K8S / "overlays" / "example" / "kustomization.yaml").read_text())
    if "../.." not in overlay.get("resources", []):
        fail("overlays/example does not build on the base (resources: ../..)")
    deployment = one(docs, "Deployment")
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"].split(":")[0]
    named = [i for i in overlay.get("images", []) if i.get("name") == image]
    if len(named) != 1 or not named[0].get("newName") or not named[0].get("newTag"):
        fail(f"overlays/example must set newName and newTag of the image {image!r}")
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "release.yml").read_text())
    if "jobs" not in workflow:
        fail(".github/workflows/release.yml has no jobs")


def main():
    write = sys.argv[1:] == ["--write"]
    deployment_path = K8S / "deployment.yaml"
    generated = {K8S / "configmap.yaml": configmaps()}
    generated[deployment_path] = with_items(deployment_path.read_text())
    for path, text in generated.items():
        if write:
            path.write_text(text)
        elif not path.exists() or path.read_text() != text:
            fail(f"{path.name} differs from config/ and templates/: run python3 deploy/k8s/check.py --write")
    docs = documents()
    check(docs)
    check_kustomize(docs)
    print(f"deploy/k8s: {len(docs)} manifests checked, and the kustomize base and overlay")


if __name__ == "__main__":
    main()
