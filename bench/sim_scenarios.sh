#!/usr/bin/env bash
# The simulator benchmark: joule-sim on every shipped scenario (simulator/scenarios/*), and for
# each the policy's (min-energy's) energy against every baseline and the oracle, its budget
# violations and deadline misses: the figures for the aims of the joule-sim issue (at least 30 %
# less energy than round-robin and least-loaded, within 5 % of the oracle, no budget violation
# at the default risk); then knob settings against placement alone, and, for scenarios with a
# carbon signal (carbon-*), min-carbon's grams against run-now, fifo and carbon-only. Every joule
# is SIMULATED, every signal made up. Builds nothing: `ninja -C build joule-sim` first.
#
#   bench/sim_scenarios.sh [--build DIR] [--seeds "1 2 3"] [--scenario NAME]... [--keep DIR]
#                          [--sim-arg ARG]...   (passed to every joule-sim run: --knob-probes networks)
#                          [--scenarios-dir DIR] (default simulator/scenarios; simulator/held-out: held out)
#
# Each (scenario, seed) is one joule-sim run with --json (about 2-10 s on a 2-core VM, most of
# it learning the device models from simulated probes). --keep DIR keeps the JSON of each run.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build="$here/../build"
seeds="1 2 3"
scenarios=()
keep=""
sim_args=()
scenarios_dir="$here/../simulator/scenarios"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --seeds) seeds=$2; shift 2 ;;
    --scenario) scenarios+=("$2"); shift 2 ;;
    --keep) keep=$2; shift 2 ;;
    --sim-arg) sim_args+=("$2"); shift 2 ;;
    --scenarios-dir) scenarios_dir=$2; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
