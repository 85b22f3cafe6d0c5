-- luacheck (Debian's lua-check) for the Redis scripts, src/store/scripts/:
-- run by scripts/test. Redis runs them on Lua 5.1 with its own globals;
-- each script is composed (src/store/scripts/mod.rs) after the modules it
-- uses, bound to locals of their names, which the file reads as globals.
std = "lua51"
read_globals = { "redis", "KEYS", "ARGV", "cjson", "bit", "struct", "cmsgpack" }
-- The modules: KEEPS_STATE says whether they outlive a call.
files["src/store/scripts/decide.lua"] = { read_globals = { "KEEPS_STATE" } }
files["src/store/scripts/records.lua"] = { read_globals = { "KEEPS_STATE" } }
-- The scripts that use them.
files["src/store/scripts/commit.lua"] = { read_globals = { "decide", "records" } }
files["src/store/scripts/ledger.lua"] = { read_globals = { "KEEPS_STATE", "decide", "records", "commit" } }
files["src/store/scripts/scope.lua"] = { read_globals = { "decide" } }
