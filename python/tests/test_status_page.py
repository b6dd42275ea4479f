"""jouled's status page (GET /) in a real headless Chromium against real jouled processes.

The page must load without a single console error (exceptions, console.error, failed loads,
Content-Security-Policy refusals: everything the DevTools protocol reports at level error), show
the devices with their meters and models, the jobs the test submits where they are (running,
queued with the reason they wait, recent with the estimate beside the metered joules), the
budgets with their burn-down, and a coordinator's nodes. Where tokens are required the page
shows nothing until it is given one with the read scope, and keeps it in sessionStorage only.

Needs Debian's chromium (scripts/install-deps.sh installs it); skips, saying so, without it.
"""

import hashlib
import http.client
import ipaddress
import json
import os
import shutil
import socket
import sqlite3
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE]

from browser import Chromium, chromium_binary  # noqa: E402
from support import CONFIG, Jouled, wait_for  # noqa: E402

SIM = "sim:laptop-cpu"
MODEL = {"input": {"shape": [16]}, "layers": [{"type": "linear", "out_features": 8}, {"type": "relu"},
                                              {"type": "linear", "out_features": 2}]}
TRAINING = {"batch_size": 8, "epochs": 1, "samples_per_epoch": 64}
TOKENS = {"reader": "status-page-reader-token", "alice": "status-page-alice-token", "nobody": "status-page-nobody"}
SCOPES = {"reader": ["read"], "alice": ["submit"], "nobody": []}
WAIT_REASONS = ("behind", "device-busy", "no-free-device", "budget", "max-energy", "power-cap", "battery-floor",
                "deadline", "no-estimate", "unavailable")


def setUpModule():
    if chromium_binary() is None:
        print("SKIPPED: chromium is not installed; on Debian: apt install chromium (scripts/install-deps.sh)",
              file=sys.stderr)
        raise unittest.SkipTest("chromium is not installed (apt install chromium)")


def non_loopback_address():
    """An IPv4 address of this machine other than loopback (the one its default route leaves
    from; connecting a UDP socket sends nothing), or None."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))
        address = probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()
    return None if ipaddress.ip_address(address).is_loopback else address


def request(daemon, method, path, body=None, token=None):
    connection = http.client.HTTPConnection(daemon.host, daemon.port, timeout=30)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        connection.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
        response = connection.getresponse()
        data = response.read()
        return response.status, response.headers, data
    finally:
        connection.close()


def api(daemon, method, path, body=None, token=None, status=200):
    code, _, data = request(daemon, method, path, body, token)
    if code != status:
        raise AssertionError(f"{method} {path}: {code}, wanted {status}: {data[:500]!r}")
    return json.loads(data)




def row_of(table, job_id):
    """JavaScript: the texts of the cells of the row of `table` whose first cell is the job's id."""
    return (f"(() => {{ const row = [...document.querySelectorAll('#{table} tbody tr')]"
            f".find((r) => r.cells[0] && r.cells[0].textContent === {json.dumps(job_id)});"
            f" return row ? [...row.cells].map((c) => c.innerText) : null; }})()")


def in_page(text):
    return f"document.documentElement.outerHTML.includes({json.dumps(text)})"


