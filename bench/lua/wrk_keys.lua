-- wrk script: every request carries one of N API keys, `x-api-key: key-<1..N>`, picked at
-- random; N is the script's first argument (`wrk ... -s wrk_keys.lua <url> -- 1000`), 1,000
-- when none is given. `allot-bench envoy-load --keys N` runs it.
local keys = 1000

function init(args)
  if args[1] ~= nil then
    keys = tonumber(args[1])
  end
end

request = function()
  return wrk.format(nil, nil, { ["x-api-key"] = "key-" .. math.random(keys) })
end
