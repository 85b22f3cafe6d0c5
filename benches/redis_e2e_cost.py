#!/usr/bin/env python3
"""Redis's cost per job end to end, black box, as CPU instructions.

benches/redis_cost.py drives the ledger's scripts directly; this runs the
release worker itself, with the shipped config/default.toml, against a
private redis-server under valgrind's callgrind, and counts every
instruction Redis executes while the worker answers jobs: the job path's
calls, and whatever else the worker asks of Redis meanwhile (its clock
and health checks, the overrides poll). Issue 43's goal 2 is read from
it. The yardstick is one call of article 003's script (benches/article.lua)
on the same Redis, in the same run (benches/redis_cost.py's).

Phases, each counted on its own:
  idle: the worker runs, no job comes: its background checks, per second,
      less what the same Redis spends a second with no client at all (its
      own timers, serverCron at hz 10: about 1.2 million instructions a
      second under callgrind, measured first);
  admitted: N jobs, each a new mailbox (at gmail.com, which the domain
      scope leaves alone) from a new network;
  rejected: the same N mailboxes again within their minute, each from a
      new network (the mailbox's 1 per minute is full);
  flood: N jobs for one new mailbox from one network (mail bombing): the
      first admitted, the rest rejected.
A phase's figure is its instructions, less the idle rate over its length,
per job; jobs go out as fast as the worker takes them (prefetch 256), so
its batches are as full as at full load.

    python3 benches/redis_e2e_cost.py           # about two minutes after the build
    N=1000 python3 benches/redis_e2e_cost.py
    MAILGATE_BIN=target/release/mailgate python3 benches/redis_e2e_cost.py

Needs valgrind, redis-server, redis-py and pika, and RabbitMQ on
127.0.0.1:5672 (guest/guest); the queues and keys are its own and are
removed after (`mailgate admin purge --yes`).
"""
import json
import os
import subprocess
import sys
import tempfile
import time

import pika

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from redis_cost import Counted, article_cost  # noqa: E402

N = int(os.environ.get("N", "500"))
IDLE_S = 10


def binary():
    given = os.environ.get("MAILGATE_BIN")
    if given:
        return given
    subprocess.run(["cargo", "build", "--release", "--locked", "--quiet", "--bin", "mailgate"],
                   cwd=ROOT, check=True)
    return os.path.join(ROOT, "target", "release", "mailgate")


class Worker:
    """The release worker on the shipped settings, pointed at the private
    Redis, queues of its own, and a folder for its mail."""

    def __init__(self, exe, redis_port):
        tag = f"bench.e2e-cost.{os.getpid()}"
        self.outbox = tempfile.mkdtemp(prefix="redis-e2e-cost-mail-")
        self.jobs, self.results = f"{tag}.jobs", f"{tag}.results"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("MAILGATE")}
        self.env.update({
            "MAILGATE_CONFIG": os.path.join(ROOT, "config", "default.toml"),
            "MAILGATE__REDIS__URL": f"redis://127.0.0.1:{redis_port}/0",
            "MAILGATE__REDIS__KEY_PREFIX": f"{tag}:",
            "MAILGATE__AMQP__JOBS_QUEUE": self.jobs,
            "MAILGATE__AMQP__RESULTS_QUEUE": self.results,
            "MAILGATE__SMTP__URL": f"file://{self.outbox}",
            "MAILGATE__HTTP__LISTEN": "127.0.0.1:0",
            "RUST_LOG": "warn",
        })
        self.exe = exe
        self.proc = subprocess.Popen([exe, "worker"], cwd=ROOT, env=self.env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1"))
        self.ch = self.conn.channel()
        for _ in range(600):
            try:
                check = self.conn.channel()
                q = check.queue_declare(self.jobs, passive=True)
                check.close()
                if q.method.consumer_count > 0:
                    return
            except (pika.exceptions.ChannelClosedByBroker, pika.exceptions.ChannelWrongStateError):
                pass
            if self.proc.poll() is not None:
                raise SystemExit("the worker exited at start-up")
            time.sleep(0.1)
        raise SystemExit("the worker did not start consuming")

    def run(self, jobs):
        """Publishes `jobs` and waits for their results; their statuses."""
        for job in jobs:
            self.ch.basic_publish("", self.jobs, json.dumps(job).encode(),
                                  pika.BasicProperties(delivery_mode=2,
                                                       content_type="application/json"))
        statuses = {}
        deadline = time.time() + 600
        while len(statuses) < len(jobs):
            method, _, body = self.ch.basic_get(self.results, auto_ack=True)
            if method is None:
                if time.time() > deadline:
                    raise SystemExit(f"{len(statuses)} of {len(jobs)} results in 10 minutes")
                time.sleep(0.02)
                continue
            result = json.loads(body)
            statuses[result["id"]] = result["status"]
        return sorted(statuses.values())

    def stop(self):
        self.proc.terminate()
        self.proc.wait()
        self.conn.close()
        subprocess.run([self.exe, "admin", "purge", "--yes"], cwd=ROOT, env=self.env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        subprocess.run(["rm", "-rf", self.outbox])


def job(i, email, net):
    return {"id": f"j{i}", "email": email, "code": "123456",
            "ip": f"10.{net // 65536 % 256}.{net // 256 % 256}.{net % 256}"}


def main():
    exe = binary()
    c = Counted()
    worker = None
    try:
        per_article = article_cost(c)
        bare = c.count(lambda: time.sleep(IDLE_S)) / IDLE_S
        worker = Worker(exe, c.port)
        time.sleep(2)  # the start-up's one-off work done

        def counted(jobs, expect):
            started = time.time()
            seen = []
            total = c.count(lambda: seen.extend(worker.run(jobs)))
            took = time.time() - started
            if set(seen) != {expect} and expect != "mixed":
                raise SystemExit(f"expected every job {expect}, got {sorted(set(seen))}")
            return total, took, seen

        idle = c.count(lambda: time.sleep(IDLE_S)) / IDLE_S
        mailboxes = [f"e2e.{os.getpid()}.{i}@gmail.com" for i in range(N)]
        rows = []
        phases = [
            ("admitted", [job(i, m, i) for i, m in enumerate(mailboxes)], "sent"),
            ("rejected", [job(N + i, m, N + i) for i, m in enumerate(mailboxes)], "rejected"),
            ("flood", [job(2 * N + i, f"flood.{os.getpid()}@gmail.com", 2 * N) for i in range(N)],
             "mixed"),
        ]
        for name, jobs, expect in phases:
            total, took, seen = counted(jobs, expect)
            if name == "flood" and (seen.count("sent") != 1 or seen.count("rejected") != N - 1):
                raise SystemExit(f"a flood: expected 1 sent and the rest rejected, got {sorted(set(seen))}")
            per_job = (total - idle * took) / len(jobs)
            rows.append((name, per_job, took))
        print(f"article 003's script: {per_article:,.0f} instructions per call")
        checks = idle - bare
        print(f"Redis with no client: {bare:,.0f} instructions a second")
        print(f"idle worker's checks: {checks:,.0f} instructions a second "
              f"({checks / per_article:.1f} article calls), above that\n")
        print(f"| job ({N} a phase) | instructions per job | article calls | phase took (s, under valgrind) |")
        print("|---|---:|---:|---:|")
        for name, per_job, took in rows:
            print(f"| {name} | {per_job:,.0f} | {per_job / per_article:.2f} | {took:.1f} |")
    finally:
        if worker is not None:
            worker.stop()
        c.stop()


if __name__ == "__main__":
    main()