class StatusPageTest(unittest.TestCase):
    def setUp(self):
        self.daemons = []
        self.directories = []

    def tearDown(self):
        for daemon in reversed(self.daemons):
            daemon.stop()
        for directory in self.directories:
            shutil.rmtree(directory, ignore_errors=True)

    def start(self, config, policies=None, host="127.0.0.1", state_dir=None):
        if policies:
            directory = tempfile.mkdtemp(prefix="joule-page-policies-")
            self.directories.append(directory)
            for name, text in policies.items():
                with open(os.path.join(directory, name), "w", encoding="utf-8") as file:
                    file.write(text)
            config += f'[policy]\ndirectory = "{directory}"\n'
        daemon = Jouled(config, host=host, state_dir=state_dir)
        self.daemons.append(daemon)
        return daemon

    def browser(self):
        chromium = Chromium()
        self.addCleanup(chromium.close)
        return chromium

    def assert_clean(self, chromium, since=0):
        errors = [error for error in chromium.console_errors()[since:]]
        self.assertEqual(errors, [], f"console errors; chromium's log:\n{chromium.log()}")
        self.assertFalse(chromium.evaluate("document.getElementById('page-errors').textContent"))
        text = chromium.evaluate("document.body.innerText")
        for slip in ("[object", "undefined", "NaN"):  # a value the page failed to format
            self.assertNotIn(slip, text)

    def sim_ready(self, daemon, token=None):
        def ready():
            devices = api(daemon, "GET", "/v1/devices", token=token)["devices"]
            return all(device["model"]["state"] == "ready" for device in devices if device["name"].endswith(SIM))
        wait_for(f"the {SIM} model", ready)

    # ------------------------------------------------------------------ a node, no tokens

    def test_a_node_shows_devices_queue_budgets_and_the_jobs_submitted(self):
        # A cpufreq policy as the kernel lays it out (intel_pstate), for a job's CPU frequency knob.
        cpufreq = tempfile.mkdtemp(prefix="joule-page-cpufreq-")
        self.addCleanup(shutil.rmtree, cpufreq, True)
        policy = os.path.join(cpufreq, "policy0")
        os.makedirs(policy)
        for name, value in {"cpuinfo_min_freq": "400000", "cpuinfo_max_freq": "4700000", "scaling_min_freq": "400000",
                            "scaling_max_freq": "4700000", "scaling_driver": "intel_pstate",
                            "scaling_governor": "powersave", "affected_cpus": "0"}.items():
            with open(os.path.join(policy, name), "w") as f:
                f.write(value + "\n")
        node = self.start(
            CONFIG + f'[node]\nname = "pagetest"\n[carbon]\nintensity = 300\n'
            f'[[devices]]\nname = "cpu"\ncpufreq = "{cpufreq}"\n'
            f'[[devices]]\nname = "{SIM}"\nprobes = 40\nruns_jobs = true\n',
            policies={"10-page.toml": (
                '[[budgets]]\nname = "node-day"\nscope = "node"\ntarget = "pagetest"\n'
                'joules = 1_000_000\ncalendar = "day"\n'
                f'[[budgets]]\nname = "sim-hour"\nscope = "device"\ntarget = "{SIM}"\n'
                'joules = 500_000\nwindow = "1h"\n'
                f'[[power_caps]]\nname = "sim-cap"\nscope = "device"\ntarget = "{SIM}"\n'
                'watts = 100000\naverage_seconds = 60\n')})
        self.sim_ready(node)
        constraints = {"devices": [SIM]}
        first = api(node, "POST", "/v1/jobs", {"name": "page-first", "model": MODEL, "training": TRAINING,
                                               "run": {"command": ["sleep", "120"]}, "constraints": constraints},
                    status=201)["id"]
        wait_for("the first job to run", lambda: api(node, "GET", f"/v1/jobs/{first}")["state"] == "running")
        knobbed = api(node, "POST", "/v1/jobs", {"name": "page-knobs", "run": {"command": ["sleep", "120"]},
                                                 "knobs": {"cpu_max_frequency_mhz": 1600},
                                                 # the node's budget admits a job without a model only so
                                                 "constraints": {"max_energy_joules": 10_000}}, status=201)["id"]
        wait_for("the knobbed job to run", lambda: api(node, "GET", f"/v1/jobs/{knobbed}")["state"] == "running")
        second = api(node, "POST", "/v1/jobs", {"name": "page-second", "model": MODEL, "training": TRAINING,
                                                "run": {"command": ["sleep", "0.2"]}, "constraints": constraints},
                     status=201)["id"]

        # The page itself: HTML under a policy that lets only its own inline script and style run.
        status, headers, body = request(node, "GET", "/")
        self.assertEqual(status, 200)
        self.assertEqual(headers["Content-Type"], "text/html; charset=utf-8")
        policy = headers["Content-Security-Policy"]
        self.assertIn("default-src 'none'", policy)
        self.assertIn("connect-src 'self'", policy)
        self.assertNotIn("unsafe-inline", policy)
        self.assertEqual(headers["X-Content-Type-Options"], "nosniff")
        self.assertNotIn(first.encode(), body, "the page itself holds no data")
        status, _, body = request(node, "HEAD", "/")
        self.assertEqual((status, body), (200, b""))

        chromium = self.browser()
        chromium.navigate(node.url + "/")
        running = chromium.wait_until("the running job", row_of("running", first))
        self.assertIn("running", running[2])
        self.assertEqual(running[3], SIM)
        self.assertIn("simulated", running[6], "the estimate on its device, with its source")
        with_knobs = chromium.wait_until("the job running at its knobs", row_of("running", knobbed))
        self.assertIn("knobs: cpu_max_frequency_mhz 1600 (policy0 1600 MHz)", with_knobs[3])
        queued = chromium.wait_until("the queued job", row_of("queue", second))
        self.assertIn(queued[5], WAIT_REASONS, f"the reason it waits: {queued}")
        self.assertTrue(queued[6], "the message saying why")

        devices = chromium.evaluate("[...document.querySelectorAll('#devices tbody tr')].map((r) => r.innerText)")
        self.assertEqual(len(devices), 2, devices)
        sim_row = next(row for row in devices if row.startswith(SIM))
        self.assertIn("simulated", sim_row, "the meter source")
        self.assertIn("ready", sim_row, "the model's state")
        self.assertIn(first, sim_row, "the job it runs")
        cpu_row = next(row for row in devices if row.startswith("cpu"))
        self.assertIn("none", cpu_row, "no model on the cpu")

        budgets = chromium.evaluate("[...document.querySelectorAll('#budgets .budget')].map((b) => b.innerText)")
        self.assertEqual(len(budgets), 2, budgets)
        day = next(text for text in budgets if text.startswith("node-day"))
        for term in ("limit", "spent", "reserved", "remaining", "resets", " J"):
            self.assertIn(term, day)
        self.assertEqual(chromium.evaluate("document.querySelectorAll('#budgets svg.burn .ideal').length"), 1,
                         "the calendar budget's even pace")
        self.assertEqual(chromium.evaluate("document.querySelectorAll('#budgets svg.burn .now').length"), 2)
        self.assertIn("sim-cap", chromium.evaluate("document.getElementById('caps').innerText"))
        self.assertIn("pagetest", chromium.evaluate("document.getElementById('where').textContent"))
        self.assertIn("grid 300 g CO2e/kWh (constant)", chromium.evaluate("document.getElementById('summary').textContent"))

        # The first is cancelled, so the second runs; once it ended the page (refreshed every
        # 5 s) shows both among the recent jobs, the second with its estimate beside its metered
        # joules and the error between them.
        api(node, "DELETE", f"/v1/jobs/{first}", status=202)
        wait_for(f"job {second} to end", lambda: api(node, "GET", f"/v1/jobs/{second}")["state"] == "succeeded")
        recent = chromium.wait_until("the second job among the recent ones, ended",
                                     f"(r => r && r[2].includes('succeeded') && r)({row_of('recent', second)})",
                                     timeout=30)
        job = api(node, "GET", f"/v1/jobs/{second}")
        self.assertIn("simulated", recent[6], f"estimate: {recent}")
        self.assertIn("simulated", recent[7], f"metered: {recent}")
        self.assertIn("g CO2e", recent[7], f"its grams at the node's constant: {recent}")
        self.assertIn("%", recent[8], f"the estimate's error: {recent}")
        self.assertIn("2σ", recent[8])
        self.assertIn(f"{100 * job['estimate_error']['relative']:.1f} %".lstrip("-"), recent[8].replace("+", ""))
        chromium.wait_until("the first job, cancelled",
                            f"(r => r && r[2].includes('cancelled'))({row_of('recent', first)})", timeout=30)
        order = chromium.evaluate("[...document.querySelectorAll('#recent tbody tr')].map((r) => r.cells[0].textContent)")
        # (the knobbed job, submitted between them and still running, may stand between them)
        self.assertEqual([job_id for job_id in order if job_id in (first, second)], [second, first], "newest first")
        self.assert_clean(chromium)

    # ------------------------------------------------------------------ a setting the policy chose

    def test_a_finished_job_shows_the_setting_chosen_for_it_what_was_predicted_and_its_check(self):
        # A setting is chosen only on hardware whose knobs change a job's cost, which this machine
        # lacks (its simulated devices have no knobs): the job's row is given the record a jouled
        # that chose one writes (jobs.chosen_setting, as chosen_setting.cpp stores it), and from
        # there the path is the real one: the database read at start, the API, the page.
        state = tempfile.mkdtemp(prefix="joule-page-state-")
        os.chmod(state, 0o755)  # jobs run under accounts of their own: their directories are beside it
        self.addCleanup(shutil.rmtree, state, True)
        config = CONFIG + f'[[devices]]\nname = "{SIM}"\nprobes = 40\nruns_jobs = true\n'
        first = self.start(config, state_dir=os.path.join(state, "state"))
        self.sim_ready(first)
        job_id = api(first, "POST", "/v1/jobs", {"name": "page-setting", "model": MODEL, "training": TRAINING,
                                                  "run": {"command": ["true"]}, "constraints": {"devices": [SIM]}},
                     status=201)["id"]
        wait_for(f"job {job_id} to end", lambda: api(first, "GET", f"/v1/jobs/{job_id}")["state"] == "succeeded")
        first.stop()
        why = "checked in epochs 2 and 3: 0.80x the joules and 1.10x the time of the defaults"
        record = {"knob": "cpu_max_frequency_mhz", "value": 2800, "label": "2800 MHz", "goal": "min-energy",
                  "at_setting": {"joules": 800.0, "joules_std": 40.0, "seconds": 66.0},
                  "at_default": {"joules": 1000.0, "joules_std": 50.0, "seconds": 60.0}, "in_force": True,
                  "check": {"setting_epoch": 2, "default_epoch": 3, "energy_ratio": 0.8, "time_ratio": 1.1,
                            "kept": True, "why": why}}
        with sqlite3.connect(os.path.join(state, "state", "jouled.db")) as database:
            changed = database.execute("UPDATE jobs SET chosen_setting = ? WHERE id = ?",
                                       (json.dumps(record), job_id)).rowcount
        self.assertEqual(changed, 1)

        restarted = self.start(config, state_dir=os.path.join(state, "state"))
        chosen = api(restarted, "GET", f"/v1/jobs/{job_id}")["knobs"]["chosen"]
        self.assertEqual(chosen["label"], "2800 MHz")
        chromium = self.browser()
        chromium.navigate(restarted.url + "/")
        recent = chromium.wait_until("the job among the recent ones", row_of("recent", job_id))
        self.assertIn(SIM, recent[3])
        self.assertIn("at 2800 MHz (min-energy): 20 % less energy, 10 % more time predicted; its check kept it",
                      recent[3])
        title = chromium.evaluate(f"(() => {{ const row = [...document.querySelectorAll('#recent tbody tr')]"
                                  f".find((r) => r.cells[0].textContent === {json.dumps(job_id)});"
                                  f" return row.cells[3].querySelector('.knobs').title; }})()")
        self.assertEqual(title, why)
        self.assert_clean(chromium)

    # ------------------------------------------------------------------ tokens

    def test_with_tokens_the_page_shows_nothing_until_given_a_token_with_the_read_scope(self):
        # The browser must be a client jouled cannot identify without a token, as one on another
        # machine is: on loopback the kernel names its user (root and jouled's own account are
        # administrators), so jouled listens on this machine's other address (tokens required).
        address = non_loopback_address()
        if address is None:
            self.skipTest("this machine has no address but loopback to reach jouled as a remote browser would")
        lines = ['[auth]\nlocal_users = "none"\n']
        for name, token in TOKENS.items():
            digest = hashlib.sha256(token.encode()).hexdigest()
            lines.append(f'[[auth.tokens]]\nname = "{name}"\nsha256 = "{digest}"\nscopes = {json.dumps(SCOPES[name])}\n')
        node = self.start(CONFIG + "".join(lines), host=address)
        job = api(node, "POST", "/v1/jobs", {"name": "token-job", "run": {"command": ["sleep", "0"]}},
                  token=TOKENS["alice"], status=201)["id"]
        self.assertEqual(request(node, "GET", "/v1/jobs")[0], 401)
        self.assertEqual(request(node, "GET", "/")[0], 200, "the page is open: it holds no data")

        chromium = self.browser()
        chromium.navigate(node.url + "/")
        chromium.wait_until("the token form", "!document.getElementById('login').hidden")
        self.assertFalse(chromium.evaluate(in_page(job)), "no data without a token")
        self.assertTrue(chromium.evaluate("document.getElementById('data').hidden"))
        # The API's 401s are the only errors the console shows.
        self.assertTrue(all("401" in error for error in chromium.console_errors()), chromium.console_errors())

        def give(token):
            chromium.evaluate(f"document.getElementById('token').value = {json.dumps(token)};"
                              "document.getElementById('login').requestSubmit()")

        give("not-a-token-jouled-knows")
        chromium.wait_until("the refusal", "document.getElementById('login-why').textContent.includes('refused')")
        self.assertIsNone(chromium.evaluate("sessionStorage.getItem('joule.token')"), "a refused token is dropped")
        give(TOKENS["nobody"])
        chromium.wait_until("the missing scope", "document.getElementById('login-why').textContent.includes('read')")
        self.assertFalse(chromium.evaluate(in_page(job)))

        errors_before = len(chromium.console_errors())
        give(TOKENS["reader"])
        chromium.wait_until("the job, read with the token", row_of("recent", job))
        self.assertTrue(chromium.evaluate("document.getElementById('login').hidden"))
        self.assertEqual(chromium.evaluate("sessionStorage.getItem('joule.token')"), TOKENS["reader"])
        self.assertNotIn(TOKENS["reader"], chromium.evaluate("location.href"))
        self.assert_clean(chromium, since=errors_before)

        # A reload keeps the tab's token; "Forget token" drops it and the data with it.
        chromium.reload()
        chromium.wait_until("the job after a reload", row_of("recent", job))
        self.assertTrue(chromium.evaluate("document.getElementById('login').hidden"))
        self.assert_clean(chromium, since=errors_before)
        chromium.evaluate("document.getElementById('forget').click()")
        chromium.wait_until("the token form again", "!document.getElementById('login').hidden")
        self.assertFalse(chromium.evaluate(in_page(job)))
        self.assertIsNone(chromium.evaluate("sessionStorage.getItem('joule.token')"))

    # ------------------------------------------------------------------ a cluster

    def test_a_coordinator_shows_its_nodes_and_their_devices(self):
        coordinator = self.start(CONFIG + '[node]\nname = "coord"\n[cluster]\nrole = "coordinator"\n'
                                 'heartbeat_seconds = 0.2\nlost_after_seconds = 5\n')
        self.start(CONFIG + f'[node]\nname = "agent1"\n[[devices]]\nname = "{SIM}"\nprobes = 40\nruns_jobs = true\n'
                   f'[cluster]\nrole = "agent"\ncoordinator = "{coordinator.url}"\nheartbeat_seconds = 0.2\n')
        wait_for("the agent's sync", lambda: any(
            node["name"] == "agent1" and node["state"] == "ready"
            for node in api(coordinator, "GET", "/v1/nodes")["nodes"]))
        job = api(coordinator, "POST", "/v1/jobs", {"name": "cluster-job", "run": {"command": ["sleep", "0"]},
                                                    "constraints": {"devices": [SIM]}}, status=201)["id"]

        chromium = self.browser()
        chromium.navigate(coordinator.url + "/")
        nodes = chromium.wait_until("the agent's row", "[...document.querySelectorAll('#nodes tbody tr')]"
                                    ".map((r) => r.innerText).filter((t) => t.startsWith('agent1'))")
        self.assertIn("ready", nodes[0])
        self.assertIn(SIM, nodes[0])
        chromium.wait_until("the agent's device", in_page(f"agent1/{SIM}"))
        chromium.wait_until("the job", row_of("recent", job))
        self.assertIn("coordinator", chromium.evaluate("document.getElementById('where').textContent"))
        self.assert_clean(chromium)


if __name__ == "__main__":
    unittest.main()
