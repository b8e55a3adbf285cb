"""The seeded random schedule of the whole-system test: every role of the product at once, on
threads, for a set time.

Each role draws from a random.Random of its own, seeded by the run's seed and its name, and its
draws do not depend on what the product answered: the same seed replays the same choices (which
persona, which call, which regulation, which process is killed and when), though not the same
thread timing. The timed actions (regulations, kills, compactions, imports, the audience file)
are planned up front (tests/system/plan.py), printed and kept with the oracle.

Roles:
- senders: identify, track, page, screen and batch calls on the HTTP API, the tag's and the
  mobile SDK's writeKey routes and the Segment drop-in, some sent twice with the same messageId
  (a client retry); a try with no answer is retried with the same body until answered;
- commands: `send_email` and `start_journey` tracks;
- preferences: updates through the preferences API, by subscription id;
- import: `mallard import customers` of a CSV (and the same file again);
- audience: an audience file added to the config dir;
- regulations: ACCESS, SUPPRESS, NO_TRACK, SUPPRESS_WITH_DELETE and UNSUPPRESS filings;
- compaction: the Dagster `compaction` job (`dagster job execute`) and `mallard pipeline run`;
- chaos: kill -9 of the server, the watcher (the dispatcher runs in it), the daemon or a live
  regulation run, then a restart.
"""

from __future__ import annotations

import base64
import csv
import functools
import hashlib
import json
import random
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

from orchestration.context import subscription_id
from tests.system.oracle import Attempt, Filing, Kill, Oracle, Preference, Run, Sent
from tests.system.plan import GROUPS, PLAIN, ROLES, Persona, Planned, make_personas, plan
from tests.system.product import JOURNEY_ID, Product

TRACKS = ["Logged In", "Order Completed", "Product Viewed", "Signed Up", "Cart Updated"]
# How long after the schedule ends a sender still retries a message with no answer.
RETRY_GRACE_S = 60.0


