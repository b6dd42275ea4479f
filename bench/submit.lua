-- wrk script for bench/submit_bench.sh: POST /v1/jobs (default) or GET /v1/jobs/{id}.
--
--   wrk -t2 -c8 -d10s -s bench/submit.lua http://127.0.0.1:PORT
--
-- Environment:
--   BENCH_MODE   "post" (default): every request submits one job; the expected status is 201
--                (jouled answers 201 only after the job is committed to SQLite).
--                "get": every request reads one job; the expected status is 200.
--   BENCH_JOB_ID the job to read in "get" mode.
--   BENCH_PATH   in "get" mode, a path to read instead of /v1/jobs/{BENCH_JOB_ID} (a listing).
--   BENCH_BODY   the JSON to submit in "post" mode (default: a job running `true`).
--
-- Every response's status is counted per wrk thread; done() adds them up and prints one
-- machine-readable line, "RESULT key=value ...", that the driver parses. Latencies are in
-- microseconds, from wrk's own histogram (which covers every completed request).

local mode = os.getenv("BENCH_MODE") or "post"
local job_id = os.getenv("BENCH_JOB_ID") or ""
local path = os.getenv("BENCH_PATH") or ""
local body = os.getenv("BENCH_BODY") or '{"name":"b","run":{"command":["true"]},"priority":0}'

local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  counts = {}     -- status -> count, per thread (read back by done() through thread:get)
  expected = mode == "get" and 200 or 201
  unexpected = 0
  if mode == "get" then
    wrk.method = "GET"
    wrk.body = nil
    wrk.headers["Content-Type"] = nil
    request_text = wrk.format("GET", path ~= "" and path or ("/v1/jobs/" .. job_id))
  else
    request_text = wrk.format("POST", "/v1/jobs", { ["Content-Type"] = "application/json" }, body)
  end
end

function request()
  return request_text
end

function response(status, headers, resp_body)
  counts[status] = (counts[status] or 0) + 1
  if status ~= expected then
    unexpected = unexpected + 1
    -- Keep a sample of what went wrong (first one per thread) for the report.
    if first_unexpected == nil then
      first_unexpected = tostring(status) .. " " .. string.sub(resp_body or "", 1, 200):gsub("[\r\n]", " ")
    end
  end
end

function done(summary, latency, requests)
  local total = {}
  local bad = 0
  local sample = ""
  for _, thread in ipairs(threads) do
    local c = thread:get("counts")
    for status, n in pairs(c) do
      total[status] = (total[status] or 0) + n
    end
    bad = bad + thread:get("unexpected")
    local s = thread:get("first_unexpected")
    if s and sample == "" then sample = s end
  end
  local expected_status = mode == "get" and 200 or 201
  local statuses = {}
  for status, n in pairs(total) do
    table.insert(statuses, status .. ":" .. n)
  end
  table.sort(statuses)
  local e = summary.errors
  local seconds = summary.duration / 1e6
  io.write(string.format(
    "RESULT mode=%s requests=%d seconds=%.3f rps=%.1f p50_us=%d p90_us=%d p99_us=%d max_us=%d " ..
    "expected=%d unexpected=%d statuses=%s connect_errors=%d read_errors=%d write_errors=%d timeouts=%d\n",
    mode, summary.requests, seconds, summary.requests / seconds,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max,
    expected_status, bad, table.concat(statuses, ","), e.connect, e.read, e.write, e.timeout))
  if sample ~= "" then
    io.write("UNEXPECTED_SAMPLE " .. sample .. "\n")
  end
end
