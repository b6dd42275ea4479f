"""joule.Client and joule.progress against a real jouled (no PyTorch needed).

Jobs run under accounts of their own (as root) from jouled's clean environment: that they
`import joule` at all shows jouled put the package on their PYTHONPATH.
"""

import json
import math
import os
import subprocess
import sys
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]  # the package, and support.py beside this file

import joule  # noqa: E402
from support import PYTHON_DIR, SOURCE_DIR, Jouled  # noqa: E402

# Jobs run as other users: the interpreter must be one they can reach (not a pyenv shim in /root).
JOB_PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable

daemon = None


def setUpModule():
    global daemon
    daemon = Jouled()


def tearDownModule():
    if daemon is not None:
        daemon.stop()


def python_job(name, script, **extra):
    job = {"name": name, "run": {"command": [JOB_PYTHON, "-c", textwrap.dedent(script)]}}
    job.update(extra)
    return job


class ClientJobsTest(unittest.TestCase):
    def setUp(self):
        self.client = joule.Client(daemon.url)

    def test_a_job_imports_joule_from_jouled_and_reports_progress_with_a_step_projection(self):
        job = self.client.submit(python_job("progress", """
            import sys, time, joule
            print(joule.__file__)
            for epoch in range(1, 4):
                time.sleep(0.3)
                print(epoch, joule.progress(epoch, of=3, loss=1.0 / epoch) is not None)
        """, model={"input": {"shape": [4]}, "layers": [{"type": "linear", "out_features": 2}]},
            training={"batch_size": 2, "epochs": 3, "samples_per_epoch": 4}))
        self.assertEqual(job["state"], "queued")
        done = self.client.wait(job["id"], timeout=60)
        stderr = self.client.logs(job["id"], stream="stderr")
        self.assertEqual(done["state"], "succeeded", f"{done}\n{stderr}\n{daemon.log()}")
        self.assertEqual(stderr, "")
        stdout = self.client.logs(job["id"]).splitlines()
        # The tree's own package, or the copy jouled gives jobs where their accounts cannot reach
        # the tree (a clone under a 0700 home).
        expected = os.path.join(os.path.realpath(PYTHON_DIR), "joule", "__init__.py")
        self.assertTrue(stdout[0] == expected or stdout[0].endswith("-jobs/.jouled/python/joule/__init__.py"), stdout[0])
        # Epoch 1 is warm-up: STEP projects from epoch 2 on.
        self.assertEqual(stdout[1:], ["1 False", "2 True", "3 True"])
        self.assertEqual(done["progress"]["epoch"], 3)
        self.assertEqual(done["progress"]["epochs"], 3)
        messages = [event["message"] for event in done["events"]]
        self.assertTrue(any(message.startswith("STEP projection after epoch 2 of 3") for message in messages),
                        messages)
        shown = self.client.job(job["id"])
        self.assertEqual(shown["id"], job["id"])
        self.assertIn("projection", shown)
        self.assertGreater(shown["projection"]["stable_epochs"], 0)

    def test_progress_with_a_wrong_token_warns_once_and_the_job_goes_on(self):
        job = self.client.submit(python_job("wrong-token", """
            import os, joule
            os.environ["JOULE_JOB_TOKEN"] = "not-the-job-token"
            results = [joule.progress(epoch, of=3) for epoch in (1, 2, 3)]
            print("trained", results)
        """))
        done = self.client.wait(job["id"], timeout=60)
        self.assertEqual(done["state"], "succeeded", done)
        self.assertEqual(self.client.logs(job["id"]), "trained [None, None, None]\n")
        lines = self.client.logs(job["id"], stream="stderr").splitlines()
        self.assertEqual(len(lines), 1, lines)
        self.assertIn("HTTP 401", lines[0])
        self.assertIn("JOULE_JOB_TOKEN", lines[0])
        self.assertNotIn("progress", done)

    def test_a_job_keeps_its_own_pythonpath_after_joules(self):
        job = python_job("pythonpath", "import os; print(os.environ['PYTHONPATH'])")
        job["run"]["env"] = {"PYTHONPATH": "/opt/mine"}
        submitted = self.client.submit(job)
        done = self.client.wait(submitted["id"], timeout=60)
        self.assertEqual(done["state"], "succeeded", done)
        first, _, rest = self.client.logs(submitted["id"]).strip().partition(":")
        self.assertEqual(rest, "/opt/mine")
        # jouled's package first: the tree's own, or the copy jouled gives jobs in their directory
        # where their accounts cannot reach the tree (a clone under a 0700 home).
        self.assertTrue(first == os.path.realpath(PYTHON_DIR) or first.endswith("-jobs/.jouled/python"), first)

    def test_wait_times_out_and_cancel_ends_a_running_job(self):
        job = self.client.submit({"name": "sleeper", "run": {"command": ["sleep", "30"]}})
        with self.assertRaises(TimeoutError):
            self.client.wait(job["id"], timeout=0.3)
        answer = self.client.cancel(job["id"])
        self.assertEqual(answer["id"], job["id"])
        self.assertEqual(self.client.wait(job["id"], timeout=30)["state"], "cancelled")
        with self.assertRaises(joule.ApiError) as raised:
            self.client.cancel(job["id"])
        self.assertEqual(raised.exception.status, 409)

    def test_jobs_follows_pages_and_filters_by_state(self):
        ids = [self.client.submit({"name": f"page-{i}", "run": {"command": ["true"]}})["id"] for i in range(5)]
        for job_id in ids:
            self.assertEqual(self.client.wait(job_id, timeout=60)["state"], "succeeded")
        everything = [job["id"] for job in self.client.jobs()]
        paged = [job["id"] for job in self.client.jobs(page_size=2)]
        self.assertEqual(paged, everything)
        self.assertEqual(everything[-5:], ids)
        self.assertEqual([job["id"] for job in self.client.jobs(limit=3)], everything[:3])
        self.assertEqual([job["id"] for job in self.client.jobs(limit=3, page_size=2)], everything[:3])
        succeeded = self.client.jobs(state="succeeded")
        self.assertTrue(set(ids) <= {job["id"] for job in succeeded})
        self.assertTrue(all(job["state"] == "succeeded" for job in succeeded))
        with self.assertRaises(joule.ApiError) as raised:
            self.client.jobs(state="sleeping")
        self.assertEqual(raised.exception.status, 400)
        self.assertIn("sleeping", raised.exception.detail)

    def test_submit_takes_a_job_file(self):
        path = os.path.join(daemon.work_dir, "job.json")
        with open(path, "w", encoding="utf-8") as file:
            json.dump({"name": "from-file", "run": {"command": ["sh", "-c", "echo 0123456789"]}}, file)
        job = self.client.submit(path)
        self.assertEqual(job["name"], "from-file")
        self.client.wait(job["id"], timeout=60)
        self.assertEqual(self.client.logs(job["id"], tail_bytes=4), "789\n")


