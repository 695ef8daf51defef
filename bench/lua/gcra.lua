-- GCRA (generic cell rate algorithm) for one key, as a Redis script: the Redis baseline of
-- allot's benchmark harness. One call checks and charges one request of COST units.
--
-- KEYS[1]  the key's state: its theoretical arrival time (TAT), in microseconds
-- ARGV[1]  T, the emission interval: microseconds per unit (window / quota)
-- ARGV[2]  B, the burst: units that may pass back to back
-- ARGV[3]  COST, units this request takes
-- ARGV[4]  optional: now, in microseconds; absent or empty: the server's clock (TIME)
--
-- The math. A key's state is one time, TAT: when its bucket would be empty again at the
-- sustained rate. Let tat = max(TAT, now) (a bucket never saves credit from idle time beyond
-- a full burst) and new_tat = tat + COST * T. The bucket holds B * T of time, so the request
-- passes iff new_tat - now <= B * T; then TAT := new_tat. Otherwise it is denied, TAT is left
-- as it was, and it could pass after retry_after = new_tat - now - B * T.
--
-- Worked example (100 per minute, burst 20): T = 60 s / 100 = 600 ms, B * T = 12 s. With
-- every call at the same instant, call k sets new_tat - now = k * 600 ms: calls 1 to 20 pass
-- (20 * 600 ms = 12 s <= 12 s); call 21 would make it 12.6 s, 600 ms too far: denied with
-- retry_after 600 ms. 600 ms later, the 22nd call passes.
--
-- Returns {allowed (1 or 0), remaining units, retry_after_us (0 when allowed, -1 when COST > B
-- can never pass), reset_after_us (until the bucket is full again)}.
-- The key expires when its bucket is full again: an absent key means the same thing.

local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local now
if ARGV[4] ~= nil and ARGV[4] ~= '' then
  now = tonumber(ARGV[4])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then
  tat = now
end
local capacity = burst * interval
local new_tat = tat + cost * interval

if new_tat - now > capacity then
  local retry_after = new_tat - now - capacity
  if cost > burst then
    retry_after = -1
  end
  local remaining = math.floor((capacity - (tat - now)) / interval)
  return {0, remaining, retry_after, tat - now}
end

local reset_after = new_tat - now
redis.call('SET', KEYS[1], new_tat, 'PX', math.ceil(reset_after / 1000))
return {1, math.floor((capacity - reset_after) / interval), 0, reset_after}
