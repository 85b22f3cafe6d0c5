#!/usr/bin/env python3
"""Redis's cost per job in mailgate's scripts, as CPU instructions.

Timings on a shared 2-core machine swing by ±50 % from one run to the
next; instructions do not. This starts a private redis-server under
valgrind's callgrind on a free port, loads the composed ledger script (as
src/store/scripts/mod.rs composes it), drives the calls a worker sends for
each kind of job, and counts the instructions Redis executes per job (the
request's parsing, the script, the commands it runs and the reply: all of
Redis's work). The yardstick is one call of article 003's script
(benches/article.lua) on the same Redis: instructions do not depend on the
host, so the ratios hold on any machine (issue 28's goals: an admitted job
at most 1.8 article calls, a rejected one at most 0.6).

    python3 benches/redis_cost.py        # about two minutes; needs valgrind and redis-py
    SCRIPTS=<dir> python3 benches/redis_cost.py   # another version's scripts

Each scenario runs 1 000 jobs, 5 per call as the e2e bench's worker
batches them at full load, then 1 per call (a worker with one job at a
time), through the ledger's script (EVALSHA), through its function
library (FCALL), and as the worker calls Redis since the snapshot (issue
43): one atomic read of each batch's admissions (MULTI, their records,
TIME, their suppression keys and the newest entries of their logs, EXEC),
which answers rejections and suppressions, for admissions that name a
key the worker found full or suppressed (the rest, new mailboxes, go
straight to the function); since the commits (commit.lua, 2026-12-03), a
new mailbox from a new network is written by a "commit" with no read
first, and its sent settle is one SET … XX PX; the shipped config's email
and ip rule sets; every mailbox and network new. Figures: instructions per job (and against one article
call).
  admitted, marked sending later (builds before 2026-12-04 only): call n
      carries the settles of the jobs admitted in call n-2, the send marks
      of call n-1's and 5 new admissions (a worker whose SMTP connections
      were all busy);
  admitted, sending at once: the admission marks the send (a connection
      was free; since 2026-12-04 a job is admitted only with one in hand),
      so only admissions and settles;
  rejected: admissions of mailboxes whose 1-per-minute rule is full;
  rejected, a flood: every job for one mailbox from one network (mail
      bombing), each rejected by the mailbox's minute;
  suppressed: every mailbox on the suppression list (scripts that check
      it name each admission's suppression key, as the worker does by
      default, in every scenario).
"""
import glob
import os
import socket
import subprocess
import sys
import tempfile
import time

import redis

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.environ.get("SCRIPTS", os.path.join(HERE, "..", "src", "store", "scripts"))
H = 3_600_000
EMAIL = [3, 25 * H, 60_000, 1, H, 5, 24 * H, 10]
IP = [3, 2 * H, 60_000, 5, 600_000, 30, H, 50]
# keep, lease; no sets in order, the two named as extras.
# One fixed time (a worker sends "~<expected>:<max>" and the script reads
# Redis's clock: 2 000 instructions more per call), so that a run slowed
# down by valgrind still finds the mailboxes it filled within their minute.
NOW = 1_790_000_000_000
SETTINGS = [25 * H, 30_000, 0, 2, 1] + EMAIL + [2] + IP


def head(code, form):
    """A batch's first arguments: the settings as words of one argument
    for the function library (as each argument of its own for the script,
    and for libraries from before that change); `form`: how it writes job
    records ("hash" or "string"; None for scripts from before the choice)."""
    settings = SETTINGS[:2] + ([form] if form else []) + SETTINGS[2:]
    if isinstance(code, tuple) and "local function words" in sources()[0]:
        return ["batch", NOW, " ".join(map(str, settings))]
    return ["batch", NOW] + settings