class ClientEstimateTest(unittest.TestCase):
    def setUp(self):
        self.client = joule.Client(daemon.url)

    def test_estimate_counts_a_bundled_spec_and_names_each_device(self):
        spec_path = os.path.join(SOURCE_DIR, "examples", "models", "lenet5.json")
        answer = self.client.estimate(spec_path, batch_size=64, samples_per_epoch=60000, epochs=2)
        layers = answer["model"]["layers"]
        self.assertEqual(answer["model"]["parameters"], sum(layer["parameters"] for layer in layers))
        self.assertEqual(layers[-1]["output_shape"], [10])
        self.assertEqual(answer["steps"], 2 * math.ceil(60000 / 64))
        devices = {row["device"]: row for row in answer["estimates"]}
        self.assertIn("cpu", devices)
        self.assertIn(devices["cpu"]["status"], ("ok", "no-model"))

    def test_runtime_is_sent_and_an_unknown_one_is_refused_at_its_pointer(self):
        spec_path = os.path.join(SOURCE_DIR, "examples", "models", "lenet5.json")
        answer = self.client.estimate(spec_path, batch_size=64, samples_per_epoch=640, runtime="python")
        self.assertIn("cpu", {row["device"] for row in answer["estimates"]})
        with self.assertRaises(joule.ApiError) as raised:
            self.client.estimate(spec_path, batch_size=64, samples_per_epoch=640, runtime="ruby")
        self.assertEqual(raised.exception.pointer, "/runtime")

    def test_a_refused_estimate_is_an_api_error_with_status_detail_and_pointer(self):
        model = {"input": {"shape": [3, 8, 8]}, "layers": [{"type": "linear", "out_features": 4}]}
        with self.assertRaises(joule.ApiError) as raised:
            self.client.estimate(model, {"batch_size": 2, "samples_per_epoch": 4})
        error = raised.exception
        self.assertEqual(error.status, 400)
        self.assertIn("linear", error.detail)
        self.assertTrue(error.pointer.startswith("/model/layers/0"), error.pointer)
        self.assertIn(error.pointer, str(error))
        with self.assertRaises(joule.ApiError) as raised:
            self.client.job("no-such-job")
        self.assertEqual(raised.exception.status, 404)

    def test_a_token_that_matches_none_is_refused_and_an_absent_daemon_is_an_api_error(self):
        with self.assertRaises(joule.ApiError) as raised:
            joule.Client(daemon.url, token="not-a-token").jobs()
        self.assertEqual(raised.exception.status, 401)
        with self.assertRaises(joule.ApiError) as raised:
            joule.Client("http://127.0.0.1:1").devices()
        self.assertIsNone(raised.exception.status)
        self.assertIn("cannot reach jouled", str(raised.exception))

    def test_the_url_comes_from_the_environment_like_joulectl(self):
        saved = {key: os.environ.pop(key, None) for key in ("JOULE_SERVER", "JOULE_URL", "JOULE_TOKEN")}
        try:
            self.assertEqual(joule.Client().url, joule.DEFAULT_URL)
            os.environ["JOULE_URL"] = daemon.url
            self.assertEqual(joule.Client().url, daemon.url)
            os.environ["JOULE_SERVER"] = "http://127.0.0.1:9"
            self.assertEqual(joule.Client().url, "http://127.0.0.1:9")
            os.environ["JOULE_TOKEN"] = "secret"
            self.assertEqual(joule.Client().token, "secret")
        finally:
            for key, value in saved.items():
                os.environ.pop(key, None)
                if value is not None:
                    os.environ[key] = value


class ProgressOutsideJouledTest(unittest.TestCase):
    def run_script(self, script, env):
        base = {key: value for key, value in os.environ.items() if not key.startswith("JOULE_")}
        base["PYTHONPATH"] = PYTHON_DIR
        base.update(env)
        return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=base, capture_output=True,
                              text=True, timeout=60)

    def test_without_jouled_progress_does_nothing(self):
        result = self.run_script("import joule; print(joule.progress(1, of=2))", {})
        self.assertEqual((result.returncode, result.stdout, result.stderr), (0, "None\n", ""))

    def test_an_unreachable_jouled_gets_one_warning_line(self):
        result = self.run_script("""
            import joule
            print([joule.progress(epoch, of=3) for epoch in (1, 2, 3)])
        """, {"JOULE_URL": "http://127.0.0.1:1", "JOULE_JOB_ID": "j1", "JOULE_JOB_TOKEN": "t"})
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout, "[None, None, None]\n")
        lines = result.stderr.splitlines()
        self.assertEqual(len(lines), 1, lines)
        self.assertIn("could not report epoch 1 of 3 to http://127.0.0.1:1", lines[0])


if __name__ == "__main__":
    unittest.main()
