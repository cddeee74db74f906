"""The fleet protocol's server side: one Lua script per step, run atomically by Redis.

``docs/fleet-protocol.md`` is the spec; this module is its only server code. Every
script is idempotent under a client that re-sends it after a lost reply (redis-py
retries silently), and every key a script creates gets its TTL in that same script.

Names (``ns`` the namespace, ``d`` the SHA-256 hex of the key; ``{ns:d}`` is the hash
tag, so one flight's keys live in one Cluster slot):

- ``fg:{ns:d}``: the record (hash) of the key's running flight, or of its kept outcome.
  ``t`` token, ``s`` state (``R`` running, ``D`` done and kept), ``o`` the leading
  call's nonce, ``k`` the raw key, ``p`` / ``h`` the leader's pid and host, ``b`` its
  start (server µs), ``j`` joiners (a hint), ``a`` attempts; kept: ``c`` code, ``v``
  payload. TTL: the lease while running, the retention time once kept.
- ``fg:{ns:d}:x:<t>``: the record of flight ``t`` after ``forget`` parked it (it runs
  on, and lands for its joiners, while the next call leads a new flight).
- ``fg:{ns:d}:m:<t>``: the mailbox of flight ``t``, a stream of one entry: ``c`` the
  code (``ok``, ``err``, ``tmo``, ``int``, or ``next``: a retry moved the flight to the
  token in ``v``), ``v`` the payload, ``f`` = 1 when it was written for a flight that did
  not land (fenced or abandoned). TTL: the grace time.
- ``fg:{ns:d}:n:<t>``: the notice that a FORGET parked the running flight ``t``, a
  stream of one entry (``d`` = 1): its joiners read it beside the mailbox, and their
  process's local flight of ``t`` takes no new caller (ADR 0026). TTL: a minute.
- ``fg:{ns:d}:y:<t>``: flight ``t`` was parked by a FORGET and landed: a fresh ACQUIRE
  that names ``t`` (it came during ``t``) cannot take a newer flight as begun after it.
  TTL: the grace time.
- ``fg:{ns:d}:o:<nonce>``: the token of a running flight that a FORGET parked, under
  the nonce of the call that leads it: a re-sent ACQUIRE of that call (its reply lost)
  leads the parked flight again instead of a second one. TTL: a minute, as below.
- ``fg:{ns:d}:g:<nonce>``: a FORGET's answer, under the nonce of that ``forget``: a
  re-sent FORGET answers it again instead of acting twice. TTL: a minute, past
  redis-py's re-sends.
- ``fg:{ns}:fence`` (``fg:{ns:d}:f`` on a Cluster): the last token given out. TTL: a day.
- ``fg:{ns}:kept``, ``fg:{ns}:kept:x``, ``fg:{ns}:kept:b`` (not on a Cluster): the index
  of the namespace's kept outcomes, for Retention's LRU bounds. Members are kept records'
  names: by last use (server µs; a landing that keeps, and each ACQUIRE served from the
  record, is a use), by expiry (server µs: expired members are purged), and their sizes
  (a hash, with the sum in its field ``total``). TTL: at least the longest retention
  given to a member. Scripts that get these three keys keep it; without them (a Cluster,
  where they are in another slot than the records) only TTLs bound kept outcomes.

Tokens are ``max(last + 1, server time in µs)``: they grow per key and across keys of
one Redis (per key on a Cluster), survive the loss of the fence key (a restart without
persistence, a failover that lost writes), and stay exact below 2**53.
"""

from __future__ import annotations

__all__ = [
    "ABANDON",
    "ACQUIRE",
    "ATTEMPT",
    "CHECK",
    "COMPLETE",
    "FORGET",
    "OVER_MAX_VALUE_BYTES",
    "RENEW",
    "SCRIPTS",
    "UNDO",
]

# The text of COMPLETE's one deliberate refusal (a value over max_value_bytes): the
# arbiter tells it by this text from every other server error (OOM, BUSY, READONLY,
# LOADING, ...), which is passing and is tried again.
OVER_MAX_VALUE_BYTES = "flightgroup: the outcome is over max_value_bytes"

