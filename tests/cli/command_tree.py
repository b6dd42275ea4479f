"""A CLI11 program's command tree, read from its --help output the way a person reads it.

    tree = command_tree("/path/to/joulectl")
    tree[""]["subcommands"]       -> ["submit", "jobs", ...]
    tree["token"]["subcommands"]  -> ["new", "hash"]
    tree["submit"]["options"]     -> {"-h": "flag", "--help": "flag", "--wait": "flag", "--timeout": "SECONDS"}
    tree["submit"]["positionals"] -> ["FILE"]

Independent of cli/src/command_docs.cpp, which generates the man page and the completion from
the same tree inside the program: the tests compare the two readings.
"""

import re
import subprocess


def help_sections(text):
    """{"Options": [entry...], "Positionals": [...], "Subcommands": [...]}: the first column of
    each entry (the names, up to two blanks before the description)."""
    sections, current = {}, None
    for line in text.splitlines():
        if line and not line[0].isspace() and line.endswith(":") and " " not in line:
            current = line[:-1]
            sections[current] = []
        elif current and re.match(r"  \S", line):
            sections[current].append(re.split(r"\s{2,}", line.strip())[0])
    return sections


def read_help(program, words):
    done = subprocess.run([program, *words, "--help"], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise AssertionError(f"{program} {' '.join(words)} --help exited with {done.returncode}: {done.stderr}")
    return done.stdout


def command_tree(program):
    """{"" | "sub" | "sub inner": {"subcommands": [...], "options": {name: "flag" | VALUE}, "positionals": [...]}}."""
    tree = {}

    def visit(words):
        sections = help_sections(read_help(program, words))
        options = {}
        for entry in sections.get("Options", []):
            names, _, value = entry.partition(" ")
            value = value.split()[0] if value.split() else "flag"
            for name in names.split(","):
                options[name] = value
        node = {
            "subcommands": [entry.split()[0] for entry in sections.get("Subcommands", [])],
            "options": options,
            "positionals": [entry.split()[0] for entry in sections.get("Positionals", [])],
        }
        tree[" ".join(words)] = node
        for sub in node["subcommands"]:
            visit([*words, sub])

    visit([])
    return tree