JOBS = 1000


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Counted:
    """A private redis-server under callgrind; `count(f)` runs f and
    returns the instructions Redis executed meanwhile."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="redis-cost-")
        self.port = free_port()
        self.proc = subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={self.dir}/out.%p",
             "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", self.dir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.r = redis.Redis(port=self.port)
        for _ in range(200):
            try:
                self.r.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.1)
        raise SystemExit("the private redis-server under valgrind did not start")

    def control(self, flag):
        subprocess.run(["callgrind_control", flag, str(self.proc.pid)],
                       check=True, capture_output=True)

    def count(self, f):
        self.control("-z")
        f()
        self.control("-d")
        dump = max(glob.glob(f"{self.dir}/out.*"), key=os.path.getmtime)
        with open(dump) as d:
            for line in d:
                if line.startswith("summary:"):
                    return int(line.split()[1])
        raise SystemExit(f"no summary in {dump}")

    def stop(self):
        self.proc.terminate()
        self.proc.wait()
        subprocess.run(["rm", "-rf", self.dir])


def sources():
    """decide.lua (with records.lua after it, as a second module, where the
    scripts have one) and ledger.lua."""
    decide = open(os.path.join(SCRIPTS, "decide.lua")).read()
    ledger = open(os.path.join(SCRIPTS, "ledger.lua")).read()
    records = os.path.join(SCRIPTS, "records.lua")
    if os.path.exists(records):
        decide += "\nend)()\nlocal records = (function()\n" + open(records).read()
    commit = os.path.join(SCRIPTS, "commit.lua")
    if os.path.exists(commit):
        decide += "\nend)()\nlocal commit = (function()\n" + open(commit).read()
    return decide, ledger


def commits():
    """Whether the worker writes the admissions its snapshot found room
    for by compare-and-set (commit.lua, since 2026-12-03): then every
    admission is read first."""
    return "op == 'commit'" in sources()[1]


def ledger_script():
    """The ledger's script, as src/store/scripts/mod.rs composes LEDGER."""
    decide, ledger = sources()
    module = "local decide = (function()\n" + decide + "\nend)()\n"
    if "\nreturn main\n" not in ledger:  # scripts from before the function library
        return module + ledger
    return ("local KEEPS_STATE = false\n" + module
            + "return (function()\n" + ledger + "\nend)()()\n")


def ledger_library(name):
    """The ledger as a Redis Function library, as mod.rs composes
    LEDGER_LIBRARY (under another name)."""
    decide, ledger = sources()
    setup = ("local KEEPS_STATE = true\nlocal decide = (function()\n" + decide + "\nend)()\n"
             + "return (function()\n" + ledger + "\nend)()\n")
    return (f"#!lua name={name}\nlocal KEYS, ARGV, main\nlocal function setup()\n{setup}end\n"
            f"redis.register_function('{name}', function(keys, args)\n"
            "  KEYS, ARGV = keys, args\n  main = main or setup()\n  return main()\nend)\n")


def one_mark():
    """Whether every admission sends at once (since 2026-12-04: a job is
    admitted only with an SMTP connection in hand, and there is no
    separate send mark): admission flags and commit owners carry no
    sending digit."""
    return 'item "sending"' not in sources()[1]


def suppression():
    """Whether the scripts check the suppression list (and answer
    `suppressed`)."""
    return "suppressed = 11" in sources()[1]


def snapshot(p, keys):
    """The worker's snapshot of a batch of admissions (src/ledger/redis/
    snapshot.rs), as it reads the shipped config's sets: `keys` holds each
    admission's record, mailbox log, network log and suppression key."""
    p.execute_command("MULTI")
    if commits():
        # Since the commits (2026-12-03): one MGET of each record, each
        # suppression key and each small log whole (a mailbox's: its rules'
        # max is 10), TIME, the head of each larger log (a network's: the
        # newest 50), then EXISTS of the records and logs the MGET read;
        # each key once.
        got, seen = [], set()
        for record, email, _, sup in keys:
            got += [record] + ([sup] if sup else [])
        for _, email, _, _ in keys:
            if email not in seen:
                seen.add(email)
                got.append(email)
        p.execute_command("MGET", *got)
        p.execute_command("TIME")
        for _, _, ip, _ in keys:
            if ip not in seen:
                seen.add(ip)
                p.execute_command("GETRANGE", ip, 0, 6 + 50 * 12 - 1)
        p.execute_command("EXISTS", *[k for k in got if ":sup:" not in k])
        p.execute_command("EXEC")
        return
    for record, _, _, _ in keys:
        p.execute_command("GET", record)
    p.execute_command("TIME")
    sups = [sup for _, _, _, sup in keys if sup]
    if sups:
        p.execute_command("MGET", *sups)
    strings = "local function log_of" in sources()[0]
    # The worker reads each key once per batch (a flood names the same
    # mailbox and network in every job).
    seen = set()
    for _, email, ip, _ in keys:
        if strings:
            # Log strings (since 2026-12-03): each log's head, its count
            # and newest entries (12 bytes each): email 1, 5, 10: the
            # newest 10; ip 5, 30, 50: the newest 50.
            for key, newest in ((email, 10), (ip, 50)):
                if key not in seen:
                    seen.add(key)
                    p.execute_command("GETRANGE", key, 0, 6 + newest * 12 - 1)
            continue
        # Sorted sets: email: 1, 5, 10: the newest 10. ip: 5, 30, 50: the
        # newest 16, then the 30th and the 50th newest alone.
        p.execute_command("ZRANGE", email, -10, -1)
        p.execute_command("ZRANGE", ip, -16, -1)
        p.execute_command("ZRANGE", ip, -30, -30)
        p.execute_command("ZRANGE", ip, -50, -50)
    p.execute_command("EXEC")