# A Lua prelude shared by the scripts that act on a flight by its token: the record
# holding token ``tok`` is the key's record, or the parked one.
# own_flight(rec, nonce, v): the running flight that the call of ``nonce`` leads, as (its
# key, its token), or nil. ``v`` is the record's HMGET starting with t, s, o. A re-sent
# ACQUIRE (its reply lost) leads that flight again, not a second one; after a FORGET
# parked it, FORGET left the nonce's token under ``…:o:<nonce>``, whatever the key's
# record holds now (the forgetting caller's next call may lead a newer flight at once).
# A nonce leads one flight only, so this is always that call's own.
_OWN = """
local function own_flight(rec, nonce, v)
  if v[1] and v[2] == 'R' and v[3] == nonce then return rec, v[1] end
  local parked = redis.call('GET', rec .. ':o:' .. nonce)
  if parked then
    local x = rec .. ':x:' .. parked
    local p = redis.call('HMGET', x, 't', 's', 'o')
    if p[1] == parked and p[2] == 'R' and p[3] == nonce then return x, parked end
  end
  return nil
end
"""

_FIND = """
local function find(rec, parked, tok)
  for _, key in ipairs({rec, parked}) do
    local v = redis.call('HMGET', key, 't', 's', 'j')
    if v[1] == tok then return key, v[2], v[3] or '0' end
  end
  return nil, nil, '0'
end
local function next_token(fence, ttl)
  local now = redis.call('TIME')
  local n = tonumber(redis.call('GET', fence) or '0') + 1
  local clock = tonumber(now[1]) * 1000000 + tonumber(now[2])
  if clock > n then n = clock end
  local text = string.format('%.0f', n)
  redis.call('SET', fence, text, 'PX', ttl)
  return text, clock
end
local function entry(stream)
  local e = redis.call('XRANGE', stream, '-', '+', 'COUNT', 1)
  if e[1] then return e[1][2] end
  return nil
end
local function field(fields, name)
  for i = 1, #fields, 2 do
    if fields[i] == name then return fields[i + 1] end
  end
  return nil
end
"""

# The kept-outcome index (see the module): ``idx`` is {by use, by expiry, sizes}, or nil
# when the caller sent no index keys (a Cluster). Never creates a key it does not give a
# TTL: ZREM, HDEL and ZADD XX create nothing; HINCRBY runs only on a hash that exists.
_INDEX = """
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function index_of(first)
  if KEYS[first + 2] then return {KEYS[first], KEYS[first + 1], KEYS[first + 2]} end
  return nil
end
local function unindex(idx, member)
  redis.call('ZREM', idx[1], member)
  redis.call('ZREM', idx[2], member)
  local size = redis.call('HGET', idx[3], member)
  if size then
    redis.call('HDEL', idx[3], member)
    redis.call('HINCRBY', idx[3], 'total', -tonumber(size))
  end
end
-- Keep `rec` (its outcome just kept for `retain` ms) in the index as its newest use,
-- after purging the expired members, and evict the least recently used others (their
-- records, if still kept, are deleted) until at most max_items and max_bytes (0: no
-- bound) are kept. The new one is never evicted: its size alone is within max_bytes.
local function keep_in(idx, rec, size, retain, max_items, max_bytes)
  local now = now_us()
  -- Every member is in the by-use set: without it, what the other two hold (left by an
  -- index whose keys expired a millisecond apart) counts nothing.
  if redis.call('EXISTS', idx[1]) == 0 then redis.call('DEL', idx[2], idx[3]) end
  local expired = redis.call('ZRANGEBYSCORE', idx[2], '-inf', string.format('%.0f', now))
  for _, member in ipairs(expired) do unindex(idx, member) end
  unindex(idx, rec)
  redis.call('ZADD', idx[1], string.format('%.0f', now), rec)
  redis.call('ZADD', idx[2], string.format('%.0f', now + retain * 1000), rec)
  redis.call('HSET', idx[3], rec, size)
  redis.call('HINCRBY', idx[3], 'total', size)
  while true do
    local over = max_items > 0 and redis.call('ZCARD', idx[1]) > max_items
    if not over and max_bytes > 0 then
      over = tonumber(redis.call('HGET', idx[3], 'total') or '0') > max_bytes
    end
    if not over then break end
    local lru = redis.call('ZRANGE', idx[1], 0, 1)
    local victim = lru[1]
    if victim == rec then victim = lru[2] end
    if not victim then break end
    -- only a kept outcome goes: the member's record may hold a newer running flight
    if redis.call('HGET', victim, 's') == 'D' then redis.call('DEL', victim) end
    unindex(idx, victim)
  end
  -- The three keys share one deadline, decided once: an index whose sizes outlived its
  -- members by a millisecond would count, from then on, sizes that nobody holds. (Before
  -- Redis 7 the clock runs on inside a script: a PEXPIRE per key could differ by one.)
  if redis.call('PTTL', idx[1]) < retain then
    local until_ms = string.format('%.0f', math.floor(now / 1000) + retain)
    for _, k in ipairs(idx) do redis.call('PEXPIREAT', k, until_ms) end
  end
end
"""

