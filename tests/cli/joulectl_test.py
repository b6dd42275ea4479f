"""joulectl's man page, bash completion and progress line, against the program itself.

    JOULECTL_BINARY=... JOULED_BINARY=... JOULE_SIM_BINARY=... JOULE_MAN_DIR=... \\
        python3 -m unittest -v joulectl_test        (from tests/cli; CTest: cli_joulectl)

- The man pages of joulectl, jouled and joule-sim (`--man-page`) render under groff and man
  without a warning, and name every subcommand and option that the program's --help lists (read
  independently, command_tree.py); the pages the build installs (JOULE_MAN_DIR) are the same.
- `joulectl completion bash` is sourced into a real bash and driven as bash drives it: at every
  depth of the tree it offers exactly the subcommands, exactly the options, file names for FILE
  values and the choices of a set; with and without the bash-completion package (the latter
  where installed; the test says when it is not).
- `joulectl submit --wait` against a real jouled (python/tests/support.py) with a job that
  reports its epochs: on a terminal (a pty) one line rewritten with "\\r" that shows epoch k of N
  and the energy so far; on a pipe one line per state and no "\\r"; standard output holds the
  final report alone either way.
"""

import fcntl
import gzip
import json
import os
import pty
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [HERE, os.path.join(SOURCE_DIR, "python", "tests")]

from command_tree import command_tree  # noqa: E402
from support import Jouled  # noqa: E402

BASH_COMPLETION = "/usr/share/bash-completion/bash_completion"


def binary(variable, relative):
    path = os.environ.get(variable) or os.path.join(SOURCE_DIR, "build", relative)
    if not os.access(path, os.X_OK):
        raise unittest.SkipTest(f"no {path}: build it or set {variable}")
    return path


def joulectl():
    return binary("JOULECTL_BINARY", "cli/joulectl")


def roff_name(name):
    return name.replace("-", "\\-")


class ManPageTest(unittest.TestCase):
    def check_page(self, program, name):
        page = subprocess.run([program, "--man-page"], capture_output=True, text=True, timeout=30, check=True).stdout
        self.assertTrue(page.isascii(), "the page is ASCII (anything else as \\[uXXXX])")
        groff = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z"], input=page, capture_output=True, text=True,
                               timeout=60)
        self.assertEqual(groff.stderr, "", f"groff warns about {name}'s page")
        if shutil.which("man"):
            with tempfile.NamedTemporaryFile("w", suffix=".1") as file:
                file.write(page)
                file.flush()
                shown = subprocess.run(["man", "--warnings", "-E", "UTF-8", "-l", file.name], capture_output=True,
                                       text=True, timeout=60, env=dict(os.environ, MANWIDTH="80", MAN_KEEP_FORMATTING=""))
            self.assertEqual(shown.stderr, "", f"man warns about {name}'s page")
            self.assertIn("NAME", shown.stdout)
        # What the build installs is what the program prints now.
        man_dir = os.environ.get("JOULE_MAN_DIR") or os.path.join(SOURCE_DIR, "build", "man")
        installed = os.path.join(man_dir, f"{name}.1.gz")
        if os.path.exists(installed):
            with gzip.open(installed, "rt", encoding="ascii") as file:
                self.assertEqual(file.read(), page, f"{installed} is not the page {name} prints")
        tree = command_tree(program)
        for path, node in tree.items():
            if path:
                self.assertIn(f'.SS "{roff_name(name)} {roff_name(path)}', page, f"{name} {path} is not in its man page")
            for option in node["options"]:
                self.assertIn(f"\\fB{roff_name(option)}\\fR", page, f"{name} {path} {option} is not in its man page")
        self.assertNotIn("man\\-page", page, "--man-page is hidden")
        return page, tree

    def test_joulectl_page_has_every_command_and_option(self):
        page, tree = self.check_page(joulectl(), "joulectl")
        self.assertGreaterEqual(len(tree), 15, "the --help reading found too few commands")
        for section in ("ENVIRONMENT", "EXIT STATUS", "EXAMPLES", "SEE ALSO"):
            self.assertIn(f'.SH "{section}"', page)

    def test_jouled_and_joule_sim_pages(self):
        self.check_page(binary("JOULED_BINARY", "daemon/jouled"), "jouled")
        self.check_page(binary("JOULE_SIM_BINARY", "simulator/joule-sim"), "joule-sim")


class CompletionTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.program = joulectl()
        cls.tree = command_tree(cls.program)
        cls.script = subprocess.run([cls.program, "completion", "bash"], capture_output=True, text=True, timeout=30,
                                    check=True).stdout
        cls.work = tempfile.mkdtemp(prefix="joulectl-completion-")
        for name in ("job.json", "jobs-old.json", "model.json"):
            open(os.path.join(cls.work, name), "w").close()
        os.mkdir(os.path.join(cls.work, "specs"))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.work, ignore_errors=True)

    def complete(self, words, framework):
        """What bash offers for the last of `words` (the word being completed, "" for a new one)."""
        line = " ".join(["joulectl", *words])
        array = " ".join(f"'{word}'" for word in ["joulectl", *words])
        program = "\n".join([
            f"source {BASH_COMPLETION}" if framework else "",
            self.script,
            f"COMP_WORDS=({array}); COMP_CWORD={len(words)}; COMP_LINE='{line}'; COMP_POINT={len(line)}",
            "_joulectl joulectl",
            'printf "%s\\n" "${COMPREPLY[@]}"'])
        done = subprocess.run(["bash", "--norc", "--noprofile", "-c", program], capture_output=True, text=True,
                              timeout=30, cwd=self.work)
        self.assertEqual(done.returncode, 0, done.stderr)
        return sorted(filter(None, done.stdout.split("\n")))

    def check_tree(self, framework):
        self.assertIn("complete -F _joulectl joulectl", self.script)
        for path, node in self.tree.items():
            words = path.split() if path else []
            with self.subTest(command=path, framework=framework):
                if node["subcommands"]:
                    self.assertEqual(self.complete([*words, ""], framework), sorted(node["subcommands"]))
                self.assertEqual(self.complete([*words, "-"], framework), sorted(node["options"]))
                # An option's value is never taken for a subcommand: after "--server URL" the
                # top level's subcommands are offered again.
                for option, value in node["options"].items():
                    if value == "FILE":
                        self.assertEqual(self.complete([*words, option, "jo"], framework), ["job.json", "jobs-old.json"])
        # Global options before the subcommand, the subcommand's positional file, a set's choices.
        self.assertEqual(self.complete(["--server", "http://x:1", "tok"], framework), ["token"])
        self.assertEqual(self.complete(["--json", "token", "n"], framework), ["new"])
        self.assertEqual(self.complete(["submit", "--wait", "m"], framework), ["model.json"])
        self.assertEqual(self.complete(["estimate", "--batch-size", ""], framework), [])
        self.assertEqual(self.complete(["completion", ""], framework), ["bash"])
        self.assertIn("specs", self.complete(["submit", "s"], framework), "directories lead to files")

    def test_completes_the_whole_tree_without_bash_completion(self):
        self.check_tree(framework=False)

    def test_completes_the_whole_tree_under_bash_completion(self):
        if not os.path.exists(BASH_COMPLETION):
            self.skipTest(f"no {BASH_COMPLETION}: apt install bash-completion")
        self.check_tree(framework=True)


# A job that reports 3 epochs of 0.8 s each to jouled (POST /v1/jobs/{id}/progress).
EPOCHS_SCRIPT = """
import json, os, time, urllib.request
for epoch in range(1, 4):
    time.sleep(0.8)
    request = urllib.request.Request(
        os.environ["JOULE_URL"] + "/v1/jobs/" + os.environ["JOULE_JOB_ID"] + "/progress",
        data=json.dumps({"epoch": epoch, "epochs": 3}).encode(),
        headers={"Authorization": "Bearer " + os.environ["JOULE_JOB_TOKEN"]}, method="POST")
    urllib.request.urlopen(request).read()
"""


class ProgressLineTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.program = joulectl()
        cls.jouled = Jouled()
        cls.job_file = os.path.join(cls.jouled.work_dir, "job.json")
        with open(cls.job_file, "w", encoding="utf-8") as file:
            json.dump({"name": "epochs", "run": {"command": ["python3", "-c", EPOCHS_SCRIPT]}}, file)

    @classmethod
    def tearDownClass(cls):
        cls.jouled.stop()

    def submit_wait(self, stderr_on_terminal, *extra):
        argv = [self.program, "--server", self.jouled.url, *extra, "submit", "--wait", self.job_file]
        if not stderr_on_terminal:
            done = subprocess.run(argv, capture_output=True, timeout=120)
            return done.returncode, done.stdout.decode(), done.stderr.decode()
        master, slave = pty.openpty()
        # Wide enough that no line is cut: the test reads what the line says.
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 250, 0, 0))
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL)
        os.close(slave)
        chunks = []

        def drain():
            while True:
                try:
                    data = os.read(master, 4096)
                except OSError:  # EIO: the last writer closed the pty
                    return
                if not data:
                    return
                chunks.append(data)

        reader = threading.Thread(target=drain)
        reader.start()
        with process.stdout:
            out = process.stdout.read().decode()
        process.wait(timeout=120)
        reader.join(timeout=10)
        os.close(master)
        # The pty turns "\n" into "\r\n"; the progress line has no "\n" of its own.
        return process.returncode, out, b"".join(chunks).decode()

    def test_on_a_terminal_one_line_shows_epoch_and_energy_so_far(self):
        code, out, err = self.submit_wait(True)
        self.assertEqual(code, 0, out + err)
        self.assertIn("state:     succeeded", out)
        self.assertNotIn("\r", out, "standard output holds the report alone")
        self.assertNotIn("\n", err, f"the progress line never starts a new line: {err!r}")
        shown = err.split("\r")
        self.assertGreater(len(shown), 3, f"the line was not rewritten: {err!r}")
        self.assertTrue(any(re.search(r"running on cpu for [0-9.]+ s, epoch [123] of 3", line) for line in shown), shown)
        self.assertTrue(any(re.search(r"[0-9.]+ k?J so far \(modelled\)", line) for line in shown), shown)
        self.assertEqual(err.rstrip(" ").split("\r")[-1], "", "the line is blanked before the report")

    def test_elsewhere_one_line_per_state_and_json_stays_alone_on_stdout(self):
        code, out, err = self.submit_wait(False, "--json")
        self.assertEqual(code, 0, out + err)
        self.assertEqual(json.loads(out)["state"], "succeeded")
        self.assertNotIn("\r", err)
        lines = err.splitlines()
        states = [re.match(r"job [0-9a-f]{8} \(epochs\): (\w+)", line).group(1) for line in lines]
        # One line per change: queued may show twice if why it waits changes, running once.
        self.assertEqual(states[-2:], ["running", "succeeded"], lines)
        self.assertEqual(states.count("running"), 1, lines)
        self.assertRegex(lines[-1], r"succeeded on cpu after [0-9.]+ s, [0-9.]+ k?J \(modelled\)$")


if __name__ == "__main__":
    unittest.main()
