"""REST API v1 against its contract, docs/openapi.yaml.

The document itself is checked first: against the OpenAPI 3.0 meta-schema that Debian's
openapi-specification package ships, and against the daemon's route table as
daemon/src/http/routes/*.cpp builds it (every verb and path template, each route's guard and
owner-only flag); a route in one but not the other fails. Then real jouled processes (a node
with API tokens, a coordinator, an agent of it) get real requests on every route, success and
error cases, and every answer's status, headers and body are validated against the document.
The daemon's own answers close the loop: for each documented path, the Allow header of a 405
lists exactly the methods the document lists there, and every route label jouled counts in
joule_http_requests_total is a documented path. At the end every documented operation must
have been answered with a success, and every documented status code must have been seen unless
it is named below as one the test cannot provoke cheaply.

Needs Debian's python3-yaml, python3-jsonschema and openapi-specification
(scripts/install-deps.sh installs them).
"""

import datetime
import hashlib
import http.client
import json
import os
import re
import shutil
import sys
import tempfile
import time
import unittest
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE]

from support import CONFIG, SOURCE_DIR, Jouled, wait_for  # noqa: E402

try:
    import jsonschema
    import yaml
except ImportError as error:  # named in setUpModule, with the fix
    MISSING = str(error)
else:
    MISSING = None

DOCUMENT = os.path.join(SOURCE_DIR, "docs", "openapi.yaml")
META_SCHEMA = "/usr/share/openapi-specification/schemas/v3.0/schema.json"
ROUTE_SOURCES = os.path.join(SOURCE_DIR, "daemon", "src", "http", "routes")
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")

# Documented answers this test does not provoke, and why. Anything else documented must be seen.
NOT_PROVOKED = {
    ("get", "/readyz", 503): "only while jouled recovers, before it listens",
    ("post", "/v1/jobs", 409): "only where submissions are refused (a Slurm coordinator that lost slurmctld)",
    ("post", "/v1/jobs", 503): "only when SQLite fails to store the job",
    ("post", "/v1/jobs/{id}/pause", 503): "only when SIGSTOP fails",
    ("post", "/v1/jobs/{id}/resume", 503): "only when SIGCONT fails",
    ("get", "/v1/probes", 501): "only from an Api without a probe service; jouled always has one",
    ("post", "/v1/probes", 501): "only from an Api without a probe service; jouled always has one",
    ("get", "/v1/probes/{id}", 501): "only from an Api without a probe service; jouled always has one",
    ("post", "/v1/jobs/{id}/progress", 413): "the body limit is the parser's, the same for every route: "
                                             "checked on POST /v1/jobs",
    ("post", "/v1/estimate", 413): "the parser's body limit, checked on POST /v1/jobs",
    ("post", "/v1/advise", 413): "the parser's body limit, checked on POST /v1/jobs",
    ("post", "/v1/probes", 413): "the parser's body limit, checked on POST /v1/jobs",
    ("post", "/v1/cluster/sync", 413): "the parser's body limit, checked on POST /v1/jobs",
}

# API tokens by owner, with their scopes ("nobody" has none: 403 even where reading is enough).
SCOPES = {"reader": ["read"], "alice": ["submit"], "bob": ["submit"], "admin": ["admin"], "nobody": []}
TOKENS = {name: f"openapi-test-{name}-token" for name in SCOPES}
BAD_TOKEN = "not-a-token-jouled-knows"

MODEL = {"input": {"shape": [16]}, "layers": [{"type": "linear", "out_features": 8, "name": "fc1"},
                                              {"type": "relu"}, {"type": "linear", "out_features": 2}]}
TRAINING = {"batch_size": 8, "epochs": 1, "samples_per_epoch": 64}


def setUpModule():
    if MISSING:
        raise RuntimeError(f"{MISSING}: install python3-yaml and python3-jsonschema (scripts/install-deps.sh)")
    if not os.path.exists(META_SCHEMA):
        raise RuntimeError(f"no {META_SCHEMA}: install openapi-specification (scripts/install-deps.sh)")


def load_document():
    with open(DOCUMENT, encoding="utf-8") as file:
        return yaml.safe_load(file)


def operations(document):
    """(method, path template) -> operation, for every documented operation."""
    return {(method, path): operation
            for path, item in document["paths"].items()
            for method, operation in item.items() if method in METHODS}


def source_routes():
    """(method, path template) -> (guard, owner_only), as daemon/src/http/routes/*.cpp adds them."""
    found = {}
    add = re.compile(r"table\.add\(\s*Verb::(\w+)\s*,\s*(.*?)\s*,\s*\{\s*Guard::(\w+)\s*,\s*(true|false)\s*,", re.S)
    for name in sorted(os.listdir(ROUTE_SOURCES)):
        if not name.endswith(".cpp"):
            continue
        with open(os.path.join(ROUTE_SOURCES, name), encoding="utf-8") as file:
            text = file.read()
        matches = add.findall(text)
        # A route added some other way would be missed: the reading must account for every add.
        assert len(matches) == text.count("table.add("), f"{name}: a table.add( this test cannot read"
        for verb, paths, guard, owner in matches:
            templates = re.findall(r'"(/[^"]*)"', paths)
            assert templates, f"{name}: no path template in table.add(Verb::{verb}, {paths}"
            for template in templates:
                found[(verb.rstrip("_"), template)] = (guard.replace("_", "-"), owner == "true")
    return found


def to_json_schema(node):
    """An OpenAPI 3.0 schema (or the whole document) as JSON Schema draft 4: nullable → or null."""
    if isinstance(node, list):
        return [to_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: to_json_schema(value) for key, value in node.items()}
    if out.pop("nullable", False) is True:
        return {"anyOf": [out, {"type": "null"}]}
    return out


