#!/usr/bin/env python3
"""Where Redis's time goes in mailgate's ledger script, call by call.

Loads the composed ledger script (decide.lua bound as `decide`, then
ledger.lua, as src/store/scripts/mod.rs composes it) into the Redis at
REDIS_URL's port (default 6379) and times stripped and whole calls by Redis's
own account (INFO commandstats usec per EVALSHA), pipelined from one client.
Keys live under "luacost:" and are deleted at the end. Needs redis-py
(pip install redis). Run it with nothing else using Redis: figures are
Redis's time, but a busy machine inflates them.

    python3 benches/lua_cost.py
"""
import os
import redis

r = redis.Redis(port=int(os.environ.get("REDIS_PORT", "6379")))
HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "..", "src", "store", "scripts")
decide = open(os.path.join(SCRIPTS, "decide.lua")).read()
ledger = open(os.path.join(SCRIPTS, "ledger.lua")).read()
LIB = "local decide = (function()\n" + decide + "\nend)()\n"
H = 3_600_000
SET = [3, 25 * H, 60_000, 1, H, 5, 24 * H, 10]  # a 3-rule set, as the shipped email scope
HEAD = ["batch", "", 25 * H, 30_000]  # Redis's clock, keep, lease


def all_sets(n):
    """n sets in order (every configured set, as calls carried them before)."""
    return [n] + SET * n + [0]


def named(numbers):
    """Only the sets named, as extra sets (what a call carries now)."""
    out = [0, len(numbers)]
    for k in numbers:
        out += [k] + SET
    return out


def usec():
    e = r.info("commandstats").get("cmdstat_evalsha", {})
    return e.get("calls", 0), e.get("usec", 0)


def bench(label, sha, keys_of, argv_of, n=4000):
    c0, u0 = usec()
    p = r.pipeline(transaction=False)
    for i in range(n):
        keys = keys_of(i)
        p.evalsha(sha, len(keys), *keys, *argv_of(i))
        if i % 200 == 199:
            p.execute()
            p = r.pipeline(transaction=False)
    p.execute()
    c1, u1 = usec()
    print(f"{label:58} {(u1 - u0) / max(c1 - c0, 1):7.2f} µs per call")


def main():
    bench("return 1 (the floor)", r.script_load("return 1"), lambda i: [], lambda i: [])
    bench("decide.lua's definitions, then return", r.script_load(LIB + "return 1"),
          lambda i: [], lambda i: [])
    cut = ledger.rfind("\nif op ")
    bench("every definition of the composed script, then return",
          r.script_load(LIB + ledger[:cut] + "\ndo return 1 end" + ledger[cut:]),
          lambda i: [], lambda i: [])
    sha = r.script_load(LIB + ledger)
    settle = ["settle", "tk", "1:ab", "x1", "s", "1", "0"]
    for n in (1, 6, 20):
        bench(f"one settle of a missing record, {n} sets in order", sha,
              lambda i: ["luacost:job:x1"], lambda i, n=n: HEAD + all_sets(n) + settle)
    bench("one settle of a missing record, no sets", sha,
          lambda i: ["luacost:job:x1"], lambda i: HEAD + named([]) + settle)
    bench("five settles of missing records, no sets", sha,
          lambda i: [f"luacost:job:x{k}" for k in range(5)],
          lambda i: HEAD + named([]) + settle * 5)

    def admit(tag, shape):
        return lambda i: ["admit", f"{tag}{i}", "fp", "tk", "1:ab", f"1:c{i}", "", shape, ""]

    def keys(tag, n):
        return lambda i: [f"luacost:job:{tag}{i}"] + [f"luacost:s{s}:{tag}{i}" for s in range(n)]

    bench("admit a new id, no scope keys", sha, keys("a0-", 0),
          lambda i: HEAD + named([]) + admit("a0-", "")(i))
    bench("admit a new id, 1 scope key", sha, keys("a1-", 1),
          lambda i: HEAD + named([1]) + admit("a1-", "01")(i))
    bench("admit a new id, 3 scope keys, its 3 sets", sha, keys("a3-", 3),
          lambda i: HEAD + named([1, 2, 3]) + admit("a3-", "010203")(i))
    bench("admit a new id, 3 scope keys, 6 sets in order", sha, keys("a6-", 3),
          lambda i: HEAD + all_sets(6) + admit("a6-", "010203")(i))
    bench("admit, 3 scope keys already full (rejected)", sha,
          lambda i: [f"luacost:job:r{i}", "luacost:full:0", "luacost:full:1", "luacost:full:2"],
          lambda i: HEAD + named([1, 2, 3]) + admit("r", "010203")(i))
    for key in r.scan_iter("luacost:*"):
        r.delete(key)


if __name__ == "__main__":
    main()
