"""python3 -m joule spec and submit, run as a user would (subprocesses), the jobs by a real jouled."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]  # the package, and support.py beside this file

import joule  # noqa: E402
from support import PYTHON_DIR, Jouled, require_torch  # noqa: E402

JOB_PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable

daemon = None


def setUpModule():
    global daemon
    try:
        import torch  # noqa: F401
    except ImportError:
        return
    daemon = Jouled()


def tearDownModule():
    if daemon is not None:
        daemon.stop()


@require_torch
class CommandLineTest(unittest.TestCase):
    def setUp(self):
        # The user's project: a model module and a training script, in a directory the job's
        # own account can enter.
        self.project = tempfile.mkdtemp(prefix="joule-cli-")
        os.chmod(self.project, 0o755)
        shutil.copy(os.path.join(HERE, "networks.py"), self.project)
        with open(os.path.join(self.project, "train.py"), "w", encoding="utf-8") as file:
            file.write(textwrap.dedent("""
                import sys
                import joule
                print("args", sys.argv[1:])
                for epoch in (1, 2):
                    joule.progress(epoch, of=2)
                print("done")
            """))
        os.chmod(os.path.join(self.project, "train.py"), 0o644)

    def tearDown(self):
        shutil.rmtree(self.project, ignore_errors=True)

    def joule_cli(self, *args):
        env = {key: value for key, value in os.environ.items() if not key.startswith("JOULE_")}
        env["PYTHONPATH"] = PYTHON_DIR
        return subprocess.run([sys.executable, "-m", "joule", *args], cwd=self.project, env=env, capture_output=True,
                              text=True, timeout=120)

    def test_spec_prints_the_spec_of_a_factory(self):
        import torch

        import networks

        result = self.joule_cli("spec", "networks:lenet5", "--input", "1,28,28")
        self.assertEqual(result.returncode, 0, result.stderr)
        printed = json.loads(result.stdout)
        expected = joule.spec(networks.lenet5(), torch.zeros(2, 1, 28, 28), name="lenet5")
        self.assertEqual(printed, expected)
        self.assertEqual(result.stdout.count("\n"), len(expected["layers"]) + 1)  # one layer per line

        tokens = self.joule_cli("spec", "networks.py:lstm_classifier", "--input", "20", "--dtype", "token",
                                "--loss", "mse", "--model-name", "lstm")
        self.assertEqual(tokens.returncode, 0, tokens.stderr)
        spec = json.loads(tokens.stdout)
        self.assertEqual((spec["name"], spec["input"], spec["loss"]),
                         ("lstm", {"shape": [20], "dtype": "token"}, "mse"))

    def test_errors_are_one_line_and_exit_2(self):
        with open(os.path.join(self.project, "bad.py"), "w", encoding="utf-8") as file:
            file.write(textwrap.dedent("""
                import torch.nn as nn
                class Branchy(nn.Module):
                    def forward(self, x):
                        return x if x.sum() > 0 else -x
                def branchy():
                    return Branchy()
            """))
        for args, expected in [
            (("spec", "nosuchmodule:f", "--input", "3"), "cannot import nosuchmodule"),
            (("spec", "networks:nosuch", "--input", "3"), "networks has no nosuch"),
            (("spec", "networks:lenet5", "--input", "3,x"), "expected one sample's shape"),
            (("spec", "networks:lenet5"), "the following arguments are required: --input"),
            (("spec", "bad:branchy", "--input", "4"), "cannot trace Branchy"),
            (("spec", "networks:lenet5", "--input", "3,32,32"), "LeNet5 fails on the example"),
        ]:
            result = self.joule_cli(*args)
            self.assertEqual(result.returncode, 2, (args, result.stderr))
            self.assertEqual(result.stdout, "")
            self.assertEqual(len(result.stderr.splitlines()), 1, result.stderr)
            self.assertTrue(result.stderr.startswith("joule: "), result.stderr)
            self.assertIn(expected, result.stderr)

    def test_submit_traces_the_model_and_runs_the_script_under_jouled(self):
        import torch

        import networks

        result = self.joule_cli("submit", "train.py", "--spec-from", "networks:mlp", "--input", "1,28,28",
                                "--batch-size", "32", "--epochs", "2", "--samples-per-epoch", "640",
                                "--name", "mlp-run", "--priority", "3", "--device", "cpu", "--python", JOB_PYTHON,
                                "--url", daemon.url, "--", "--lr", "0.1")
        self.assertEqual(result.returncode, 0, result.stderr)
        job_id = result.stdout.strip()
        client = joule.Client(daemon.url)
        done = client.wait(job_id, timeout=60)
        self.assertEqual(done["state"], "succeeded", f"{done}\n{client.logs(job_id, stream='stderr')}")
        self.assertEqual(client.logs(job_id), "args ['--lr', '0.1']\ndone\n")
        self.assertEqual(client.logs(job_id, stream="stderr"), "")
        self.assertEqual(done["name"], "mlp-run")
        self.assertEqual(done["priority"], 3)
        self.assertEqual(done["progress"]["epoch"], 2)
        submitted = done["spec"]
        self.assertEqual(submitted["model"], joule.spec(networks.mlp(), torch.zeros(2, 1, 28, 28), name="mlp"))
        self.assertEqual(submitted["training"]["samples_per_epoch"], 640)
        self.assertEqual(submitted["run"]["command"], [JOB_PYTHON, "train.py", "--lr", "0.1"])
        self.assertEqual(os.path.realpath(submitted["run"]["workdir"]), os.path.realpath(self.project))
        self.assertEqual(submitted["constraints"]["devices"], ["cpu"])

    def test_submit_wait_and_dry_run(self):
        dry = self.joule_cli("submit", "train.py", "--spec-from", "networks:mlp", "--input", "1,28,28",
                             "--batch-size", "32", "--epochs", "1", "--samples-per-epoch", "64", "--dry-run")
        self.assertEqual(dry.returncode, 0, dry.stderr)
        job = json.loads(dry.stdout)
        self.assertEqual(job["run"]["command"], ["python3", "train.py"])
        self.assertEqual(job["training"]["optimizer"], "sgd")
        self.assertEqual(job["name"], "train")
        waited = self.joule_cli("submit", "train.py", "--spec-from", "networks:mlp", "--input", "1,28,28",
                                "--batch-size", "32", "--epochs", "1", "--samples-per-epoch", "64",
                                "--python", JOB_PYTHON, "--url", daemon.url, "--wait")
        self.assertEqual(waited.returncode, 0, waited.stderr)
        lines = waited.stdout.splitlines()
        self.assertEqual(len(lines), 2, lines)
        self.assertTrue(lines[1].startswith("succeeded"), lines)
        refused = self.joule_cli("submit", "train.py", "--spec-from", "networks:mlp", "--input", "1,28,28",
                                 "--batch-size", "32", "--epochs", "1", "--samples-per-epoch", "64",
                                 "--url", daemon.url, "--token", "not-a-token")
        self.assertEqual(refused.returncode, 1)
        self.assertIn("HTTP 401", refused.stderr)
        self.assertEqual(len(refused.stderr.splitlines()), 1, refused.stderr)


if __name__ == "__main__":
    unittest.main()
