# Sourced by the scripts that load sluicegate's check library into a redis-server of their
# own (bench, redis-cost, redis-instructions): the library as the store sends it, its
# pieces in the order crates/sluicegate/src/store/redis/script.rs includes them, the
# arguments of a plain check as the store sends them, and the naive sorted-set script the
# library is measured against. Needs $repo, the repository's root. A test of the crate
# (store/redis/script/library_tests.rs) holds the first two to what the store does.

# check_library [REV]: the joined chunk on standard output, at revision REV or, without
# one, in the checkout, each line that is only a comment left empty, as the store sends it
# (script.rs, library_source); a revision whose store sent its comments gets them emptied
# too, which changes no figure per call (Lua reads a library once). Fails when there are no
# pieces to join.
check_library() {
  local - rev=${1:-} dir=crates/sluicegate/src/store/redis pieces piece
  set -o pipefail # a piece that cannot be read fails the call, sed or not
  mapfile -t pieces < <(repository_file "$rev" "$dir/script.rs" |
    sed -n 's|.*include_str!("lua/\(.*\)\.lua").*|\1|p')
  [ ${#pieces[@]} -gt 0 ] || return 1
  for piece in "${pieces[@]}"; do
    repository_file "$rev" "$dir/lua/$piece.lua" | sed 's/^[[:space:]]*--.*$//' || return 1
  done
}

# repository_file REV PATH: PATH inside the repository, at REV or (REV empty) in the checkout.
repository_file() {
  if [ -n "$1" ]; then git -C "$repo" show "$1:$2"; else cat "$repo/$2"; fi
}

# one_rule_check ALGORITHM LIMIT WINDOW_US [LAYOUT]: the library's ARGV for a short call of
# plain checks of one rule, a value per line (prelude.lua's header): the shape — the rule
# (ALGORITHM's code, LIMIT, WINDOW_US, one bucket, capacity LIMIT, no emission interval,
# LAYOUT: 0 zset, the default, or 1 compact, no expiration jitter), cost 1 and mode check,
# joined by ':' — and no time, for Redis TIME. KEYS: one key per check.
one_rule_check() {
  printf '%s\n' "$1:$2:$3:1:$2:0:${4:-0}:0:1:check"
}

# naive_script: the naive sorted-set script, the reference of Redis' time per decision: a
# sliding log of ARGV[1] per ARGV[2] µs at KEYS[1]; drop what expired, count, add one member
# if under the limit; no clamp of time, no fields but allowed.
naive_script() {
  cat <<'LUA'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local window = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local n = redis.call('ZCARD', KEYS[1])
if n < tonumber(ARGV[1]) then
  redis.call('ZADD', KEYS[1], now, now .. ':' .. n)
  redis.call('PEXPIRE', KEYS[1], math.floor(window / 1000))
  return 1
end
return 0
LUA
}

# store_shaped_key NAME WINDOW_US [TAGGED]: a key as long as those the store writes for a
# sliding log of WINDOW_US µs in `sluicegate bench` (keys.rs: a prefix, a hash tag, the
# rule's identity, the descriptor's value; 90 characters for a window of a second), NAME
# (five letters: bench, naive) in its prefix. TAGGED is the part that holds the hash tag:
# by default redis-benchmark's __rand_int__ (12 digits) padded to the store's 16; on a
# cluster, redis-benchmark --cluster's '{tag}:__rand_int__'. Redis hashes and copies a key
# once per command, so an anchor keyed so pays for its keys as the store does.
store_shaped_key() {
  printf 'sluicegate:%s:1541:%s:s:33:3:cli|sliding-log|w=%s|cpt3:bench:86480\n' \
    "$1" "${3:-{__rand_int__9999\}}" "$2"
}
