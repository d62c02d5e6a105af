-- wrk script: POST a Responses API request with "stream": false (see common.lua).
--   BENCH_MODEL=canned wrk -t1 -c1 -d10s -s bench/wrk/responses.lua http://127.0.0.1:PORT/v1/responses
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(here .. "common.lua").install(false, true)