def calls(r, code, form, tag, rounds, send_now, per, settle=True, boxes=None, flood=False,
          answered=False):
    """The worker's calls for rounds * per jobs, pipelined (`code`: the
    script's hash, or ("fcall", function), or ("snapshot", function): as
    ("fcall", …), but for admissions the worker reads first (`answered`:
    each names a key it found full or suppressed, and the snapshot answers
    it, a rejection or a suppression, so none reaches the function; a new
    mailbox goes straight to the function); `form`: see head; `flood`:
    every job for mailbox m0 from network n0); returns the replies."""
    boxes = boxes or tag
    snap = isinstance(code, tuple) and code[0] == "snapshot"
    p = r.pipeline(transaction=False)
    # Scripts that check the suppression list name each admission's
    # suppression key, as the worker does by default (limits.suppress).
    sup = suppression()
    # "s1": one suppression key follows (scripts since issue 41 take the
    # count; before, "s" alone).
    counted = "local function suppression_keys" in sources()[1]
    if one_mark():
        flag = ("s1:" if sup else "") + "c1"
    else:
        flag = ("1" if send_now else "0") + (("s1" if counted else "s") if sup else "") + ":c1"
    for rd in range(rounds + 2):
        keys, args = [], head(code, form)
        # A sent job that a commit admitted sending at once: its record
        # written over whole by the worker, no script (commit.rs's Sends).
        plain = snap and send_now and commits()
        if settle and rd >= 2:
            for j in range((rd - 2) * per, (rd - 1) * per):
                if plain:
                    p.execute_command("SET", f"{tag}:job:{j}", f"s0-|0|tk{j}|1:ab|c1|{NOW}||fp",
                                      "XX", "PX", 25 * H)
                    continue
                keys.append(f"{tag}:job:{j}")
                args += ["settle", f"tk{j}", "1:ab", str(j), "s", "1", "0"]
        if not send_now and 1 <= rd <= rounds:
            for j in range((rd - 1) * per, rd * per):
                keys.append(f"{tag}:job:{j}")
                args += ["sending", f"tk{j}", "1:ab", "c2"]
        # The worker writes new admissions by compare-and-set (since
        # 2026-12-03): every log here is new, which the worker believes
        # (it wrote none of them), so it reads nothing first.
        commit = snap and not answered and commits()
        cks, cargs = [], ["commit", NOW, 25 * H, 30_000, f"{25 * H} {2 * H}"]
        if rd < rounds:
            read = []
            for j in range(rd * per, (rd + 1) * per):
                m = 0 if flood else j
                job = (f"{tag}:job:{j}", f"{boxes}:email:m{m}", f"{tag}:ip:n{m}",
                       sup and f"{boxes}:sup:m{m}")
                read.append(job)
                if snap and answered:
                    continue
                if commit:
                    # Its record and suppression key, then its two logs,
                    # both found empty (keeps A and B).
                    cks += [job[0]] + ([job[3]] if sup else []) + [job[1], job[2]]
                    who = f"tk{j}|1:ab|c1"
                    if not one_mark():
                        who = f"{int(send_now)}|{who}"
                    cargs += [str(j), "fp", who, "", NOW,
                              f"{1 if sup else 0}2AB"]
                    continue
                keys += [k for k in job if k]
                args += ["admit", str(j), "fp", f"tk{j}", "1:ab", flag, "", "0102", ""]
            # (A commit of logs the worker believes empty reads nothing
            # first: commit.rs's `fresh`.)
            if snap and answered:
                snapshot(p, read)
        if cks:
            p.execute_command("FCALL", code[1], len(cks), *cks, *cargs)
        if keys and isinstance(code, tuple):
            p.execute_command("FCALL", code[1], len(keys), *keys, *args)
        elif keys:
            p.evalsha(code, len(keys), *keys, *args)
        if rd % 50 == 49:
            p.execute()
            p = r.pipeline(transaction=False)
    return p.execute()