# KEYS: record, fence[, the kept index: by use, by expiry, sizes].
# ARGV: nonce, lease ms, fence ttl ms, min token, pid, host, raw key[, after: the token
#       of the flight a fresh call came during, which min token is one above].
# -> {1, token, lease left ms}            lead
#    {2, token, lease left ms, pid, host, age µs}   join
#    {3, token, code, payload}            a kept outcome
#    {4, token, lease left ms}            fresh: a flight that began before the call runs;
#                                         wait for its end, then ask again from token + 1
ACQUIRE = _FIND + _INDEX + _OWN + """
local rec = KEYS[1]
local idx = index_of(3)
local v = redis.call('HMGET', rec, 't', 's', 'o', 'c', 'v', 'p', 'h', 'b')
local own, own_tok = own_flight(rec, ARGV[1], v)
if own then return {1, own_tok, redis.call('PTTL', own)} end
-- A fresh call that names the flight it came during (ARGV[8]) takes a flight above that
-- one as begun after the call, unless a FORGET parked that one (its landing left a mark):
-- a newer flight may have begun while it ran, so none that exists now will do.
local min = tonumber(ARGV[4])
if ARGV[8] and redis.call('EXISTS', rec .. ':y:' .. ARGV[8]) == 1 then
  min = 9007199254740992
end
if v[1] and tonumber(v[1]) >= min then
  if v[2] == 'D' then
    -- a hit is a use (LRU); XX: a record the index does not hold is not added
    if idx then redis.call('ZADD', idx[1], 'XX', string.format('%.0f', now_us()), rec) end
    return {3, v[1], v[4] or 'int', v[5] or ''}
  end
  redis.call('HINCRBY', rec, 'j', 1)
  local now = redis.call('TIME')
  local clock = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local age = clock - tonumber(v[8] or clock)
  return {2, v[1], redis.call('PTTL', rec), v[6] or '0', v[7] or '', string.format('%.0f', age)}
end
if v[1] and v[2] == 'R' then return {4, v[1], redis.call('PTTL', rec)} end
local tok, clock = next_token(KEYS[2], ARGV[3])
if idx and v[2] == 'D' then unindex(idx, rec) end  -- a fresh call replaces a kept outcome
redis.call('DEL', rec)
redis.call('HSET', rec, 't', tok, 's', 'R', 'o', ARGV[1], 'k', ARGV[7], 'p', ARGV[5],
  'h', ARGV[6], 'b', string.format('%.0f', clock), 'j', 0, 'a', 1)
redis.call('PEXPIRE', rec, ARGV[2])
return {1, tok, tonumber(ARGV[2])}
"""

# KEYS: record_1, parked_1, record_2, parked_2, ...  ARGV: lease ms, token_1, token_2, ...
# -> a 1 (renewed), 2 (renewed, and a FORGET parked it: ADR 0026) or 0 (lost) per flight.
RENEW = _FIND + """
local out = {}
for i = 1, #KEYS / 2 do
  local key, state = find(KEYS[2 * i - 1], KEYS[2 * i], ARGV[i + 1])
  if key and state == 'R' then
    redis.call('PEXPIRE', key, ARGV[1])
    if key == KEYS[2 * i] then out[i] = 2 else out[i] = 1 end
  else
    out[i] = 0
  end
end
return out
"""