class Schedule:
    """Runs the roles against a started product until `duration` s have passed."""

    def __init__(
        self,
        product: Product,
        oracle: Oracle,
        seed: int,
        duration: float,
        roles: Iterable[str] = ROLES,
        senders: int = 3,
    ) -> None:
        self.product = product
        self.oracle = oracle
        self.seed = seed
        self.duration = duration
        self.roles = set(roles)
        assert self.roles <= set(ROLES), f"unknown roles: {self.roles - set(ROLES)}"
        self.senders = senders if "senders" in self.roles else 0
        self.personas = make_personas(seed)
        self.plan = [p for p in plan(seed, duration, self.personas) if p.role in self.roles]
        self.start = 0.0
        self.stop = threading.Event()
        self.secret = product.paths.secret_file.read_text().strip()

    # --- running -----------------------------------------------------------------------------

    def seed_personas(self) -> None:
        """Each persona's first identify (userId, anonymousId, email, tier), before the roles
        start: later calls of the tag with the anonymousId alone are theirs."""
        with httpx.Client(timeout=30) as client:
            for p in self.personas:
                body = {
                    "userId": p.user_id,
                    "anonymousId": p.anonymous_id,
                    "event": "identify",
                    "traits": {"email": p.email, "tier": p.tier, "firstName": f"P{p.index}"},
                    "messageId": f"seed-{p.user_id}",
                }
                self._post(
                    client, f"{self.product.base}/identify", body, [(p.user_id, body)], "api"
                )

    def run(self, until: float) -> None:
        """Runs every role for the duration, then waits for what they started until `until`
        (time.monotonic)."""
        self.start = self.oracle.started = time.time()
        roles: list[tuple[str, Callable[[], None]]] = [
            (f"sender-{i}", functools.partial(self._sender, i)) for i in range(self.senders)
        ]
        roles += [
            (name, fn)
            for name, fn in (("commands", self._commands), ("preferences", self._preferences))
            if name in self.roles
        ]
        roles.append(("timed", self._timed))
        threads = [
            threading.Thread(target=self._guard, args=(name, fn), name=name, daemon=True)
            for name, fn in roles
        ]
        for t in threads:
            t.start()
        time.sleep(self.duration)
        self.stop.set()
        for t in threads:
            t.join(max(0.0, until - time.monotonic()))
            if t.is_alive():
                self.oracle.problem(f"role {t.name} still running at the end")
        self.oracle.ended = time.time()

    def _guard(self, name: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception:
            self.oracle.problem(f"role {name} crashed:\n{traceback.format_exc()}")

    def _elapsed(self) -> float:
        return time.time() - self.start

    def _wait(self, seconds: float) -> bool:
        """Sleep; False once the schedule is over."""
        return not self.stop.wait(seconds)

    # --- posting and recording ---------------------------------------------------------------

    def _post(
        self,
        client: httpx.Client,
        url: str,
        body: dict[str, Any],
        items: list[tuple[str, dict[str, Any]]],
        route: str,
        headers: dict[str, str] | None = None,
        as_text: bool = False,
    ) -> None:
        """Post until answered (not 5xx), the same body each try, recording every try of every
        item ((persona userId, the item's message) each)."""
        sents = [
            self.oracle.message(msg["messageId"], user, _kind(msg), route) for user, msg in items
        ]
        hdrs = dict(headers if headers is not None else self.product.headers)
        if as_text:
            hdrs["content-type"] = "text/plain"
        give_up = max(time.time(), self.start + self.duration) + RETRY_GRACE_S
        while True:
            t0 = time.time()
            try:
                r = client.post(url, content=json.dumps(body), headers=hdrs)
            except httpx.HTTPError as e:
                self._record(sents, Attempt(t0, time.time(), None))
                if time.time() > give_up:
                    self.oracle.anomaly(f"{url}: no answer until the end: {e!r}")
                    return
                time.sleep(0.3)
                continue
            t1 = time.time()
            if r.status_code == 200:
                answer = r.json()
                ids = answer.get("eventIds") or [answer.get("eventId")]
                if len(ids) != len(sents):
                    self.oracle.anomaly(f"{url}: {len(ids)} eventIds for {len(sents)} items")
                for sent, event_id in zip(sents, ids, strict=False):
                    self.oracle.attempt(sent, Attempt(t0, t1, 200, event_id))
                return
            self._record(sents, Attempt(t0, t1, r.status_code))
            if r.status_code < 500 or time.time() > give_up:
                self.oracle.anomaly(f"{url}: {r.status_code} {r.text[:300]}")
                return
            time.sleep(0.3)

    def _record(self, sents: list[Sent], attempt: Attempt) -> None:
        for sent in sents:
            self.oracle.attempt(sent, attempt)

    # --- senders -----------------------------------------------------------------------------

    def _sender(self, index: int) -> None:
        rng = random.Random(f"{self.seed}:sender-{index}")
        wk = self.product.creds["writeKey"]
        basic = {"authorization": "Basic " + base64.b64encode(f"{wk}:".encode()).decode()}
        n = 0
        with httpx.Client(timeout=30) as client:
            while self._wait(rng.uniform(0.02, 0.3)):
                p = rng.choice(self.personas)
                route = rng.choices(
                    ["api", "batch", "tag", "mobile", "segment"], weights=[5, 2, 2, 1, 1]
                )[0]
                retry = rng.random() < 0.1
                msgs = []
                for _ in range(rng.randint(2, 6) if route in ("batch", "mobile") else 1):
                    n += 1
                    msgs.append(_message(rng, p, f"m{self.seed}-s{index}-{n}", route))
                items = [(p.user_id, m) for m in msgs]
                for _ in range(2 if retry else 1):
                    if route == "api":
                        msg = msgs[0]
                        action = "identify" if msg["type"] == "identify" else msg["type"]
                        body = {k: v for k, v in msg.items() if k != "type"}
                        url = f"{self.product.base}/{action}"
                        self._post(client, url, body, items, route)
                    elif route == "batch":
                        url = f"{self.product.base}/batch"
                        self._post(client, url, {"batch": msgs}, items, route)
                    elif route == "tag":
                        url = f"{self.product.url}/cdp/events/std/{msgs[0]['type'][0]}"
                        body = {**msgs[0], "writeKey": wk}
                        self._post(client, url, body, items, route, {}, as_text=True)
                    elif route == "mobile":
                        url = f"{self.product.url}/cdp/events/std/mobile/batch"
                        self._post(client, url, {"writeKey": wk, "batch": msgs}, items, route, {})
                    else:
                        url = f"{self.product.url}/v1/{msgs[0]['type']}"
                        self._post(client, url, msgs[0], items, route, basic)

    def _commands(self) -> None:
        rng = random.Random(f"{self.seed}:commands")
        n = 0
        # Commands stop a little before the others, so the journeys they start (a wait of 10 s
        # and two sends) end within the schedule's last passes.
        until = self.start + self.duration - min(30.0, self.duration / 5)
        with httpx.Client(timeout=30) as client:
            while self._wait(rng.uniform(0.8, 3.0)) and time.time() < until:
                p = rng.choice(self.personas)
                n += 1
                body: dict[str, Any] = {"userId": p.user_id, "messageId": f"c{self.seed}-{n}"}
                if rng.random() < 0.5:
                    body |= {"event": "send_email", "assetId": "welcome"}
                else:
                    body |= {
                        "event": "start_journey",
                        "properties": {"journeyIdToTrigger": JOURNEY_ID},
                    }
                for _ in range(2 if rng.random() < 0.1 else 1):  # a replayed command
                    self._post(
                        client, f"{self.product.base}/track", body, [(p.user_id, body)], "api"
                    )

    def _preferences(self) -> None:
        rng = random.Random(f"{self.seed}:preferences")
        plain = [p for p in self.personas if p.group == PLAIN]
        with httpx.Client(timeout=30) as client:
            # A customer's preferences exist once a pass has modelled it: updates start then.
            first = f"{self.product.url}/cdp/marketing-preferences/{self._sid(plain[0])}"
            while self._wait(2.0) and _status(client, first) != 200:
                pass
            while self._wait(rng.uniform(1.0, 4.0)):
                p = rng.choice(plain)
                body: dict[str, Any] = {
                    "channels": [{"channel": "email", "subscribed": rng.random() < 0.7}],
                    "categories": [
                        {"category": "product_updates", "subscribed": rng.random() < 0.6}
                    ],
                }
                url = f"{self.product.url}/cdp/marketing-preferences/{self._sid(p)}"
                t0 = time.time()
                try:
                    status: int | None = client.post(
                        url, json=body, params={"assetId": "SYS-TEST"}
                    ).status_code
                except httpx.HTTPError:
                    status = None
                self.oracle.preference(Preference(p.user_id, body, t0, time.time(), status))

    def _sid(self, p: Persona) -> str:
        customer = hashlib.md5(f"demo|user:{p.user_id}".encode()).hexdigest()
        return subscription_id(self.secret, customer)

    # --- the timed actions -------------------------------------------------------------------

    def _timed(self) -> None:
        """The planned actions, each on a thread of its own at its time (a kill does not wait
        for an import)."""
        started: list[threading.Thread] = []
        for action in self.plan:
            if not self._wait(max(0.0, action.at - self._elapsed())):
                break
            fn = getattr(self, f"_do_{action.role}")
            t = threading.Thread(
                target=self._guard,
                args=(f"{action.role} {action.action}", lambda a=action, f=fn: f(a)),
            )
            t.start()
            started.append(t)
        for t in started:
            t.join(900)

    def _do_regulations(self, action: Planned) -> None:
        body = {
            "regulationType": action.action,
            "subject": {"type": "USER_ID", "ids": list(action.users)},
        }
        give_up = self.start + self.duration + RETRY_GRACE_S
        with httpx.Client(timeout=60) as client:
            while True:
                t0 = time.time()
                try:
                    r = client.post(
                        f"{self.product.base}/regulations", json=body, headers=self.product.headers
                    )
                except httpx.HTTPError as e:
                    self.oracle.filing(
                        Filing(
                            action.action, list(action.users), t0, time.time(), None, answer=repr(e)
                        )
                    )
                    if time.time() > give_up:
                        return
                    time.sleep(0.5)
                    continue
                answer = (
                    r.json()
                    if r.headers.get("content-type", "").startswith("application/json")
                    else {}
                )
                self.oracle.filing(
                    Filing(
                        action.action,
                        list(action.users),
                        t0,
                        time.time(),
                        r.status_code,
                        answer.get("regulationId"),
                        r.text[:300],
                    )
                )
                if r.status_code < 500 or time.time() > give_up:
                    if r.status_code != 200:
                        self.oracle.anomaly(
                            f"regulation {action.action}: {r.status_code} {r.text[:300]}"
                        )
                    return
                time.sleep(0.5)

    def _do_import(self, action: Planned) -> None:
        by_user = {p.user_id: p for p in self.personas}
        path = self.product.work / f"{action.action}.csv"
        rows = [(u, f"{action.action}-{u}") for u in action.users]
        if not path.exists():
            with open(path.with_suffix(".tmp"), "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(["userId", "email", "importMark"])
                for user, mark in rows:
                    w.writerow([user, by_user[user].email, mark])
            path.with_suffix(".tmp").rename(path)
        args = ["import", "customers", str(path), "--client", "demo", "--account", "demo", "--json"]
        # One import at a time per data dir: another one running is refused, and tried again
        # as a user would.
        for _ in range(30):
            run = self._command("import", f"import {path.name}", args, rows)
            if "another import is running" not in run.output:
                return
            time.sleep(2)

    def _do_audience(self, action: Planned) -> None:
        self.product.add_audience()
        self.oracle.run(Run("audience", "added", time.time(), time.time(), 0))

    def _do_compaction(self, action: Planned) -> None:
        if action.action == "dagster":
            dagster = str(Path(sys.executable).parent / "dagster")
            cmd = [dagster, "job", "execute", "-m", "orchestration.definitions", "-j", "compaction"]
            self._command("compaction", "dagster job execute -j compaction", cmd)
        else:
            self._command("compaction", "mallard pipeline run", ["pipeline", "run"])

    def _command(
        self, role: str, what: str, args: list[str], rows: list[tuple[str, str]] | None = None
    ) -> Run:
        """Runs a mallard command (or another program, given its path) with the product's
        environment, and records it."""
        cmd = args if args[0].startswith("/") else [sys.executable, "-m", "mallard.cli", *args]
        t0 = time.time()
        try:
            out = subprocess.run(
                cmd,
                cwd=self.product.root,
                env=self.product.env,
                capture_output=True,
                text=True,
                timeout=900,
            )
            code, text = out.returncode, (out.stdout + out.stderr)[-4000:]
        except subprocess.TimeoutExpired as e:
            code, text = None, f"timed out: {e}"
        run = Run(role, what, t0, time.time(), code, text, rows or [])
        self.oracle.run(run)
        return run

    def _do_chaos(self, action: Planned) -> None:
        victim = action.action
        if victim != "regulation-run":
            pid = self.product.kill(victim)
            at = time.time()
            kill = Kill(victim, pid, at, detail="" if pid else "was not running")
            time.sleep(random.Random(f"{self.seed}:down:{action.at}").uniform(0.2, 3.0))
            self.product.restart(victim)
            kill.restarted_at = time.time()
            self.oracle.kill(kill)
            return
        deadline = time.time() + 10
        while time.time() < deadline:
            runs = self.product.regulation_run_pids()
            if runs:
                regulation_id, pid = sorted(runs.items())[0]
                self.product.kill_regulation_run(pid)
                kill = Kill(victim, pid, time.time(), detail=regulation_id)
                time.sleep(0.5)
                self._command("chaos", "mallard regulations resume", ["regulations", "resume"])
                kill.restarted_at = time.time()
                self.oracle.kill(kill)
                return
            time.sleep(0.2)
        self.oracle.kill(Kill(victim, None, time.time(), detail="no live regulation run"))

    def describe(self) -> str:
        """The plan, one line per action, and the personas' groups."""
        lines = [f"{p.at:7.1f}s {p.role:<12} {p.action} {' '.join(p.users)}" for p in self.plan]
        groups = {g: [p.user_id for p in self.personas if p.group == g] for g in GROUPS}
        return "\n".join([*lines, json.dumps(groups)])

    def dump(self, path: Path) -> None:
        doc = {
            "personas": [asdict(p) for p in self.personas],
            "plan": [asdict(p) for p in self.plan],
        }
        path.write_text(json.dumps(doc, indent=1))


def _status(client: httpx.Client, url: str) -> int | None:
    try:
        return client.get(url).status_code
    except httpx.HTTPError:
        return None


def _kind(msg: dict[str, Any]) -> str:
    event = str(msg.get("event", ""))
    if event.lower() in ("send_email", "start_journey"):
        return event.lower()
    return str(msg.get("type") or ("identify" if event == "identify" else "track"))


def _message(rng: random.Random, p: Persona, message_id: str, route: str) -> dict[str, Any]:
    """A message of the persona for the route: typed (`type`) as batch items are."""
    kind = rng.choices(["identify", "track", "page", "screen"], weights=[2, 6, 2, 1])[0]
    who: dict[str, Any] = {"userId": p.user_id}
    if route in ("tag", "mobile") and rng.random() < 0.5:
        who = {"anonymousId": p.anonymous_id}  # before the page's identify: anonymous
    elif route in ("tag", "mobile"):
        who["anonymousId"] = p.anonymous_id
    msg: dict[str, Any] = {"type": kind, **who, "messageId": message_id}
    if kind == "identify":
        msg["event"] = "identify"
        msg["traits"] = {"plan": rng.choice(["free", "pro", "team"]), "score": rng.randint(1, 99)}
    elif kind == "track":
        msg["event"] = rng.choice(TRACKS)
        msg["properties"] = {"n": rng.randint(1, 9)}
    elif kind == "page":
        msg["event"] = "page"
        msg["name"] = rng.choice(["Home", "Pricing", "Docs"])
        msg["properties"] = {"path": f"/{msg['name'].lower()}"}
    else:
        msg["name"] = rng.choice(["Main", "Cart"])
    return msg