def scenarios(c, r, code, form, name, per):
    """Instructions per job of each scenario, calling `code` (writing job
    records in `form`)."""
    rounds = JOBS // per
    out = []
    cases = [("admitted, sending at once", True)]
    if not one_mark():
        cases.insert(0, ("admitted, marked sending later", False))
    for label, send_now in cases:
        tag = f"{name}{per}a{int(send_now)}"
        calls(r, code, form, tag + "w", 4, send_now, per)  # warm up
        n = c.count(lambda: calls(r, code, form, tag, rounds, send_now, per))
        out.append((label, n / JOBS))
    # Rejected: the mailboxes just admitted (1 per minute) ask again.
    boxes = f"{name}{per}a1"
    n = c.count(lambda: calls(r, code, form, boxes + "r", rounds, True, per, settle=False,
                              boxes=boxes, answered=True))
    out.append(("rejected (the mailbox's 1 per minute is full)", n / JOBS))
    # A flood: every job for one mailbox from one network (mail bombing),
    # all rejected but the first.
    flood = f"{name}{per}f"
    calls(r, code, form, flood + "w", 1, True, 1, settle=False, flood=True)
    n = c.count(lambda: calls(r, code, form, flood, rounds, True, per, settle=False,
                              boxes=flood + "w", flood=True, answered=True))
    out.append(("rejected, a flood for one mailbox from one network", n / JOBS))
    if suppression():
        # Suppressed: every mailbox is on the suppression list.
        gone = f"{name}{per}s"
        p = r.pipeline(transaction=False)
        for j in range(JOBS):
            p.set(f"{gone}:sup:m{j}", "1 manual test")
        p.execute()
        n = c.count(lambda: calls(r, code, form, gone + "j", rounds, True, per, settle=False,
                                  boxes=gone, answered=True))
        out.append(("suppressed (the mailbox is on the suppression list)", n / JOBS))
    last = calls(r, code, form, boxes + "r2", 1, True, per, settle=False, boxes=boxes)[-1]
    # The first item's code (times 8 plus how many values follow, since
    # replies leave out values an item does not have).
    first = last[1] // 8 if "c * 8 + m" in sources()[1] else last[1]
    # (A commit's reply: its code, 13 `changed`: the script then rejects.)
    if isinstance(code, tuple) and code[0] == "snapshot" and commits():
        first = 0 if last[1] == 13 else last[1]
    if first != 0:
        sys.exit(f"the rejected scenario admitted a job: {last}")
    return out


def article_cost(c):
    """Instructions per call of article 003's script on `c`'s Redis: the
    yardstick. 2 000 calls over 1 000 mailboxes, after 2 000 that fill
    them with a few admissions each."""
    r = c.r
    article = r.script_load(open(os.path.join(HERE, "article.lua")).read())

    def article_calls():
        p = r.pipeline(transaction=False)
        for i in range(2000):
            now = int(time.time() * 1000)
            p.evalsha(article, 1, f"art:m{i % 1000}", 5, 10, now - 24 * H, now)
            if i % 250 == 249:
                p.execute()
                p = r.pipeline(transaction=False)
        p.execute()

    article_calls()  # every mailbox holds a few admissions
    per_article = c.count(article_calls) / 2000
    r.delete(*[f"art:m{i}" for i in range(1000)])
    return per_article


def main():
    c = Counted()
    try:
        r = c.r
        sha = r.script_load(ledger_script())
        codes = [("script (EVALSHA)", sha)]
        if "\nreturn main\n" in sources()[1]:
            r.execute_command("FUNCTION", "LOAD", "REPLACE", ledger_library("redis_cost"))
            codes.append(("function (FCALL)", ("fcall", "redis_cost")))
            if "Newest" in open(os.path.join(HERE, "..", "src", "limiter", "usage.rs")).read():
                # Since the snapshot (issue 43): what the worker sends now.
                codes.append(("snapshot, then FCALL", ("snapshot", "redis_cost")))
        # Each code writing job records as hashes and as strings, where the
        # scripts offer the choice (redis.record_form).
        forms = ["hash", "string"] if "record_form" in sources()[1] else [None]
        codes = [(f"{n}, {f} records" if f else n, code, f) for n, code in codes for f in forms]

        per_article = article_cost(c)
        print(f"article 003's script: {per_article:,.0f} instructions per call\n")
        print("| job | jobs per call | " + " | ".join(n for n, _, _ in codes) + " |")
        print("|---|---:|" + "---:|" * len(codes))
        for per in (5, 1):
            results = [scenarios(c, r, code, form, f"c{i}", per)
                       for i, (_, code, form) in enumerate(codes)]
            for k, (label, _) in enumerate(results[0]):
                cells = [f"{res[k][1]:,.0f} ({res[k][1] / per_article:.2f})" for res in results]
                print(f"| {label} | {per} | " + " | ".join(cells) + " |")
    finally:
        c.stop()


if __name__ == "__main__":
    main()
