#!/usr/bin/python3
"""layers_test.py: daemon/src's folders include only those below them (docs/design.md, "Where things
live in daemon/src"), so no circle can form between them.

A public header (include/joule/daemon/X.hpp) belongs to the folder of its X.cpp, or to the
folder named for it below; a header of neither is reported, so a new one gets a place.
Usage: python3 tests/daemon/layers_test.py [repository root]
"""

import glob
import os
import re
import sys

ORDER = ["app", "http", "nodes", "probing", "estimates", "jobs", "signals", "support"]
# Public headers without a .cpp of their name: the folder they belong to.
HEADER_ONLY = {
    "job_links": "jobs", "job_view": "jobs", "agent_jobs": "jobs", "node_jobs": "jobs",
    "local_run_options": "jobs", "job_accounts": "jobs", "job_estimate": "jobs",
    "daemon_app": "app", "systemd_notify": "app", "run_on_loop": "support",
    "reported_meter": "support", "thread_settings": "support", "router": "http",
    "meter_shares": "jobs",
}


def main(root):
    home = {}
    for role in ORDER:
        for source in glob.glob(os.path.join(root, "daemon/src", role, "**/*.cpp"), recursive=True):
            name = os.path.basename(source)[:-4]
            if os.path.exists(os.path.join(root, "daemon/include/joule/daemon", name + ".hpp")):
                home[name] = role
    for name, role in HEADER_ONLY.items():
        home.setdefault(name, role)
    problems = []
    files = []
    for role in ORDER:
        files += [(role, f) for f in glob.glob(os.path.join(root, "daemon/src", role, "**/*.[ch]pp"), recursive=True)]
    for header in glob.glob(os.path.join(root, "daemon/include/joule/daemon/*.hpp")):
        name = os.path.basename(header)[:-4]
        if name not in home:
            problems.append(f"{header}: belongs to no folder (give it a .cpp or a line in HEADER_ONLY)")
        else:
            files.append((home[name], header))
    for role, path in files:
        with open(path) as f:
            for number, line in enumerate(f, 1):
                match = re.match(r'#include "([^"]+)"', line)
                if not match:
                    continue
                included = match.group(1)
                if included.startswith("joule/daemon/"):
                    target = home.get(os.path.basename(included)[:-4])
                else:
                    target = included.split("/")[0] if included.split("/")[0] in ORDER else None
                if target and ORDER.index(target) < ORDER.index(role):
                    problems.append(f"{os.path.relpath(path, root)}:{number}: {role}/ includes {included} ({target}/, above it)")
    for problem in problems:
        print(problem)
    print(f"{len(files)} files checked, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")))