# KEYS: record, parked, mailbox[, the kept index: by use, by expiry, sizes].
# ARGV: token, code, payload, retain ms, grace ms, max bytes (max_value_bytes)
#       [, size, max_items, max_bytes: Retention's, for a kept outcome; 0 = no bound].
# -> {1, joiners} landed (also when this is a retry of a landing that went through),
#    {0} fenced: the flight is no longer this leader's; its joiners are told `int`.
COMPLETE = _FIND + _INDEX + """
-- Only a value is bounded: a failure's payload (type, module, message) lands even over
-- the limit, so that a leader's ValueTooLargeError (or a long error message) reaches its
-- joiners at once and the leader keeps its lease.
if ARGV[2] == 'ok' and #ARGV[3] > tonumber(ARGV[6]) then
  return redis.error_reply('ERR """ + OVER_MAX_VALUE_BYTES + """')
end
local key, state, joiners = find(KEYS[1], KEYS[2], ARGV[1])
if key and state == 'D' then return {1, joiners} end
if not key or state ~= 'R' then
  local e = entry(KEYS[3])
  if e then
    -- landed only if the entry is this flight's own landing: not a fenced or
    -- abandoned one (f), nor a retry's `next` (the flight went on under a newer token)
    if field(e, 'f') == '1' or field(e, 'c') == 'next' then return {0} end
    return {1, '0'}
  end
  redis.call('XADD', KEYS[3], 'MAXLEN', '1', '*', 'c', 'int', 'v',
    'its leader lost its lease', 'f', '1')
  redis.call('PEXPIRE', KEYS[3], ARGV[5])
  return {0}
end
redis.call('XADD', KEYS[3], 'MAXLEN', '1', '*', 'c', ARGV[2], 'v', ARGV[3])
redis.call('PEXPIRE', KEYS[3], ARGV[5])
local retain = tonumber(ARGV[4])
local size, max_items, max_bytes = tonumber(ARGV[7] or '0'), tonumber(ARGV[8] or '0'),
  tonumber(ARGV[9] or '0')
local idx = index_of(4)
-- An outcome whose size alone is over Retention.max_bytes is not kept (and the key's
-- older kept outcome is gone already: this flight's record replaced it).
if retain > 0 and key == KEYS[1] and (max_bytes == 0 or size <= max_bytes) then
  redis.call('HSET', key, 's', 'D', 'c', ARGV[2], 'v', ARGV[3])
  redis.call('PEXPIRE', key, ARGV[4])
  if idx then keep_in(idx, key, size, retain, max_items, max_bytes) end
else
  redis.call('DEL', key)
  -- A running record is in the index only if it replaced a kept outcome behind the
  -- index's back (evicted, deleted): one lookup, not unindex's three writes, on every
  -- landing that keeps nothing. (The by-use set holds every member: see keep_in.)
  if idx and key == KEYS[1] and redis.call('ZSCORE', idx[1], key) then
    unindex(idx, key)
  end
  if key ~= KEYS[1] then  -- a parked (forgotten) flight: see ACQUIRE's ARGV[8]
    redis.call('SET', KEYS[1] .. ':y:' .. ARGV[1], '1', 'PX', ARGV[5])
  end
end
return {1, joiners}
"""

# KEYS: record, parked, mailbox. ARGV: token, grace ms, reason.
# -> 1 if this ended the flight, 0 if it had landed (a landing is never overwritten).
ABANDON = _FIND + """
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
-- The DEL first: at maxmemory under noeviction Redis refuses a script's first write
-- that can grow memory (an XADD first would end this script with nothing done, and
-- RENEW would keep the record alive), but once a script has written it may write on.
local key, state = find(KEYS[1], KEYS[2], ARGV[1])
if key and state == 'R' then redis.call('DEL', key) end
redis.call('XADD', KEYS[3], 'MAXLEN', '1', '*', 'c', 'int', 'v', ARGV[3], 'f', '1')
redis.call('PEXPIRE', KEYS[3], ARGV[2])
return 1
"""

# KEYS: record. ARGV: the nonce of an ACQUIRE that got no answer, grace ms, reason.
# -> 1 if it ended a flight that ACQUIRE led, 0 if there was none.
# A server that was frozen runs the commands it had buffered once it resumes, even from
# connections the client closed: an ACQUIRE whose caller gave up (UnavailableError) may
# still lead a flight nobody runs. Every call of the key would join it and wait its lease
# out. The caller's group sends this until Redis answers it (ADR 0024).
UNDO = _OWN + """
local rec = KEYS[1]
local key, tok = own_flight(rec, ARGV[1], redis.call('HMGET', rec, 't', 's', 'o'))
if not key then return 0 end
local m = rec .. ':m:' .. tok
if redis.call('EXISTS', m) == 0 then
  redis.call('XADD', m, 'MAXLEN', '1', '*', 'c', 'int', 'v', ARGV[3], 'f', '1')
  redis.call('PEXPIRE', m, ARGV[2])
end
redis.call('DEL', key)
return 1
"""

