#!/usr/bin/env python3
"""Checks that the alerts, their runbook and the dashboard agree:

- every alert of deploy/prometheus/alerts.yml has a runbook_url, all of
  them on one base ending in docs/runbook.md#, each one's anchor the
  GitHub slug of its alert's name;
- docs/runbook.md has a `## <alert>` section for each (GitHub's slug of
  the heading is the anchor), no section of an alert that is gone, its
  table of alerts gives each alert's severity as alerts.yml does, and
  every `(#anchor)` link in it leads to one of its headings;
- deploy/grafana/mailgate.json has the namespace and instance variables
  (multi-select, "All" as .*, so that series without the label match
  too), and every query of every panel filters by job, namespace and
  instance.

    python3 deploy/prometheus/check.py [ROOT]

ROOT is the repository (default: the one this file is in). Prints one
line and exits 0 when all is well; else each problem on stderr, exit 1.
Needs PyYAML.
"""

import json
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2]
ALERTS = Path("deploy/prometheus/alerts.yml")
RUNBOOK = Path("docs/runbook.md")
DASHBOARD = Path("deploy/grafana/mailgate.json")

# A heading that names an alert: the alerts' own spelling, Mailgate and
# CamelCase words, nothing else.
ALERT_NAME = re.compile(r"^Mailgate[A-Z][A-Za-z0-9]*$")
# What a panel's every selector must hold.
FILTERS = ('job="$job"', 'namespace=~"$namespace"', 'instance=~"$instance"')

problems = []


def problem(where, what):
    problems.append(f"{where}: {what}")


