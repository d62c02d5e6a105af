-- wrk script: POST a realistic chat request with "stream": true (see common.lua).
--   BENCH_MODEL=canned wrk -t1 -c1 -d10s -s bench/wrk/chat_stream.lua http://127.0.0.1:PORT/v1/chat/completions
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(here .. "common.lua").install(true)