# KEYS: record, parked, mailbox. ARGV: token.  (read-only: a joiner whose wait timed out)
# -> {1, mailbox entry fields}  the outcome
#    {2, lease left ms}         still running
#    {0}                        gone without an outcome: interrupted
CHECK = _FIND + """
local e = entry(KEYS[3])
if e then return {1, e} end
local key, state = find(KEYS[1], KEYS[2], ARGV[1])
if key then
  if state == 'D' then
    local v = redis.call('HMGET', key, 'c', 'v')
    return {1, {'c', v[1], 'v', v[2]}}
  end
  return {2, redis.call('PTTL', key)}
end
return {0}
"""

# KEYS: record, parked, fence, mailbox of the old token.
# ARGV: old token, nonce, lease ms, fence ttl ms, grace ms.
# A retry: the flight gets a new token; its joiners find it in the old mailbox (`next`).
# -> {1, new token} or {0} (the flight is no longer this leader's: the lease is lost)
ATTEMPT = _FIND + """
local key, state = find(KEYS[1], KEYS[2], ARGV[1])
if not key or state ~= 'R' then
  local e = entry(KEYS[4])
  if e and field(e, 'c') == 'next' then
    local moved = field(e, 'v')
    for _, k in ipairs({KEYS[1], KEYS[1] .. ':x:' .. moved}) do
      local v = redis.call('HMGET', k, 't', 's', 'o')
      if v[1] == moved and v[2] == 'R' and v[3] == ARGV[2] then return {1, moved} end
    end
  end
  return {0}
end
local tok = next_token(KEYS[3], ARGV[4])
redis.call('HSET', key, 't', tok)
redis.call('HINCRBY', key, 'a', 1)
redis.call('PEXPIRE', key, ARGV[3])
if key ~= KEYS[1] then
  -- a parked flight is named by its token: it moves with it (same hash tag, same slot)
  redis.call('RENAME', key, KEYS[1] .. ':x:' .. tok)
end
redis.call('XADD', KEYS[4], 'MAXLEN', '1', '*', 'c', 'next', 'v', tok)
redis.call('PEXPIRE', KEYS[4], ARGV[5])
return {1, tok}
"""

# KEYS: record, and the forget's own nonce key (``fg:{ns:d}:g:<nonce>``; the arbiter
# always sends it)[, the kept index: by use, by expiry, sizes].
# ARGV: how long the nonce key is kept, ms.
# -> 0 nothing to forget, 1 a kept outcome dropped, 2 a running flight parked (it runs
# on for its joiners; the next call leads a new flight).
# A re-sent FORGET (its reply was lost; redis-py sends it again) finds its nonce and
# answers as the first send did, acting on nothing: the flight it would find now is
# another caller's newer one (led, or landed and kept, in the gap), which it must not
# park or delete.
FORGET = _INDEX + """
if KEYS[2] then
  local seen = redis.call('GET', KEYS[2])
  if seen then return tonumber(seen) end
end
local answer = 0
local v = redis.call('HMGET', KEYS[1], 't', 's', 'o')
if v[1] and v[2] == 'D' then
  redis.call('DEL', KEYS[1])
  local idx = index_of(3)
  if idx then unindex(idx, KEYS[1]) end
  answer = 1
elseif v[1] then
  redis.call('RENAME', KEYS[1], KEYS[1] .. ':x:' .. v[1])
  -- Its leading call's ACQUIRE may be re-sent (its reply lost): it finds its flight.
  if v[3] then redis.call('SET', KEYS[1] .. ':o:' .. v[3], v[1], 'PX', ARGV[1] or 60000) end
  -- Its joiners' processes read this beside its mailbox: their local flight of it must
  -- take no new caller (ADR 0026). A courtesy: read within a minute, or never needed.
  local notice = KEYS[1] .. ':n:' .. v[1]
  redis.call('XADD', notice, '*', 'd', '1')
  redis.call('PEXPIRE', notice, ARGV[1] or 60000)
  answer = 2
end
if KEYS[2] then redis.call('SET', KEYS[2], answer, 'PX', ARGV[1]) end
return answer
"""

SCRIPTS = {
    "acquire": ACQUIRE,
    "renew": RENEW,
    "complete": COMPLETE,
    "abandon": ABANDON,
    "check": CHECK,
    "attempt": ATTEMPT,
    "forget": FORGET,
    "undo": UNDO,
}