sim="$build/simulator/joule-sim"
[[ -x "$sim" ]] || { echo "no $sim: run ninja -C $build joule-sim" >&2; exit 1; }
if [[ ${#scenarios[@]} -eq 0 ]]; then
  for dir in "$scenarios_dir"/*/; do scenarios+=("$(basename "$dir")"); done
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

for scenario in "${scenarios[@]}"; do
  dir="$scenarios_dir/$scenario"
  for seed in $seeds; do
    "$sim" --cluster "$dir/cluster.toml" --trace "$dir/trace.jsonl" --policy "$dir/policy.toml" \
      --seed "$seed" ${sim_args[@]+"${sim_args[@]}"} --json > "$out/$scenario.$seed.json"
  done
done
[[ -n "$keep" ]] && { mkdir -p "$keep"; cp "$out"/*.json "$keep"/; }

python3 - "$out" "${scenarios[@]}" <<'EOF'
import json, os, sys

out, scenarios = sys.argv[1], sys.argv[2:]
print("joule-sim scenarios; every joule SIMULATED; ratio = policy's energy / the row's energy "
      "(total; per completed job in brackets where the counts differ)")
aims = []
knob_aims = []
carbon_rows = []
price_rows = []
unit_violations = []
packing_rows = []
for scenario in scenarios:
    files = sorted(f for f in os.listdir(out) if f.startswith(scenario + "."))
    for name in files:
        report = json.load(open(os.path.join(out, name)))
        runs = report["runs"]
        policy = runs[0]
        seed = report["seed"]
        print(f"\n{scenario}, seed {seed}: {report['jobs']} jobs on {report['devices']} devices, "
              f"policy {policy['name']}")
        print(f"  {'run':<14} {'energy kWh':>10} {'policy/run':>17} {'done':>8} {'budget viol.':>16} "
              f"{'late':>5} {'below floor':>11} {'battery empty':>13} {'throttle':>8} {'makespan':>9} {'wait p95':>9}")
        for run in runs:
            e, pe = run["energy"]["joules"], run["energy"]["per_completed_job_joules"]
            ratio = policy["energy"]["joules"] / e if e > 0 else float("nan")
            text = f"{ratio:.3f}"
            if run["jobs"]["completed"] != policy["jobs"]["completed"] and pe > 0:
                text += f" ({policy['energy']['per_completed_job_joules'] / pe:.3f})"
            viol = run["budget_violations"]
            vtext = "0" if viol["count"] == 0 else f"{viol['count']} (+{viol['max_overrun_joules'] / 1e3:.0f} kJ)"
            floor_h = sum(run["battery_floor_violation_seconds"].values()) / 3600
            empty_h = sum(b["empty_seconds"] for b in run["battery"].values()) / 3600
            print(f"  {run['name']:<14} {e / 3.6e6:>10.3f} {text:>17} {run['jobs']['completed']:>4}/{run['jobs']['total']:<3} "
                  f"{vtext:>16} {run['deadline_misses']:>5} {floor_h:>10.1f}h {empty_h:>12.1f}h "
                  f"{run['throttle_actions']['count']:>8} {run['makespan_seconds'] / 3600:>8.1f}h "
                  f"{run['wait_seconds']['p95'] / 60:>7.0f}m")
        by = {r["name"]: r for r in runs}
        alone = by.get(policy["name"] + ", one job per device")
        if alone:
            # Jobs per hour over the makespan, energy per job: the jobs' own, and the node's with
            # its idle draw (jobs + idle until the last finish) spread over them.
            def per_hour(run):
                return run["jobs"]["completed"] / (run["makespan_seconds"] / 3600)
            def node_per_job(run):
                e = run["energy"]
                return (e["joules"] + e["idle_joules_not_counted"]) / max(1, run["jobs"]["completed"])
            packing_rows.append((scenario, seed, per_hour(policy), per_hour(alone),
                                 policy["energy"]["per_completed_job_joules"], alone["energy"]["per_completed_job_joules"],
                                 node_per_job(policy), node_per_job(alone), per_hour(by["oracle"]),
                                 policy["turnaround_seconds"]["mean"], alone["turnaround_seconds"]["mean"]))
        # Knobs, on one device too (a setting is chosen there as anywhere).
        knobbed = by.get(policy["name"] + "+knobs")
        if knobbed:
            def saving(run, than):
                return 1 - run["energy"]["joules"] / than["energy"]["joules"]
            knob_aims.append((scenario, seed, saving(knobbed, policy),
                              knobbed["makespan_seconds"] / policy["makespan_seconds"] - 1,
                              knobbed["deadline_misses"], policy["deadline_misses"],
                              knobbed["jobs"]["jobs_at_knob_settings"], knobbed["jobs"]["total"],
                              knobbed["jobs"].get("jobs_slowed_beyond_max_slowdown", 0),
                              knobbed["jobs"].get("jobs_within_5pct_of_best_setting", 0),
                              knobbed["jobs"].get("jobs_swept", 0), knobbed["jobs"].get("mean_setting_regret", 0.0),
                              saving(by["oracle+knobs"], by["oracle"]), saving(by["zeus-like"], by["least-loaded"]),
                              saving(knobbed, by["zeus-like"])))
        if report["devices"] < 2:
            continue  # one device: no placement to compare against the baselines
        def ratio(other):
            return policy["energy"]["joules"] / by[other]["energy"]["joules"]
        aims.append((scenario, seed, 1 - ratio("round-robin"), 1 - ratio("least-loaded"), ratio("oracle") - 1,
                     policy["budget_violations"]["count"], policy["deadline_misses"], by["fifo"]["deadline_misses"]))
        if all(r.get("carbon") for r in runs) and "min-carbon" in by and "min-energy" in by:
            grams = lambda name: by[name]["carbon"]["grams"]
            carbon_rows.append((scenario, seed, grams("min-carbon"), grams("min-energy"), grams("fifo"),
                                grams("carbon-only"), by["min-carbon"]["deadline_misses"],
                                by["min-energy"]["deadline_misses"], by["carbon-only"]["deadline_misses"],
                                by["min-carbon"]["budget_violations"]["count"],
                                by["min-carbon"]["makespan_seconds"] / by["min-energy"]["makespan_seconds"] - 1))
        if all(r.get("cost") for r in runs) and "min-cost" in by and "min-energy" in by:
            cost = lambda name: by[name]["cost"]["amount"]
            price_rows.append((scenario, seed, cost("min-cost"), cost("min-energy"), cost("fifo"),
                               by["min-cost"]["deadline_misses"], by["min-energy"]["deadline_misses"],
                               by["min-cost"]["makespan_seconds"] / by["min-energy"]["makespan_seconds"] - 1))
        # Budgets in grams or money: every run's overrun windows in those units.
        for run in runs:
            for window in run["budget_violations"]["windows"]:
                if window.get("unit", "joules") != "joules":
                    unit_violations.append((scenario, seed, run["name"], window["budget"], window["unit"],
                                            window["spent"], window["limit"]))

print("\nAims: >= 30 % less energy than round-robin and least-loaded; within 5 % of the oracle; "
      "0 budget violations")
print(f"  {'scenario':<12} {'seed':>4} {'less than rr':>13} {'less than ll':>13} {'vs oracle':>10} "
      f"{'violations':>10} {'late (fifo)':>12}")
for scenario, seed, rr, ll, oracle, viol, late, fifo_late in aims:
    mark = lambda ok: "" if ok else " *"
    print(f"  {scenario:<12} {seed:>4} {rr * 100:>11.1f}%{mark(rr >= 0.3):2} {ll * 100:>11.1f}%{mark(ll >= 0.3):2} "
          f"{oracle * 100:>+8.1f}%{mark(oracle <= 0.05):2} {viol:>10}{mark(viol == 0):2} {late:>5} ({fifo_late})")
print("  * : aim not met")

print("\nKnobs: the policy choosing settings too (+knobs) against placement alone. Aims: >= 20 % less "
      "energy, <= 10 % more makespan, no more deadline misses")
print(f"  {'scenario':<12} {'seed':>4} {'less energy':>12} {'makespan':>9} {'late':>9} {'at a setting':>13} "
      f"{'beyond':>6} {'sweep<=5%':>11} {'regret':>7} {'oracle+knobs':>13} {'zeus-like/ll':>13} {'+knobs/zeus':>12}")
for (scenario, seed, save, span, late, late_before, at, total, beyond, within, swept, regret, oracle_save, zeus_save,
     vs_zeus) in knob_aims:
    mark = lambda ok: "" if ok else " *"
    print(f"  {scenario:<12} {seed:>4} {save * 100:>10.1f}%{mark(save >= 0.2):2} {span * 100:>+7.1f}%{mark(span <= 0.1):2}"
          f" {late:>3} ({late_before:>2}){mark(late <= late_before):2} {at:>6}/{total:<6} {beyond:>6} {f'{within}/{swept}' if swept else '-':>11} {f'{regret * 100:.1f}%' if swept else '-':>7} {oracle_save * 100:>12.1f}% "
          f"{zeus_save * 100:>12.1f}% {vs_zeus * 100:>11.1f}%")
print("  less energy: 1 - +knobs / placement alone; beyond: jobs at a setting truly slower than they allowed;")
print("  sweep<=5%: jobs whose energy as run was within 5 % of the best setting (or default) of their device")
print("  within their slowdown, by true costs (an exhaustive sweep), of the jobs whose device had settings,")
print("  run no slower than allowed; regret: their mean energy over that best, less one (min-energy policies only)")
print("  oracle+knobs: the same with true costs (the ceiling);")
print("  zeus-like/ll: what just-in-time power-limit tuning saves over its own least-loaded placement;")
print("  +knobs/zeus: 1 - +knobs / zeus-like.  * : aim not met")
if packing_rows:
    print("\nPacking: the policy with jobs side by side on a device's cores, or on several GPUs at once, against the "
          "same with one job per device (each on one GPU) (SIMULATED; server-cpu's slices and server-gpu's all-reduce, "
          "see simulator/include/joule/simulator/world.hpp). Aim (cores): >= 3x the jobs an hour at <= 10 % more "
          "energy per job")
    print(f"  {'scenario':<14} {'seed':>4} {'jobs/h':>7} {'alone':>7} {'ratio':>6} {'kJ/job':>7} {'alone':>7} "
          f"{'change':>7} {'node kJ/job':>11} {'alone':>7} {'change':>7} {'oracle jobs/h':>13} "
          f"{'turnaround':>10} {'alone':>7}")
    for (scenario, seed, rate, rate_alone, per_job, per_job_alone, node, node_alone, oracle_rate, turnaround,
         turnaround_alone) in packing_rows:
        mark = lambda ok: "" if ok else " *"
        print(f"  {scenario:<14} {seed:>4} {rate:>7.1f} {rate_alone:>7.1f} {rate / rate_alone:>5.1f}x{mark(rate >= 3 * rate_alone):2}"
              f"{per_job / 1e3:>7.2f} {per_job_alone / 1e3:>7.2f} {(per_job / per_job_alone - 1) * 100:>+6.1f}%"
              f"{mark(per_job <= 1.1 * per_job_alone):2}{node / 1e3:>9.2f} {node_alone / 1e3:>7.2f} "
              f"{(node / node_alone - 1) * 100:>+6.1f}% {oracle_rate:>13.1f} {turnaround / 60:>8.1f}m "
              f"{turnaround_alone / 60:>6.1f}m")
    print("  node kJ/job: the jobs' energy and the device's idle draw until the last finish, per job; turnaround:")
    print("  submission to finish, mean over completed jobs.  * : aim not met")
if price_rows:
    print("\nPrices (cost of SIMULATED energy at each scenario's made-up prices per kWh): min-cost against run-now "
          "(min-energy) and fifo")
    print(f"  {'scenario':<16} {'seed':>4} {'min-cost':>10} {'run-now':>10} {'less':>7} {'fifo':>10} "
          f"{'late mc (now)':>14} {'makespan':>9}")
    for scenario, seed, mc, now, fifo, late, late_now, span in price_rows:
        less = 1 - mc / now if now > 0 else float("nan")
        print(f"  {scenario:<16} {seed:>4} {mc:>10.4g} {now:>10.4g} {less * 100:>6.1f}% {fifo:>10.4g} "
              f"{late:>6} ({late_now:>2})    {span * 100:>+8.1f}%")
if unit_violations:
    print("\nBudgets in grams or money overrun (SIMULATED energy at the scenario's signals), by run:")
    for scenario, seed, run, budget, unit, spent, limit in unit_violations:
        print(f"  {scenario:<16} {seed:>4} {run:<18} {budget}: {spent:.4g} of {limit:.4g} {unit}")
if carbon_rows:
    print("\nCarbon (grams CO2e of SIMULATED energy at each scenario's made-up signal): min-carbon against "
          "run-now (min-energy: the same placement, never deferred), fifo and carbon-only (waits for the lowest "
          "hour before the deadline, knowing nothing of run times). Aim: >= 25 % less than run-now on carbon-solar, "
          "no more deadline misses, no budget violations")
    print(f"  {'scenario':<14} {'seed':>4} {'min-carbon g':>12} {'run-now g':>10} {'less':>7} {'fifo g':>8} "
          f"{'carbon-only g':>13} {'late mc (now, co)':>18} {'viol.':>5} {'makespan':>9}")
    for scenario, seed, mc, now, fifo, only, late, late_now, late_only, viol, span in carbon_rows:
        less = 1 - mc / now if now > 0 else float("nan")
        print(f"  {scenario:<14} {seed:>4} {mc:>12.1f} {now:>10.1f} {less * 100:>6.1f}% {fifo:>8.1f} {only:>13.1f} "
              f"{late:>6} ({late_now:>2}, {late_only:>2}) {viol:>8} {span * 100:>+8.1f}%")
EOF
