"""What README.md and docs/*.md say joulectl and the REST API have, against what they have.

    JOULECTL_BINARY=... python3 -m unittest -v docs_test        (from tests/docs; CTest: docs_match_code)

- Every joulectl invocation written in code (a `span` or a fenced block): its subcommands must
  exist, and each option must be one of the command it follows (global options before the
  subcommand, as CLI11 parses them), with its value stepped over; the tree comes from
  `joulectl --help` (tests/cli/command_tree.py). `[--opt VALUE]` usage brackets count too.
- Every joulectl subcommand is shown in README.md at least once.
- The README's route table ("### REST API") lists exactly the routes the daemon adds
  (daemon/src/http/routes/*.cpp, read as python/tests/test_openapi.py reads them, which also checks
  docs/openapi.yaml against them), method and path template alike.
- Every `METHOD /path` and every bare `/v1/...`, `/metrics`, `/healthz`, `/readyz` path written
  in code anywhere in README.md or docs/*.md names a route the daemon serves (a concrete id such
  as `<id>.<epoch>` stands for a template's `{id}`; a query string is ignored).

Each failure names the file and line of the claim.
"""

import glob
import os
import re
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [os.path.join(SOURCE_DIR, "tests", "cli"), os.path.join(SOURCE_DIR, "python", "tests")]

from command_tree import command_tree  # noqa: E402
from test_openapi import source_routes  # noqa: E402

README = os.path.join(SOURCE_DIR, "README.md")
DOCUMENTS = [README, *sorted(glob.glob(os.path.join(SOURCE_DIR, "docs", "*.md")))]
METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH")


SHELL_BLOCKS = ("sh", "bash", "shell", "console")
# joulectl where a shell would run it: at the start, after an operator or a prompt, by any path;
# also after " / ", which the README writes between alternatives ("joulectl pause ID / joulectl resume ID").
COMMAND = re.compile(r"(?:^|[;|&(]\s*|\$\s+|\s/\s+)(?:[\w.~$/-]*/)?joulectl(?=\s|$)")


def code_lines(path):
    """(line number, text) of what is written as shell code: the lines of ```sh blocks and
    `spans` elsewhere (other fenced blocks are config, JSON, output or a layout)."""
    out = []
    fence = None
    with open(path, encoding="utf-8") as file:
        for number, line in enumerate(file, 1):
            stripped = line.strip()
            if stripped.startswith("```"):
                fence = stripped[3:].strip() if fence is None else None
                continue
            if fence is not None:
                if fence in SHELL_BLOCKS:
                    out.append((number, line.rstrip("\n")))
            else:
                out.extend((number, span) for span in re.findall(r"`([^`]+)`", line))
    return out


def joulectl_invocations(text):
    """The words after each joulectl that `text` runs, up to a comment, a shell operator or the
    next joulectl."""
    out = []
    for match in COMMAND.finditer(text):
        rest = re.split(r"\s#|\||;|&&|\)|\bjoulectl\b", text[match.end():])[0]
        words = [word.strip("[]") for word in rest.split()]
        words = [word for word in words if word and word not in ("/", "...", "\u2026")]
        if words:
            out.append(words)
    return out


def walk(tree, words):
    """(the commands `words` reach, e.g. ["token", "token new"]; None or why they do not parse)."""
    command, reached = "", []
    expect_value = False
    for word in words:
        if expect_value:
            expect_value = False
            continue
        node = tree[command]
        where = f"joulectl {command}".strip()
        if word.startswith("-"):
            name = word.split("=", 1)[0]
            if name not in node["options"]:
                return reached, f"{where} has no option {name} (it has {', '.join(sorted(node['options']))})"
            expect_value = node["options"][name] != "flag" and "=" not in word
            continue
        if node["subcommands"]:
            if word not in node["subcommands"]:
                return reached, f"{where} has no subcommand {word!r} (it has {', '.join(node['subcommands'])})"
            command = f"{command} {word}".strip()
            reached.append(command)
        # Otherwise a positional argument (ID, FILE, a path): its value is the program's business.
    return reached, None


def check_invocation(tree, words):
    """None if `words` parse against the command tree, else why not."""
    return walk(tree, words)[1]


def served_path_pattern(template):
    return re.compile("^" + re.sub(r"\\\{[^}]*\\\}", "[^/]+", re.escape(template)) + "$")


class DocumentedCommandsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        program = os.environ.get("JOULECTL_BINARY") or os.path.join(SOURCE_DIR, "build", "cli", "joulectl")
        if not os.access(program, os.X_OK):
            raise unittest.SkipTest(f"no {program}: build joulectl or set JOULECTL_BINARY")
        cls.tree = command_tree(program)

    def test_every_documented_joulectl_command_exists(self):
        checked = 0
        for path in DOCUMENTS:
            for number, text in code_lines(path):
                for words in joulectl_invocations(text):
                    checked += 1
                    problem = check_invocation(self.tree, words)
                    with self.subTest(where=f"{os.path.relpath(path, SOURCE_DIR)}:{number}"):
                        self.assertIsNone(problem, f"`joulectl {' '.join(words)}`: {problem}")
        self.assertGreaterEqual(checked, 20, "the documents' reading found too few joulectl commands")

    def test_the_readme_shows_every_joulectl_subcommand(self):
        shown = set()
        for _, text in code_lines(README):
            for words in joulectl_invocations(text):
                shown.update(walk(self.tree, words)[0])
        missing = sorted(set(self.tree) - {""} - shown)
        self.assertEqual(missing, [], "joulectl subcommands README.md never shows in code")

    def test_the_documents_reading_finds_a_wrong_command(self):
        self.assertIsNone(check_invocation(self.tree, ["--server", "URL", "submit", "--wait", "job.json"]))
        self.assertIn("no subcommand 'frobnicate'", check_invocation(self.tree, ["frobnicate"]))
        self.assertIn("no subcommand 'old'", check_invocation(self.tree, ["token", "old"]))
        self.assertIn("no option --json", check_invocation(self.tree, ["jobs", "--json"]))
        self.assertEqual(joulectl_invocations("joulectl pause ID / joulectl resume ID  # by hand"),
                         [["pause", "ID"], ["resume", "ID"]])
        self.assertEqual(joulectl_invocations("joulectl's path; build/cli/joulectl --server $S devices"),
                         [["--server", "$S", "devices"]])
        self.assertEqual(joulectl_invocations("source <(joulectl completion bash)"), [["completion", "bash"]])
        self.assertEqual(joulectl_invocations("./scripts/build.sh jouled joulectl joule-worker"), [])


class DocumentedRoutesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.served = {(method.upper(), path) for method, path in source_routes()}
        cls.patterns = [(method, served_path_pattern(path)) for method, path in cls.served]

    def readme_table(self):
        """(method, path, line) of each route in the README's route table."""
        rows = []
        in_section = False
        with open(README, encoding="utf-8") as file:
            for number, line in enumerate(file, 1):
                if line.startswith("#"):
                    in_section = line.strip() == "### REST API"
                    continue
                if not in_section or not line.startswith("| `"):
                    continue
                first_cell = re.split(r"(?<!\\)\|", line)[1]
                method = None
                for span in re.findall(r"`([^`]+)`", first_cell):
                    parts = span.replace("\\|", "|").split()
                    if parts and parts[0] in METHODS:
                        method, parts = parts[0], parts[1:]
                    if parts and parts[0].startswith("/") and method:
                        rows.append((method, parts[0].split("?")[0], number))
        return rows

    def test_the_readme_route_table_lists_exactly_the_served_routes(self):
        table = self.readme_table()
        self.assertGreaterEqual(len(table), 19, "the route table reading found too few routes")
        listed = {(method, path) for method, path, _ in table}
        for method, path, number in table:
            with self.subTest(where=f"README.md:{number}"):
                self.assertIn((method, path), self.served, f"README.md's route table lists {method} {path}, "
                              "which jouled does not serve (daemon/src/http/routes/*.cpp)")
        self.assertEqual(sorted(self.served - listed), [],
                         "routes jouled serves that README.md's route table does not list")

    def test_every_route_written_in_the_documents_is_served(self):
        checked = 0
        for path in DOCUMENTS:
            for number, text in code_lines(path):
                claims = [(m.group(1), m.group(2)) for m in re.finditer(rf"\b({'|'.join(METHODS)}) (/\S*)", text)]
                if not claims and re.fullmatch(r"/(v1/\S+|metrics|healthz|readyz)", text.strip()):
                    claims = [(None, text.strip())]
                for method, route in claims:
                    route = route.replace("\\|", "|").split("?")[0].rstrip(".,;:")
                    checked += 1
                    ok = any((method is None or method == served_method) and pattern.match(route)
                             for served_method, pattern in self.patterns)
                    with self.subTest(where=f"{os.path.relpath(path, SOURCE_DIR)}:{number}"):
                        self.assertTrue(ok, f"{method or 'a request to'} {route} is not a route jouled serves")
        self.assertGreaterEqual(checked, 30, "the documents' reading found too few routes")


if __name__ == "__main__":
    unittest.main()