def slug(heading):
    """GitHub's anchor for a Markdown heading: the text as rendered (a
    link's text, no markup), lower case, every character but letters,
    digits, spaces, '-' and '_' dropped, each space a '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def headings(markdown):
    """(level, text) of each ATX heading, outside fenced code."""
    found, fence = [], None
    for line in markdown.splitlines():
        marker = re.match(r"^\s{0,3}(```|~~~)", line)
        if marker:
            if fence is None:
                fence = marker.group(1)
            elif marker.group(1) == fence:
                fence = None
            continue
        if fence is not None:
            continue
        m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if m:
            found.append((len(m.group(1)), m.group(2)))
    return found


def anchors(markdown):
    """Every heading's anchor as GitHub makes it: a repeated slug gets -1,
    -2, … after the first."""
    seen, out = {}, set()
    for _, text in headings(markdown):
        base = slug(text)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def load_alerts():
    try:
        doc = yaml.safe_load((ROOT / ALERTS).read_text())
    except (OSError, yaml.YAMLError) as e:
        problem(ALERTS, f"cannot read it: {e}")
        return []
    rules = [r for g in (doc or {}).get("groups") or [] for r in g.get("rules") or []]
    return [r for r in rules if "alert" in r]


def check_alerts(alerts, runbook_anchors):
    bases = {}
    for rule in alerts:
        name = rule["alert"]
        where = f"{ALERTS} {name}"
        if not (rule.get("labels") or {}).get("severity"):
            problem(where, "has no severity label")
        url = (rule.get("annotations") or {}).get("runbook_url")
        if not isinstance(url, str) or not url.strip():
            problem(where, "has no runbook_url annotation")
            continue
        base, hash_, anchor = url.partition("#")
        if not hash_ or not base.endswith("/" + str(RUNBOOK)):
            problem(where, f"runbook_url {url!r} does not point into {RUNBOOK} (…/{RUNBOOK}#section)")
            continue
        bases.setdefault(base, []).append(name)
        if anchor != slug(name):
            problem(where, f"runbook_url's anchor is #{anchor}, not its own section's #{slug(name)}")
        if anchor not in runbook_anchors:
            problem(where, f"runbook_url's anchor #{anchor} matches no heading of {RUNBOOK}")
    if len(bases) > 1:
        listed = "; ".join(f"{b} ({', '.join(n)})" for b, n in sorted(bases.items()))
        problem(ALERTS, f"the runbook_urls have {len(bases)} bases, not one: {listed}")


def check_runbook(alerts, markdown):
    names = {r["alert"]: (r.get("labels") or {}).get("severity") for r in alerts}
    sections = [text for level, text in headings(markdown) if level == 2]
    for text in sections:
        if ALERT_NAME.match(text) and text not in names:
            problem(RUNBOOK, f"has a section for {text}, which is not an alert of {ALERTS}")
        if sections.count(text) > 1 and ALERT_NAME.match(text):
            problem(RUNBOOK, f"has {sections.count(text)} sections named {text}")
    for name in names:
        if name not in sections:
            problem(RUNBOOK, f"has no section `## {name}`")
    # The table of alerts: | [Name](#name) | severity | … |
    table = {}
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.lstrip().startswith("|") or len(cells) < 2:
            continue
        m = re.fullmatch(r"\[?(Mailgate[A-Za-z0-9]*)\]?(\(#[^)]*\))?", cells[0].strip("`"))
        if m:
            table[m.group(1)] = cells[1]
    for name, severity in names.items():
        if name not in table:
            problem(RUNBOOK, f"the table of alerts lacks {name}")
        elif table[name] != severity:
            problem(RUNBOOK, f"the table gives {name} severity {table[name]!r}; {ALERTS} says {severity!r}")
    for name in table:
        if name not in names:
            problem(RUNBOOK, f"the table of alerts lists {name}, which is not an alert")
    own = anchors(markdown)
    for link in sorted(set(re.findall(r"\]\(#([^)]+)\)", markdown))):
        if link not in own:
            problem(RUNBOOK, f"links to #{link}, which no heading makes")


def variable_query(var):
    q = var.get("query")
    if isinstance(q, dict):
        q = q.get("query")
    return q if isinstance(q, str) else ""


def check_dashboard():
    try:
        dashboard = json.loads((ROOT / DASHBOARD).read_text())
    except (OSError, ValueError) as e:
        problem(DASHBOARD, f"cannot read it: {e}")
        return 0
    variables = {v.get("name"): v for v in (dashboard.get("templating") or {}).get("list") or []}
    wanted = {
        "namespace": ('label_values(', 'job="$job"', ", namespace)"),
        "instance": ('label_values(', 'job="$job"', 'namespace=~"$namespace"', ", instance)"),
    }
    for name, parts in wanted.items():
        var = variables.get(name)
        where = f"{DASHBOARD} variable {name}"
        if var is None:
            problem(DASHBOARD, f"has no {name} variable")
            continue
        if var.get("type") != "query":
            problem(where, f"is of type {var.get('type')!r}, not query")
        if not (var.get("multi") is True and var.get("includeAll") is True):
            problem(where, "must be multi-select with an All option (multi, includeAll)")
        if var.get("allValue") != ".*":
            problem(where, f"allValue is {var.get('allValue')!r}, not '.*' (All must match series without the label too)")
        if (var.get("datasource") or {}).get("uid") != "${datasource}":
            problem(where, "must query the ${datasource} variable's data source")
        query = variable_query(var)
        missing = [p for p in parts if p not in query.replace(" ,", ",")]
        if missing:
            problem(where, f"query {query!r} lacks {missing}")
    count = 0

    def panels(items):
        for p in items or []:
            yield p
            yield from panels(p.get("panels"))

    for panel in panels(dashboard.get("panels")):
        for target in panel.get("targets") or []:
            expr = target.get("expr")
            if expr is None:
                continue
            count += 1
            where = f"{DASHBOARD} panel {panel.get('title')!r} query {target.get('refId')}"
            selectors = re.findall(r"\{([^{}]*)\}", expr)
            if not selectors:
                problem(where, f"selects no series with a label filter: {expr}")
            for selector in selectors:
                matchers = {m.strip() for m in selector.split(",")}
                lacking = [f for f in FILTERS if f not in matchers]
                if lacking:
                    problem(where, f"selector {{{selector}}} lacks {', '.join(lacking)}")
            # A metric named without braces would escape the filters.
            for m in re.finditer(r"\b(mailgate_[A-Za-z0-9_]+|up)\b(?!\s*\{)", expr):
                problem(where, f"{m.group(1)} is selected without the job, namespace and instance filters")
    return count


def main():
    alerts = load_alerts()
    if not alerts and not problems:
        problem(ALERTS, "has no alert")
    try:
        markdown = (ROOT / RUNBOOK).read_text()
    except OSError as e:
        problem(RUNBOOK, f"cannot read it: {e}")
        markdown = ""
    check_alerts(alerts, anchors(markdown))
    check_runbook(alerts, markdown)
    queries = check_dashboard()
    if problems:
        for p in problems:
            print(f"error: {p}", file=sys.stderr)
        print(f"deploy/prometheus/check.py: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print(
        f"deploy/prometheus/check.py: {len(alerts)} alerts, each with a runbook_url to its "
        f"section of {RUNBOOK}, no section of an alert gone; {queries} dashboard queries "
        f"filter by job, namespace and instance"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
