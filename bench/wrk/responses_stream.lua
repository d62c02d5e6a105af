-- wrk script: POST a Responses API request with "stream": true (see common.lua).
--   BENCH_MODEL=canned-stream wrk -t1 -c1 -d10s -s bench/wrk/responses_stream.lua http://127.0.0.1:PORT/v1/responses
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(here .. "common.lua").install(true, true)