def format_checker():
    checker = jsonschema.FormatChecker(formats=())

    @checker.checks("date-time", raises=ValueError)
    def date_time(value):
        if not isinstance(value, str):
            return True
        if not re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)", value):
            raise ValueError(f"{value!r} is not RFC 3339")
        datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
        return True

    @checker.checks("uuid", raises=ValueError)
    def is_uuid(value):
        if isinstance(value, str):
            uuid.UUID(value)
        return True

    @checker.checks("int64")
    def int64(value):
        return not isinstance(value, int) or -2**63 <= value < 2**63

    return checker


def media_type(text):
    return ";".join(part.strip().lower() for part in (text or "").split(";"))


class Answer:
    def __init__(self, method, target, response, body):
        self.method, self.target = method, target
        self.status = response.status
        self.headers = response.msg
        self.body = body
        self.json = None
        kind = media_type(self.headers.get("Content-Type"))
        if body and (kind.startswith("application/json") or kind.startswith("application/problem+json")):
            self.json = json.loads(body)

    def header(self, name):
        return self.headers.get(name)

    def __repr__(self):
        return f"{self.method} {self.target} -> {self.status} {dict(self.headers)} {self.body[:600]!r}"


class DocumentTest(unittest.TestCase):
    """The document on its own, and against the daemon's sources."""

    @classmethod
    def setUpClass(cls):
        cls.document = load_document()

    def test_the_document_is_valid_openapi_3_0(self):
        with open(META_SCHEMA, encoding="utf-8") as file:
            meta = json.load(file)
        validator = jsonschema.Draft4Validator(meta)

        def leaves(error):
            if not error.context:
                yield error
            for cause in error.context:
                yield from leaves(cause)

        problems = [f"/{'/'.join(map(str, leaf.absolute_path))}: {leaf.message[:200]}"
                    for error in validator.iter_errors(self.document) for leaf in leaves(error)]
        self.assertEqual(problems, [], "docs/openapi.yaml is not an OpenAPI 3.0 document")
        self.assertTrue(self.document["openapi"].startswith("3.0."))
        # Every schema is one draft 4 accepts once nullable is rewritten.
        for name, schema in self.document["components"]["schemas"].items():
            with self.subTest(schema=name):
                jsonschema.Draft4Validator.check_schema(to_json_schema(schema))

    def test_every_reference_resolves(self):
        text = json.dumps(self.document)
        for reference in sorted(set(re.findall(r'"\$ref": "([^"]+)"', text))):
            with self.subTest(reference=reference):
                self.assertTrue(reference.startswith("#/"), "references stay inside the document")
                node = self.document
                for part in reference[2:].split("/"):
                    self.assertIn(part, node, f"{reference} does not resolve")
                    node = node[part]

    def test_the_document_points_to_nothing_outside_the_repository(self):
        with open(DOCUMENT, encoding="utf-8") as file:
            urls = re.findall(r"[a-z][a-z0-9+.-]*://[^\s'\"`)]+", file.read())
        self.assertEqual([url for url in urls if not url.startswith("http://127.0.0.1:")], [])

    def test_every_route_the_daemon_adds_is_documented_and_nothing_else(self):
        served = source_routes()
        documented = operations(self.document)
        self.assertGreaterEqual(len(served), 19, "the route table reading found too few routes")
        self.assertEqual(sorted(set(served) - set(documented)), [],
                         "routes jouled serves that docs/openapi.yaml does not document")
        self.assertEqual(sorted(set(documented) - set(served)), [],
                         "routes docs/openapi.yaml documents that jouled does not serve")

    def test_each_route_documents_the_guard_the_daemon_applies(self):
        served = source_routes()
        for (method, path), operation in operations(self.document).items():
            if (method, path) not in served:
                continue  # reported by the test above
            guard, owner_only = served[(method, path)]
            with self.subTest(route=f"{method.upper()} {path}"):
                self.assertEqual(operation.get("x-joule-scope"), guard)
                self.assertEqual(operation.get("x-joule-owner-only", False), owner_only)
                security = operation.get("security", self.document["security"])
                if guard == "open":
                    self.assertEqual(security, [], "an open route needs no credentials")
                elif guard == "job-token":
                    self.assertEqual(security, [{"jobToken": []}])
                elif guard == "agent":
                    self.assertIn({"agentToken": []}, security)
                else:
                    self.assertIn({"bearerAuth": []}, security)
                # Every guarded route can refuse a caller; a scope can be missing; a job can be another's.
                responses = operation["responses"]
                if guard != "open":
                    self.assertIn("401", responses)
                if guard in ("read", "submit", "admin"):
                    self.assertIn("403", responses)
                if "{id}" in path:
                    self.assertIn("404", responses)
                self.assertIn("default", responses)


def token_config():
    lines = []
    for name, token in TOKENS.items():
        digest = hashlib.sha256(token.encode()).hexdigest()
        lines.append(f'[[auth.tokens]]\nname = "{name}"\nsha256 = "{digest}"\nscopes = {json.dumps(SCOPES[name])}\n')
    return "".join(lines)


