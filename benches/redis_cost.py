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

    python3 benches/redis_cost.py        # about a minute; needs valgrind and redis-py

Scenarios, 5 jobs per call as the e2e bench's worker batches them (the
shipped config's email and ip rule sets; every mailbox and network new):
  admitted, marked sending later: call n carries the settles of the jobs
      admitted in call n-2, the send marks of call n-1's and 5 new
      admissions (a worker whose SMTP connections were all busy);
  admitted, sending at once: the admission marks the send (a connection
      was free), so only admissions and settles;
  rejected: admissions of mailboxes whose 1-per-minute rule is full.
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
# batch, Redis's clock, keep, lease; no sets in order, the two named as extras.
HEAD = ["batch", "", 25 * H, 30_000, 0, 2, 1] + EMAIL + [2] + IP
PER = 5
ROUNDS = 200


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


def ledger_script():
    decide = open(os.path.join(SCRIPTS, "decide.lua")).read()
    ledger = open(os.path.join(SCRIPTS, "ledger.lua")).read()
    return "local decide = (function()\n" + decide + "\nend)()\n" + ledger


def calls(r, sha, tag, rounds, send_now, settle=True, boxes=None):
    """The worker's calls for rounds * PER jobs, pipelined; returns the
    replies' codes of the last call."""
    boxes = boxes or tag
    p = r.pipeline(transaction=False)
    flag = "1:c1" if send_now else "0:c1"
    for rd in range(rounds + 2):
        keys, args = [], list(HEAD)
        if settle and rd >= 2:
            for j in range((rd - 2) * PER, (rd - 1) * PER):
                keys.append(f"{tag}:job:{j}")
                args += ["settle", f"tk{j}", "1:ab", str(j), "s", "1", "0"]
        if not send_now and 1 <= rd <= rounds:
            for j in range((rd - 1) * PER, rd * PER):
                keys.append(f"{tag}:job:{j}")
                args += ["sending", f"tk{j}", "1:ab", "c2"]
        if rd < rounds:
            for j in range(rd * PER, (rd + 1) * PER):
                keys += [f"{tag}:job:{j}", f"{boxes}:email:m{j % 1000}", f"{tag}:ip:n{j}"]
                args += ["admit", str(j), "fp", f"tk{j}", "1:ab", flag, "", "0102", ""]
        if keys:
            p.evalsha(sha, len(keys), *keys, *args)
        if rd % 50 == 49:
            p.execute()
            p = r.pipeline(transaction=False)
    return p.execute()


def main():
    c = Counted()
    try:
        r = c.r
        sha = r.script_load(ledger_script())
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
        rows = []
        for label, send_now in (("admitted, marked sending later", False),
                                ("admitted, sending at once", True)):
            tag = f"a{int(send_now)}"
            calls(r, sha, tag + "w", 20, send_now)  # warm up
            n = c.count(lambda: calls(r, sha, tag, ROUNDS, send_now))
            rows.append((label, n / (ROUNDS * PER)))
        # Rejected: the mailboxes of "a1" took a job each less than a minute ago.
        n = c.count(lambda: calls(r, sha, "r", ROUNDS, True, settle=False, boxes="a1"))
        rows.append(("rejected (the mailbox's 1 per minute is full)", n / (ROUNDS * PER)))
        last = calls(r, sha, "r2", 1, True, settle=False, boxes="a1")[-1]
        if last[1] != 0:
            sys.exit(f"the rejected scenario admitted a job: {last}")
        print(f"article 003's script: {per_article:,.0f} instructions per call\n")
        print("| job | instructions per job | vs the article's call |")
        print("|---|---:|---:|")
        for label, v in rows:
            print(f"| {label} | {v:,.0f} | {v / per_article:.2f} |")
    finally:
        c.stop()


if __name__ == "__main__":
    main()
