#!/usr/bin/env python3
"""Writes docs/configuration.md, the reference of every settings key, from
config/default.toml: its sections, each key with the value it ships (or its
default, where the line is commented out), the environment variable that
sets it, and its comment. The shipped file is the one source: the settings
refuse a key they do not know (tests/it/tools/docs_configs.rs loads it), and
a test checks the README explains every key in it. scripts/test runs this
with --check, so the reference cannot drift.

  python3 scripts/config-reference.py           # write docs/configuration.md
  python3 scripts/config-reference.py --check   # fail if it differs
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIG = ROOT / "config" / "default.toml"
OUT = ROOT / "docs" / "configuration.md"

SECTION = re.compile(r"^#?\s*(\[\[?[a-z_.]+\]\]?)\s*(?:#\s?(.*))?$")
KEY = re.compile(r"^(#\s*)?([a-z][a-z0-9_]*)\s*=\s*(.*?)\s*(?:(?<=\S)\s{2,}#\s?(.*))?$")

HEAD = """# Configuration reference

Generated from [`config/default.toml`](../config/default.toml) by
`python3 scripts/config-reference.py` (CI fails if it differs): every key,
the value the file ships (*commented out*: a line the file shows but does
not set, with the default mailgate uses when the key is absent, or an
example), the environment variable that overrides it, and what it does. The README's *Configuration* section and
[contract.md](contract.md) explain how the keys work together; settings are
checked when they load, and a key mailgate does not know is refused, naming
its source.

Durations are human strings (`"500ms"`, `"60s"`, `"10m"`, `"24h"`, `"30d"`).
An environment variable `MAILGATE__SECTION__KEY` overrides the file's key
(`MAILGATE__LIMITS__DEDUP_FOR=12h`); the file is `--config` or
`MAILGATE_CONFIG` (`config/default.toml`).
"""


def env_var(section, key, value):
    if section.startswith("[[") or value.startswith("["):
        return "(in the file only)"
    parts = section.strip("[]").split(".") + [key]
    return "`MAILGATE__" + "__".join(p.upper() for p in parts) + "`"


def cell(text):
    return text.replace("|", "\\|").strip()


def is_prose(line):
    """A comment line that is neither a commented key nor a section."""
    if not line.startswith("#"):
        return False
    body = line.lstrip("# ").rstrip()
    if not body:
        return line.strip() == "#"  # a paragraph break inside a block
    return not KEY.match(body) and not SECTION.match(line)


def rows():
    """(section, its prose, [(key, value, set, comment)]) in file order.

    A comment block goes to the section right below it, when nothing
    separates them, else to the section it is in."""
    lines = [l.rstrip() for l in CONFIG.read_text().splitlines()]
    sections = []
    current = None
    block = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if is_prose(line):
            block.append(line.lstrip("#").strip())
            i += 1
            continue
        m = SECTION.match(line)
        if m and not KEY.match(line.lstrip("# ")):
            name = m.group(1)
            if not (current and current[0] == name):
                note = (m.group(2) or "").strip()
                current = (name, [note] if note else [], [])
                sections.append(current)
            current[1].extend(block)
            block = []
            i += 1
            continue
        if current is not None and block:
            current[1].extend(block)
        block = []
        k = KEY.match(line)
        if k and current is not None:
            commented, key, value, comment = k.groups()
            # A list written over several lines: joined.
            while value.count("[") > value.count("]") and i + 1 < len(lines):
                i += 1
                value += " " + lines[i].strip()
            value = re.sub(r"\s+", " ", value).replace("[ ", "[").replace(", ]", "]")
            if not any(key == seen[0] for seen in current[2]):
                current[2].append((key, value, not commented, (comment or "").strip()))
        i += 1
    return sections


def render():
    out = [HEAD]
    for name, prose, keys in rows():
        if not keys:
            continue
        out.append(f"\n## `{name}`\n")
        if prose:
            text = " ".join(p for p in prose if p)
            out.append("\n" + text[0].upper() + text[1:] + ("" if text.endswith(".") else ".") + "\n")
        out.append("\n| key | value | environment | what it does |\n|---|---|---|---|\n")
        for key, value, shipped, comment in keys:
            shown = f"`{cell(value)}`" + ("" if shipped else " (commented out)")
            out.append(f"| `{key}` | {shown} | {env_var(name, key, value)} | {cell(comment)} |\n")
    return "".join(out)


def main():
    text = render()
    if sys.argv[1:] == ["--check"]:
        if not OUT.exists() or OUT.read_text() != text:
            sys.exit("docs/configuration.md differs from config/default.toml: run python3 scripts/config-reference.py")
        print(f"docs/configuration.md: {text.count(chr(10) + '| `')} keys, as config/default.toml says")
    else:
        OUT.write_text(text)


if __name__ == "__main__":
    main()