class LiveApiTest(unittest.TestCase):
    """Real requests to real jouled processes, every answer validated against the document."""

    @classmethod
    def setUpClass(cls):
        cls.document = load_document()
        cls.operations = operations(cls.document)
        # $refs resolve inside the document, rewritten as JSON Schema (nullable → or null).
        cls.resolver = jsonschema.RefResolver(base_uri="", referrer=to_json_schema(cls.document))
        cls.formats = format_checker()
        cls.seen = set()  # (method, path template, status)
        cls.daemons = []
        cls.policy_directories = []
        started = time.monotonic()
        try:
            cls.start_daemons()
        except BaseException:
            cls.tearDownClass()
            raise
        print(f"jouled x3 started in {time.monotonic() - started:.2f} s", file=sys.stderr)

    @classmethod
    def start_daemons(cls):
        cls.node = cls.start(
            CONFIG + '[node]\nname = "apitest"\n[server]\nmax_body_bytes = 65536\nmax_queued_jobs = 2\n'
            '[jobs]\nkill_grace_seconds = 2\n[carbon]\nintensity = 300\n'
            '[[devices]]\nname = "cpu"\n[[devices]]\nname = "sim:laptop-cpu"\nprobes = 40\n' + token_config(),
            policies={"10-test.toml": (
                '[[budgets]]\nname = "sim-day"\nscope = "device"\ntarget = "sim:laptop-cpu"\n'
                'joules = 1_000_000_000\ncalendar = "day"\n'
                '[[budgets]]\nname = "sim-rolling"\nscope = "device"\ntarget = "sim:laptop-cpu"\n'
                'joules = 1_000_000_000\nwindow = "90m"\n'
                '[[power_caps]]\nname = "sim-cap"\nscope = "device"\ntarget = "sim:laptop-cpu"\n'
                'watts = 100000\naverage_seconds = 60\n'
                '[[battery_floors]]\nname = "sim-floor"\nscope = "device"\ntarget = "sim:laptop-cpu"\n'
                'percent = 10\nmargin_percent = 5\n')})
        cls.coordinator = cls.start(
            CONFIG + '[node]\nname = "coord"\n[cluster]\nrole = "coordinator"\nheartbeat_seconds = 0.2\n'
            'lost_after_seconds = 5\n')
        # The agent's joule-worker does not exist: its device refuses requested probe runs (409).
        cls.agent = cls.start(
            CONFIG + 'worker = "/nonexistent/joule-worker"\n'
            f'[node]\nname = "agent1"\n[cluster]\nrole = "agent"\ncoordinator = "{cls.coordinator.url}"\n'
            'heartbeat_seconds = 0.2\n')

    @classmethod
    def start(cls, config, policies=None):
        if policies:
            directory = tempfile.mkdtemp(prefix="joule-openapi-policies-")
            for name, text in policies.items():
                with open(os.path.join(directory, name), "w", encoding="utf-8") as file:
                    file.write(text)
            config += f'[policy]\ndirectory = "{directory}"\n'
            cls.policy_directories.append(directory)
        daemon = Jouled(config)
        cls.daemons.append(daemon)
        return daemon

    @classmethod
    def tearDownClass(cls):
        for daemon in reversed(getattr(cls, "daemons", [])):
            daemon.stop()
        for directory in getattr(cls, "policy_directories", []):
            shutil.rmtree(directory, ignore_errors=True)

    # ------------------------------------------------------------------ requests

    def send(self, daemon, method, target, body=None, token=None, headers=None):
        connection = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=30)
        try:
            sent = dict(headers or {})
            if token:
                sent["Authorization"] = f"Bearer {token}"
            if body is not None and not isinstance(body, (bytes, str)):
                body = json.dumps(body)
                sent.setdefault("Content-Type", "application/json")
            connection.request(method, target, body=body, headers=sent)
            response = connection.getresponse()
            return Answer(method, target, response, response.read())
        finally:
            connection.close()

    def call(self, daemon, method, target, template, status, body=None, token=None, headers=None):
        """Sends a request, asserts its status and validates the answer against `template`'s operation."""
        answer = self.send(daemon, method, target, body, token, headers)
        self.assertEqual(answer.status, status, f"{answer}\n{daemon.log()[-3000:]}")
        self.validate(answer, method.lower(), template)
        if status < 300 and isinstance(body, dict):
            # What jouled accepted, the document accepts too.
            schema = self.operations[(method.lower(), template)]["requestBody"]["content"]["application/json"]["schema"]
            self.assertEqual(self.schema_errors(body, to_json_schema(schema), f"{method} {target} request"), [])
        return answer

    # ------------------------------------------------------------------ validation

    def schema_errors(self, instance, schema, where):
        validator = jsonschema.Draft4Validator(schema, resolver=self.resolver, format_checker=self.formats)
        problems = []
        for error in sorted(validator.iter_errors(instance), key=lambda e: list(e.absolute_path)):
            best = jsonschema.exceptions.best_match([error])
            path = "/" + "/".join(map(str, best.absolute_path))
            problems.append(f"{where}: at {path}: {best.message[:300]}")
        return problems

    def response_object(self, response):
        while "$ref" in response:
            response = self.resolve(response["$ref"])
        return response

    def resolve(self, reference):
        node = self.document
        for part in reference[2:].split("/"):
            node = node[part]
        return node

    def validate(self, answer, method, template, response=None):
        """Validates an answer: against the operation's documented response for its status, or
        against `response` (a components/responses entry) for the answers any route may give."""
        where = f"{method.upper()} {answer.target} ({template}) -> {answer.status}"
        if not re.fullmatch(re.sub(r"\\{[a-z_]+\\}", "[^/?]+", re.escape(template)) + r"(\?.*)?", answer.target):
            self.fail(f"{answer.target} is not an instance of {template}")
        if response is None:
            operation = self.operations[(method if method != "head" else "get", template)]
            documented = operation["responses"]
            self.assertIn(str(answer.status), documented,
                          f"{where}: status {answer.status} is not documented\n{answer}")
            response = documented[str(answer.status)]
            self.seen.add((method if method != "head" else "get", template, answer.status))
        response = self.response_object(response)
        problems = []
        for name, header in response.get("headers", {}).items():
            values = answer.headers.get_all(name) or []
            if header.get("required") and not values:
                problems.append(f"{where}: the {name} header is missing")
            for value in values:
                schema = to_json_schema(header["schema"])
                if schema.get("type") == "integer":
                    if not re.fullmatch(r"\d+", value):
                        problems.append(f"{where}: {name}: {value!r} is not an integer")
                        continue
                    value = int(value)
                problems += self.schema_errors(value, schema, f"{where}: header {name}")
        content = response.get("content")
        if not content:
            if answer.body:
                problems.append(f"{where}: a body where none is documented")
        else:
            kind = media_type(answer.header("Content-Type"))
            by_kind = {media_type(key): value for key, value in content.items()}
            if kind not in by_kind:
                problems.append(f"{where}: Content-Type {kind!r}; documented: {sorted(by_kind)}")
            elif method == "head":
                if answer.body:
                    problems.append(f"{where}: HEAD answered with a body")
            else:
                schema = to_json_schema(by_kind[kind]["schema"])
                if "json" in kind:
                    problems += self.schema_errors(answer.json, schema, where)
                    if kind.startswith("application/problem+json"):
                        if answer.json.get("status") != answer.status:
                            problems.append(f"{where}: the problem's status is {answer.json.get('status')}")
                        if "instance" in answer.json and answer.json["instance"] != answer.target:
                            problems.append(f"{where}: instance {answer.json['instance']!r}")
                else:
                    problems += self.schema_errors(answer.body.decode("utf-8"), schema, where)
        self.assertEqual(problems, [], f"{answer}")
        return answer

    def assert_problem(self, answer, pointer=None, parameter=None):
        errors = answer.json.get("errors", [])
        if pointer is not None:
            self.assertEqual(errors[0].get("pointer"), pointer, answer)
        if parameter is not None:
            self.assertEqual(errors[0].get("parameter"), parameter, answer)

    def wait_for(self, what, predicate, timeout=20.0):
        return wait_for(what, predicate, timeout)

    def job(self, job_id, token=TOKENS["admin"]):
        return self.call(self.node, "GET", f"/v1/jobs/{job_id}", "/v1/jobs/{id}", 200, token=token).json

    # ------------------------------------------------------------------ the test

    def test_every_route_answers_as_documented(self):
        started = time.monotonic()
        steps = [self.health, self.node_routes, self.estimates, self.jobs, self.bad_requests, self.probes,
                 self.cluster, self.answers_any_route_may_give, self.allow_lists_match_the_document,
                 self.counted_routes_are_documented]
        for step in steps:
            with self.subTest(step=step.__name__):
                step()
        with self.subTest(step="coverage"):
            self.coverage()
        print(f"all routes checked in {time.monotonic() - started:.2f} s", file=sys.stderr)

    def coverage(self):
        missing = []
        for (method, path), operation in sorted(self.operations.items()):
            codes = {status for (m, p, status) in self.seen if (m, p) == (method, path)}
            if not any(200 <= code < 300 for code in codes):
                missing.append(f"{method.upper()} {path}: never answered with a success")
            for code in operation["responses"]:
                if code != "default" and (method, path, int(code)) not in NOT_PROVOKED and int(code) not in codes:
                    missing.append(f"{method.upper()} {path}: documented {code} never seen")
        self.assertEqual(missing, [])

    def health(self):
        for path, status in (("/healthz", "ok"), ("/readyz", "ready")):
            answer = self.call(self.node, "GET", path, path, 200, token=BAD_TOKEN)  # open: a token is ignored
            self.assertEqual(answer.json, {"status": status})
            self.call(self.node, "HEAD", path, path, 200)
        answer = self.call(self.node, "GET", "/metrics", "/metrics", 200)
        self.assertIn(b"joule_build_info", answer.body)
        self.call(self.node, "HEAD", "/metrics", "/metrics", 200)
        # The status page is open even where tokens guard /v1 (it holds no data).
        answer = self.call(self.node, "GET", "/", "/", 200)
        self.assertIn(b"<title>Joule</title>", answer.body)
        self.call(self.node, "HEAD", "/", "/", 200)

    def node_routes(self):
        # The simulated device learns its energy model from simulated probes within seconds.
        def sim_ready():
            answer = self.call(self.node, "GET", "/v1/devices", "/v1/devices", 200)
            models = {device["name"]: device["model"] for device in answer.json["devices"]}
            return models["sim:laptop-cpu"]["state"] == "ready" and answer
        devices = self.wait_for("the simulated device's energy model", sim_ready, timeout=30).json["devices"]
        self.assertEqual([device["name"] for device in devices], ["cpu", "sim:laptop-cpu"])
        self.call(self.node, "GET", "/v1/devices", "/v1/devices", 200, token=TOKENS["reader"])
        self.call(self.node, "HEAD", "/v1/devices", "/v1/devices", 200)

        budgets = self.call(self.node, "GET", "/v1/budgets", "/v1/budgets", 200, token=TOKENS["reader"]).json
        self.assertEqual(sorted(budget["name"] for budget in budgets["budgets"]), ["sim-day", "sim-rolling"])
        self.assertEqual([cap["name"] for cap in budgets["power_caps"]], ["sim-cap"])
        self.assertEqual([floor["name"] for floor in budgets["battery_floors"]], ["sim-floor"])

        nodes = self.call(self.node, "GET", "/v1/nodes", "/v1/nodes", 200).json
        self.assertEqual(nodes["role"], "standalone")

        signals = self.call(self.node, "GET", "/v1/signals", "/v1/signals", 200, token=TOKENS["reader"]).json
        self.assertEqual(signals["carbon"]["state"], "constant")
        self.assertEqual(signals["carbon"]["value_now"], 300)

        now = datetime.datetime.now(datetime.timezone.utc)
        stamp = lambda t: t.strftime("%Y-%m-%dT%H:%M:%SZ")
        span = f"from={stamp(now - datetime.timedelta(days=1))}&to={stamp(now + datetime.timedelta(hours=1))}"
        usage = self.call(self.node, "GET", f"/v1/usage?{span}&group_by=day", "/v1/usage", 200,
                          token=TOKENS["reader"]).json
        self.assertEqual(usage["group_by"], "day")
        for query, parameter in ((f"from={stamp(now)}", "to"), (f"{span}&group_by=week", "group_by")):
            answer = self.call(self.node, "GET", f"/v1/usage?{query}", "/v1/usage", 400, token=TOKENS["reader"])
            self.assert_problem(answer, parameter=parameter)
        usage_path = f"/v1/usage?{span}"
        self.call(self.node, "GET", usage_path, "/v1/usage", 401, token=BAD_TOKEN)
        self.call(self.node, "GET", usage_path, "/v1/usage", 403, token=TOKENS["nobody"])

        for path in ("/v1/devices", "/v1/budgets", "/v1/nodes", "/v1/signals"):
            answer = self.call(self.node, "GET", path, path, 401, token=BAD_TOKEN)
            self.assertEqual(answer.header("WWW-Authenticate"), 'Bearer realm="jouled"')
            answer = self.call(self.node, "GET", path, path, 403, token=TOKENS["nobody"])
            self.assertIn("needs the read scope", answer.json["detail"])

    def estimates(self):
        body = {"model": MODEL, "training": TRAINING}
        answer = self.call(self.node, "POST", "/v1/estimate", "/v1/estimate", 200, body=body, token=TOKENS["reader"])
        by_device = {row["device"]: row for row in answer.json["estimates"]}
        self.assertEqual(by_device["cpu"]["status"], "no-model")
        self.assertEqual(by_device["sim:laptop-cpu"]["status"], "ok")
        self.assertEqual(answer.json["model"]["layers"][0]["name"], "fc1")
        answer = self.call(self.node, "POST", "/v1/estimate", "/v1/estimate", 200,
                           body=dict(body, devices=["sim:*"]))
        self.assertEqual([row["device"] for row in answer.json["estimates"]], ["sim:laptop-cpu"])

        bad = {"model": {"input": {"shape": [16]}, "layers": [{"type": "linaer", "out_features": 2}]},
               "training": TRAINING}
        answer = self.call(self.node, "POST", "/v1/estimate", "/v1/estimate", 400, body=bad)
        self.assert_problem(answer, pointer="/model/layers/0/type")
        answer = self.call(self.node, "POST", "/v1/estimate", "/v1/estimate", 400, body=dict(body, devices=["gpu9"]))
        self.assert_problem(answer, pointer="/devices")
        self.call(self.node, "POST", "/v1/estimate", "/v1/estimate", 401, body=body, token=BAD_TOKEN)
        self.call(self.node, "POST", "/v1/estimate", "/v1/estimate", 403, body=body, token=TOKENS["nobody"])

        # Pruning advice from the simulated device's model; the cpu has none (503).
        advise = {"model": MODEL, "training": TRAINING, "target": 0.3}
        answer = self.call(self.node, "POST", "/v1/advise", "/v1/advise", 200, body=advise, token=TOKENS["reader"])
        self.assertEqual(answer.json["device"], "sim:laptop-cpu")
        self.assertEqual(answer.json["layers"][0]["name"], "fc1")
        self.assertEqual(answer.json["layers"][2]["advised_width"], 2)  # the output: its classes
        answer = self.call(self.node, "POST", "/v1/advise", "/v1/advise", 400, body=dict(advise, target=1.5))
        self.assert_problem(answer, pointer="/target")
        answer = self.call(self.node, "POST", "/v1/advise", "/v1/advise", 400, body=dict(advise, min_multiplier=0.01))
        self.assert_problem(answer, pointer="/min_multiplier")
        self.call(self.node, "POST", "/v1/advise", "/v1/advise", 503, body=dict(advise, device="cpu"))
        self.call(self.node, "POST", "/v1/advise", "/v1/advise", 401, body=advise, token=BAD_TOKEN)
        self.call(self.node, "POST", "/v1/advise", "/v1/advise", 403, body=advise, token=TOKENS["nobody"])

    def jobs(self):
        node, alice, bob = self.node, TOKENS["alice"], TOKENS["bob"]
        # A long job that prints its own token (for its progress) and a line on stderr.
        long_job = {"name": "long", "run": {"command": ["/bin/sh", "-c",
                                                        'echo "$JOULE_JOB_TOKEN"; echo to-stderr >&2; exec sleep 30']},
                    "constraints": {"devices": ["cpu"]}, "priority": 5}
        answer = self.call(node, "POST", "/v1/jobs", "/v1/jobs", 201, body=long_job, token=alice)
        long_id = answer.json["id"]
        self.assertEqual(answer.header("Location"), f"/v1/jobs/{long_id}")
        self.assertEqual(answer.json["owner"], "token:alice")
        self.wait_for("the long job to run", lambda: self.job(long_id)["state"] == "running")

        def job_token():
            log = self.call(node, "GET", f"/v1/jobs/{long_id}/log", "/v1/jobs/{id}/log", 200, token=alice)
            return log.body.decode().strip()
        token = self.wait_for("the long job's output", job_token)

        # Its progress, with its own token.
        progress = f"/v1/jobs/{long_id}/progress"
        answer = self.call(node, "POST", progress, "/v1/jobs/{id}/progress", 200, body={"epoch": 1, "epochs": 5},
                           token=token)
        self.assertEqual((answer.json["epoch"], answer.json["epochs"]), (1, 5))
        for epoch in (2, 3):  # past the warm-up epoch: STEP's projection
            time.sleep(0.05)
            answer = self.call(node, "POST", progress, "/v1/jobs/{id}/progress", 200,
                               body={"epoch": epoch, "epochs": 5}, token=token)
        self.assertIn("projection", answer.json)
        self.assertIn("projection", self.job(long_id))
        answer = self.call(node, "POST", progress, "/v1/jobs/{id}/progress", 400, body={"epoch": 6, "epochs": 5},
                           token=token)
        self.assert_problem(answer, pointer="/epoch")
        self.call(node, "POST", progress, "/v1/jobs/{id}/progress", 401, body={"epoch": 4, "epochs": 5}, token=alice)
        self.call(node, "POST", "/v1/jobs/no-such-job/progress", "/v1/jobs/{id}/progress", 404,
                  body={"epoch": 4, "epochs": 5}, token=token)

        # Pause and resume by hand; someone else may not.
        answer = self.call(node, "POST", f"/v1/jobs/{long_id}/pause", "/v1/jobs/{id}/pause", 200, token=alice)
        self.assertTrue(answer.json["throttle"]["paused"])
        self.call(node, "POST", f"/v1/jobs/{long_id}/pause", "/v1/jobs/{id}/pause", 403, token=bob)
        self.call(node, "POST", f"/v1/jobs/{long_id}/pause", "/v1/jobs/{id}/pause", 401, token=BAD_TOKEN)
        answer = self.call(node, "POST", f"/v1/jobs/{long_id}/resume", "/v1/jobs/{id}/resume", 200, token=alice)
        self.assertFalse(answer.json.get("throttle", {}).get("paused", False))
        self.call(node, "POST", f"/v1/jobs/{long_id}/resume", "/v1/jobs/{id}/resume", 403, token=TOKENS["reader"])
        self.call(node, "POST", f"/v1/jobs/{long_id}/resume", "/v1/jobs/{id}/resume", 401, token=BAD_TOKEN)
        for verb in ("pause", "resume"):
            self.call(node, "POST", f"/v1/jobs/nope/{verb}", "/v1/jobs/{id}/" + verb, 404)

        # The queue behind it: a job with a model (estimated on every device) and one without;
        # max_queued_jobs = 2 refuses a third.
        modelled = {"name": "modelled", "model": MODEL, "training": TRAINING, "run": {"command": ["true"]}}
        modelled_id = self.call(node, "POST", "/v1/jobs", "/v1/jobs", 201, body=modelled, token=alice).json["id"]
        queued = {"name": "queued", "run": {"command": ["true"], "env": {"SECRET": "alice's"}}}
        queued_id = self.call(node, "POST", "/v1/jobs", "/v1/jobs", 201, body=queued, token=alice).json["id"]
        answer = self.call(node, "POST", "/v1/jobs", "/v1/jobs", 429, body=queued, token=alice)
        self.assertGreaterEqual(int(answer.header("Retry-After")), 1)
        self.call(node, "POST", "/v1/jobs", "/v1/jobs", 403, body=queued, token=TOKENS["reader"])
        self.call(node, "POST", "/v1/jobs", "/v1/jobs", 401, body=queued, token=BAD_TOKEN)
        estimate = {row["device"]: row for row in self.job(modelled_id)["estimate"]}
        self.assertEqual(estimate["sim:laptop-cpu"]["status"], "ok")
        self.assertIn(self.job(queued_id)["waiting"]["reason"], ("behind", "device-busy"))
        shown = self.job(queued_id, token=bob)["spec"]["run"]["env"]
        self.assertEqual(shown, {"SECRET": "(hidden: not your job)"})

        # Listing, in pages.
        answer = self.call(node, "GET", "/v1/jobs?limit=1", "/v1/jobs", 200, token=TOKENS["reader"])
        self.assertEqual([job["id"] for job in answer.json["jobs"]], [long_id])
        self.assertEqual(answer.json["total"], 3)
        self.assertEqual(answer.header("Link"), f'</v1/jobs?limit=1&after={long_id}>; rel="next"')
        answer = self.call(node, "GET", f"/v1/jobs?limit=1&after={answer.json['next']}", "/v1/jobs", 200)
        self.assertEqual([job["id"] for job in answer.json["jobs"]], [modelled_id])
        answer = self.call(node, "GET", "/v1/jobs?state=queued", "/v1/jobs", 200)
        self.assertEqual([job["id"] for job in answer.json["jobs"]], [modelled_id, queued_id])
        self.assertIsNone(answer.json["next"])
        self.assertIsNone(answer.header("Link"))
        answer = self.call(node, "GET", "/v1/jobs?order=newest&limit=2", "/v1/jobs", 200)
        self.assertEqual([job["id"] for job in answer.json["jobs"]], [queued_id, modelled_id])
        self.assertEqual(answer.header("Link"), f'</v1/jobs?limit=2&after={modelled_id}&order=newest>; rel="next"')
        answer = self.call(node, "GET", f"/v1/jobs?order=newest&after={modelled_id}", "/v1/jobs", 200)
        self.assertEqual([job["id"] for job in answer.json["jobs"]], [long_id])
        self.call(node, "HEAD", "/v1/jobs", "/v1/jobs", 200)
        for query, parameter in (("limit=0", "limit"), ("limit=1001", "limit"), ("state=sleeping", "state"),
                                 ("after=no-such-job", "after"), ("order=random", "order")):
            answer = self.call(node, "GET", f"/v1/jobs?{query}", "/v1/jobs", 400)
            self.assert_problem(answer, parameter=parameter)
        self.call(node, "GET", "/v1/jobs", "/v1/jobs", 401, token=BAD_TOKEN)
        self.call(node, "GET", "/v1/jobs", "/v1/jobs", 403, token=TOKENS["nobody"])

        # One job; one that does not exist.
        answer = self.call(node, "GET", "/v1/jobs/no-such-job", "/v1/jobs/{id}", 404)
        self.assert_problem(answer, parameter="id")
        self.call(node, "GET", f"/v1/jobs/{long_id}", "/v1/jobs/{id}", 401, token=BAD_TOKEN)
        self.call(node, "GET", f"/v1/jobs/{long_id}", "/v1/jobs/{id}", 403, token=TOKENS["nobody"])

        # Cancel: someone else's (403), a queued one (200), again (409), a running one (202).
        self.call(node, "DELETE", f"/v1/jobs/{queued_id}", "/v1/jobs/{id}", 403, token=bob)
        self.call(node, "DELETE", f"/v1/jobs/{queued_id}", "/v1/jobs/{id}", 401, token=BAD_TOKEN)
        answer = self.call(node, "DELETE", f"/v1/jobs/{queued_id}", "/v1/jobs/{id}", 200, token=alice)
        self.assertEqual(answer.json["state"], "cancelled")
        self.call(node, "DELETE", f"/v1/jobs/{queued_id}", "/v1/jobs/{id}", 409, token=alice)
        self.call(node, "DELETE", "/v1/jobs/no-such-job", "/v1/jobs/{id}", 404)
        answer = self.call(node, "DELETE", f"/v1/jobs/{long_id}", "/v1/jobs/{id}", 202, token=alice)
        self.assertTrue(answer.json["cancel_requested"])
        self.wait_for("the long job to end", lambda: self.job(long_id)["state"] == "cancelled")

        # Its log, in windows; the other stream; bad parameters; someone else's.
        log = f"/v1/jobs/{long_id}/log"
        answer = self.call(node, "GET", f"{log}?stream=stdout&offset=2", "/v1/jobs/{id}/log", 200)
        self.assertEqual(answer.header("Joule-Log-Offset"), "2")
        self.assertEqual(int(answer.header("Joule-Log-Next-Offset")), int(answer.header("Joule-Log-Size")))
        answer = self.call(node, "GET", f"{log}?stream=stderr&tail_bytes=4", "/v1/jobs/{id}/log", 200, token=alice)
        self.assertEqual(answer.body, b"err\n")
        self.call(node, "HEAD", log, "/v1/jobs/{id}/log", 200)
        for query, parameter in (("stream=stdin", "stream"), ("offset=-1", "offset"), ("tail_bytes=x", "tail_bytes")):
            answer = self.call(node, "GET", f"{log}?{query}", "/v1/jobs/{id}/log", 400)
            self.assert_problem(answer, parameter=parameter)
        self.call(node, "GET", log, "/v1/jobs/{id}/log", 403, token=bob)
        self.call(node, "GET", log, "/v1/jobs/{id}/log", 401, token=BAD_TOKEN)
        self.call(node, "GET", "/v1/jobs/no-such-job/log", "/v1/jobs/{id}/log", 404)

        # What an ended job refuses.
        self.call(node, "DELETE", f"/v1/jobs/{long_id}", "/v1/jobs/{id}", 409)
        for verb in ("pause", "resume"):
            self.call(node, "POST", f"/v1/jobs/{long_id}/{verb}", "/v1/jobs/{id}/" + verb, 409)
        self.call(node, "POST", progress, "/v1/jobs/{id}/progress", 409, body={"epoch": 4, "epochs": 5}, token=token)

        # The modelled job runs once the CPU is free, and ends with its metered energy.
        self.wait_for("the modelled job to end", lambda: self.job(modelled_id)["state"] == "succeeded")
        done = self.job(modelled_id)
        self.assertEqual(done["energy"]["source"], "modelled")
        self.assertEqual([event["state"] for event in done["events"]][-1], "succeeded")
        self.call(node, "GET", "/v1/jobs?state=succeeded", "/v1/jobs", 200)

    def bad_requests(self):
        node = self.node
        answer = self.call(node, "POST", "/v1/jobs", "/v1/jobs", 400, body={"run": {"command": []}})
        self.assert_problem(answer, pointer="/run/command")
        answer = self.call(node, "POST", "/v1/jobs", "/v1/jobs", 400,
                           body={"run": {"command": ["true"]}, "constraints": {"devices": ["cuda:7"]}})
        self.assert_problem(answer, pointer="/constraints/devices")
        answer = self.call(node, "POST", "/v1/jobs", "/v1/jobs", 400, body='{"run": ')
        self.assertNotIn("errors", answer.json)
        # Over [server] max_body_bytes: the parser refuses it from the Content-Length alone.
        connection = http.client.HTTPConnection("127.0.0.1", node.port, timeout=30)
        try:
            connection.putrequest("POST", "/v1/jobs")
            connection.putheader("Content-Type", "application/json")
            connection.putheader("Content-Length", str(65536 + 1))
            connection.endheaders()
            response = connection.getresponse()
            answer = Answer("POST", "/v1/jobs", response, response.read())
        finally:
            connection.close()
        self.assertEqual(answer.status, 413, answer)
        self.validate(answer, "post", "/v1/jobs")

    def probes(self):
        node = self.node
        runs = self.call(node, "GET", "/v1/probes", "/v1/probes", 200, token=TOKENS["reader"]).json
        self.assertEqual(runs, [])
        answer = self.call(node, "POST", "/v1/probes", "/v1/probes", 400, body={"device": "sim:laptop-cpu"})
        self.assert_problem(answer, pointer="/device")
        answer = self.call(node, "POST", "/v1/probes", "/v1/probes", 400, body={"device": "cpu", "seconds": 0})
        self.assert_problem(answer, pointer="/seconds")
        self.call(node, "POST", "/v1/probes", "/v1/probes", 403, body={"device": "cpu"}, token=TOKENS["alice"])
        self.call(node, "POST", "/v1/probes", "/v1/probes", 401, body={"device": "cpu"}, token=BAD_TOKEN)
        run = self.call(node, "POST", "/v1/probes", "/v1/probes", 202, body={"device": "cpu", "seconds": 0.2},
                        token=TOKENS["admin"]).json
        self.assertEqual((run["reason"], run["state"]), ("requested", "running"))
        answer = self.call(node, "GET", f"/v1/probes/{run['id']}", "/v1/probes/{id}", 200)
        self.assertEqual(answer.json["id"], run["id"])
        self.call(node, "GET", "/v1/probes", "/v1/probes", 200)
        answer = self.call(node, "GET", "/v1/probes/p0-0", "/v1/probes/{id}", 404)
        self.assert_problem(answer, parameter="id")
        self.call(node, "GET", "/v1/probes", "/v1/probes", 401, token=BAD_TOKEN)
        self.call(node, "GET", "/v1/probes", "/v1/probes", 403, token=TOKENS["nobody"])
        self.call(node, "GET", f"/v1/probes/{run['id']}", "/v1/probes/{id}", 401, token=BAD_TOKEN)
        self.call(node, "GET", f"/v1/probes/{run['id']}", "/v1/probes/{id}", 403, token=TOKENS["nobody"])
        self.call(node, "HEAD", f"/v1/probes/{run['id']}", "/v1/probes/{id}", 200)

        def agent_probing():
            devices = self.send(self.agent, "GET", "/v1/devices").json["devices"]
            cpu = next(d for d in devices if d["name"] == "cpu")
            return ((cpu.get("model") or {}).get("probing") or {}).get("state") == "unavailable"

        wait_for("the agent's cpu to find its joule-worker missing", agent_probing)
        answer = self.call(self.agent, "POST", "/v1/probes", "/v1/probes", 409, body={"device": "cpu", "seconds": 5})
        self.assertIn("device cpu cannot be probed: joule-worker env failed", answer.json["detail"])
        self.assert_problem(answer, pointer="/device")

    def cluster(self):
        sync = "/v1/cluster/sync"
        coordinator, agent = self.coordinator, self.agent
        # Not a coordinator: 409 (after the agent check: an admin API token stands in for an agent token).
        self.call(self.node, "POST", sync, sync, 409, body={"node": "n1", "incarnation": "i1"}, token=TOKENS["admin"])
        self.call(self.node, "POST", sync, sync, 401, body={"node": "n1", "incarnation": "i1"})
        # A coordinator: an agent's report, answered with what it should run.
        report = {"node": "lab-2", "incarnation": str(uuid.uuid4()), "version": "0.1.0", "wait_seconds": 0,
                  "devices": [{"name": "cpu", "source": "modelled", "energy_joules": 1.5, "power_watts": 12.0}],
                  "jobs": [], "models": []}
        answer = self.call(coordinator, "POST", sync, sync, 200, body=report)
        self.assertGreater(answer.json["lease_seconds"], 0)
        answer = self.call(coordinator, "POST", sync, sync, 400, body=dict(report, node="lab 2"))
        self.assert_problem(answer, pointer="/node")
        answer = self.call(coordinator, "POST", sync, sync, 400, body=dict(report, devices=[{"name": "cpu"}]))
        self.assert_problem(answer, pointer="/devices/0/source")
        self.call(coordinator, "POST", sync, sync, 401, body=report, token=BAD_TOKEN)

        def agent_synced():
            nodes = self.call(coordinator, "GET", "/v1/nodes", "/v1/nodes", 200).json
            return {entry["name"] for entry in nodes["nodes"]} == {"agent1", "lab-2"} and nodes
        nodes = self.wait_for("the agent's first sync", agent_synced)
        self.assertEqual(nodes["role"], "coordinator")
        self.assertEqual(nodes["total"], 2)
        self.assertIsNone(nodes["next"])
        # A page at a time, in name order, with the total and the next page's cursor.
        first = self.call(coordinator, "GET", "/v1/nodes?limit=1", "/v1/nodes", 200)
        self.assertEqual([entry["name"] for entry in first.json["nodes"]], ["agent1"])
        self.assertEqual((first.json["total"], first.json["next"]), (2, "agent1"))
        self.assertEqual(first.header("Link"), '</v1/nodes?limit=1&after=agent1>; rel="next"')
        self.assertEqual(sum(first.json["states"].values()), 2)
        second = self.call(coordinator, "GET", "/v1/nodes?limit=1&after=agent1", "/v1/nodes", 200)
        self.assertEqual([entry["name"] for entry in second.json["nodes"]], ["lab-2"])
        self.assertIsNone(second.json["next"])
        self.assertIsNone(second.header("Link"))
        self.assert_problem(self.call(coordinator, "GET", "/v1/nodes?limit=101", "/v1/nodes", 400), parameter="limit")
        answer = self.wait_for("the agent to report its sync", lambda: (
            lambda a: a.json["last_sync"] is not None and a)(self.call(agent, "GET", "/v1/nodes", "/v1/nodes", 200)))
        self.assertEqual((answer.json["role"], answer.json["node"]), ("agent", "agent1"))

    def answers_any_route_may_give(self):
        components = self.document["components"]["responses"]
        answer = self.send(self.node, "GET", "/v1/no-such-route")
        self.assertEqual(answer.status, 404, answer)
        self.validate(answer, "get", "/v1/no-such-route", components["NotFound"])
        answer = self.send(self.node, "GET", "/v1/jobs/%FF")
        self.assertEqual(answer.status, 400, answer)
        self.validate(answer, "get", "/v1/jobs/{id}", components["BadRequest"])
        answer = self.send(self.node, "GET", "/v1/jobs?state=%0A")
        self.assertEqual(answer.status, 400, answer)
        self.validate(answer, "get", "/v1/jobs", components["BadRequest"])

    def allow_lists_match_the_document(self):
        """For each documented path, a method no route has gets a 405 whose Allow header lists
        exactly the document's methods for that path (and HEAD wherever GET)."""
        components = self.document["components"]["responses"]
        for path, item in self.document["paths"].items():
            methods = {method.upper() for method in item if method in METHODS}
            if "GET" in methods:
                methods.add("HEAD")
            target = path.replace("{id}", "some-id")
            answer = self.send(self.node, "JOULEPROBE", target)
            with self.subTest(path=path):
                self.assertEqual(answer.status, 405, answer)
                self.validate(answer, "joule-probe", path, components["MethodNotAllowed"])
                allow = ", ".join(sorted(methods))
                self.assertEqual(answer.header("Allow"), allow)
                self.assertEqual(answer.json["detail"], f"JOULEPROBE is not allowed here; use {allow}")

    def counted_routes_are_documented(self):
        """jouled counts every answer under its route's template: each must be a documented path."""
        text = self.call(self.node, "GET", "/metrics", "/metrics", 200).body.decode()
        counted = set(re.findall(r'^joule_http_requests_total\{[^}]*route="([^"]+)"', text, re.M))
        self.assertIn("/v1/jobs/{id}/log", counted)
        # Besides route templates: answers before any route (a bad target, no such path), the
        # HTTP server's own refusals (413, 503) and 401s before a route is known to the caller.
        undocumented = counted - set(self.document["paths"]) - {"unmatched", "refused", "/v1 (unauthorized)"}
        self.assertEqual(undocumented, set())


if __name__ == "__main__":
    unittest.main()
