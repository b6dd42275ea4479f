#!/usr/bin/env bash
# What a knob setting's measured ratios read where the setting changes nothing: a fixture
# cpufreq tree (intel_pstate, 400-4700 MHz, laid out as the kernel does) given to a real jouled
# on a machine without cpufreq, with the real joule-worker and [knobs] goal = "min-energy". jouled
# measures a small MLP whole at the defaults and at its 3 CPU caps; the ratios printed are the
# machine's own noise between readings (joules modelled). Prints the cap file at the end: jouled
# must have put it back.
#
#   bench/knob_noise.sh [BUILD_DIR] [PORT]     (default build, 18555; about 1.5 min)
set -e
BUILD=$(realpath "${1:-build}")
PORT=${2:-18555}
D=$(mktemp -d /tmp/joule-knob-noise-XXXXXX); chmod 0755 "$D"; trap 'rm -rf "$D"' EXIT; mkdir -p $D/state $D/policies
P=$D/sys/devices/system/cpu/cpufreq/policy0; mkdir -p $P
echo 0 > $P/affected_cpus; echo 0 > $P/related_cpus
echo 400000 > $P/cpuinfo_min_freq; echo 4700000 > $P/cpuinfo_max_freq; echo 0 > $P/cpuinfo_transition_latency
echo 400000 > $P/scaling_min_freq; echo 4700000 > $P/scaling_max_freq; echo 4700000 > $P/scaling_cur_freq
echo intel_pstate > $P/scaling_driver; echo powersave > $P/scaling_governor; echo "performance powersave" > $P/scaling_available_governors
printf '[knobs]\ngoal = "min-energy"\nmax_slowdown = 0.5\n' > $D/policies/10-knobs.toml
cat > $D/jouled.toml <<T
[state]
directory = "$D/state"
[[devices]]
name = "cpu"
meter = "modelled"
cpufreq = "$D/sys/devices/system/cpu/cpufreq"
[probing]
enabled = false
python = ""
[policy]
directory = "$D/policies"
T
"$BUILD/daemon/jouled" --config $D/jouled.toml --listen 127.0.0.1:$PORT > $D/log 2>&1 &
PID=$!
sleep 3
MODEL='{"input":{"shape":[48]},"layers":[{"type":"linear","out_features":24},{"type":"relu"},{"type":"linear","out_features":10}]}'
curl -s -XPOST localhost:$PORT/v1/probes -d "{\"device\":\"cpu\",\"seconds\":300,\"models\":[{\"model\":$MODEL,\"training\":{\"batch_size\":16}}]}" > /dev/null
for i in $(seq 1 150); do
  n=$(curl -s localhost:$PORT/v1/devices | python3 -c 'import json,sys; d=json.load(sys.stdin)["devices"][0]["model"]["probing"].get("whole_networks",{}); print(sum(1 for s in d.get("settings",[]) if s["networks"]>=1))')
  [ "$n" = 3 ] && break; sleep 2
done
curl -s -XPOST localhost:$PORT/v1/estimate -d "{\"model\":$MODEL,\"training\":{\"batch_size\":16,\"samples_per_epoch\":1600}}" | python3 -c '
import json,sys
r=json.load(sys.stdin)["estimates"][0]
for s in r.get("settings",[]): print(s["label"], s["basis"], "energy x%.3f (log sd %.3f)" % (s["joules_ratio"], s["joules_log_std"]), "time x%.3f (log sd %.3f)" % (s["seconds_ratio"], s["seconds_log_std"]))'
kill $PID; wait $PID 2>/dev/null || true
cat $P/scaling_max_freq
