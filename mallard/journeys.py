"""Journeys as code: `<config dir>/journeys/<journeyId>.toml`, loaded, validated and cached.

A journey file (DESIGN.md section 11):

    name = "Welcome series"
    reentry = "never"            # never (the default) | after_exit | always
    exit_on = "unsubscribed"     # optional: an event that ends the journey for the customer
    [[steps]]                    # the first step is the entry unless stepIdToTrigger names another
    id = "hello"
    type = "send"                # send | wait | wait_for | branch | exit
    asset = "welcome"
    next = "pause"

Keys per step type (every step has `id` and `type`):
    send      asset; next
    wait      duration; next
    wait_for  event, timeout; where, next, on_timeout
    branch    cases = [{ if = "<condition>", goto = "<step>" }, ...], else = "<step>"
    exit      nothing
Keys after `;` are optional. A send, wait or wait_for without `next` ends the journey there; a
wait_for without `on_timeout` ends it on timeout. A wait_for needs a timeout so that no customer
waits forever; a branch needs `else` so that it always says where to go.

Durations are a positive integer and a unit: "30s", "5m", "2h", "3d", "1w".

Conditions (branch `if`, wait_for `where`) are a small expression language:
    traits.plan = 'pro' and (events.email_clicked > 0 or traits.score >= 4.5)
    properties.assetId in ('welcome', 'reminder')
    traits.address.city is not null and not preferences.unsubscribeAll = true
Comparisons are `<path> <op> <literal>` with = != < <= > >=, `<path> is [not] null` and
`<path> [not] in (<literal>, ...)`, joined by and / or / not (that precedence, loosest first)
and parentheses. Literals: 'single-quoted' strings ('' is a quote), integers, decimals, true,
false, null. Paths are dotted and start at traits, properties (the awaited event's
properties), preferences or events (`events.<name>`: how many of that event the customer has
had since entering the journey). Keywords are case-insensitive.

No maintained library evaluates this language: simpleeval (the one of its kind on this machine's
package lists) evaluates Python expressions through `ast`, which has no `is null`, no `=` and no
SQL-style quotes; so a tokenizer and recursive-descent parser are ours, with no eval and no SQL.
"""

from __future__ import annotations

import os
import re
import threading
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mallard.assets import Asset, AssetError, load_assets_and_errors

__all__ = [
    "REENTRY",
    "STEP_TYPES",
    "CheckResult",
    "Condition",
    "ConditionError",
    "Journey",
    "JourneyError",
    "Step",
    "check_journeys",
    "journeys_dir",
    "load_journey",
    "load_journeys",
    "load_journeys_and_errors",
    "parse_duration",
]

REENTRY = ("never", "after_exit", "always")
STEP_TYPES = ("send", "wait", "wait_for", "branch", "exit")
ROOTS = ("traits", "properties", "preferences", "events")
JOURNEY_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
STEP_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
# Keys each step type takes beyond `id` and `type`: (required, optional).
STEP_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "send": (("asset",), ("next",)),
    "wait": (("duration",), ("next",)),
    "wait_for": (("event", "timeout"), ("where", "next", "on_timeout")),
    "branch": (("cases", "else"), ()),
    "exit": ((), ()),
}
TOP_KEYS = ("name", "reentry", "exit_on", "steps")
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"^([0-9]+)([smhdw])$")


def parse_duration(text: Any) -> float:
    """Seconds of "30s", "5m", "2h", "3d" or "1w" (a positive integer and a unit); ValueError
    otherwise."""
    m = _DURATION.match(text.strip()) if isinstance(text, str) else None
    if m is None or int(m.group(1)) <= 0:
        raise ValueError(
            f"{text!r} is not a duration: a positive integer and s, m, h, d or w, like '2d'"
        )
    return float(int(m.group(1)) * UNITS[m.group(2)])


# -- conditions ---------------------------------------------------------------------------------


class ConditionError(ValueError):
    """A condition that does not parse; `position` is the 0-based offset in the text."""

    def __init__(self, text: str, position: int, message: str) -> None:
        self.text = text
        self.position = position
        self.message = message
        super().__init__(f"{message} at position {position} of {text!r}")


@dataclass(frozen=True)
class _Token:
    kind: str  # str, num, word, op, end
    value: Any
    pos: int


_TOKEN = re.compile(
    r"""(?P<ws>\s+)
      | (?P<str>'(?:[^']|'')*')
      | (?P<num>-?[0-9]+(?:\.[0-9]+)?(?![A-Za-z_]))
      | (?P<word>[A-Za-z_][A-Za-z0-9_-]*(?:\.[A-Za-z0-9_][A-Za-z0-9_-]*)*)
      | (?P<op><=|>=|!=|<>|=|<|>|\(|\)|,)
    """,
    re.VERBOSE,
)
KEYWORDS = frozenset({"and", "or", "not", "is", "null", "in", "true", "false"})


def _tokens(text: str) -> list[_Token]:
    out: list[_Token] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            if text[pos] == "'":
                raise ConditionError(text, pos, "unterminated string")
            raise ConditionError(text, pos, f"unexpected character {text[pos]!r}")
        kind = m.lastgroup
        raw = m.group()
        if kind == "str":
            out.append(_Token("str", raw[1:-1].replace("''", "'"), pos))
        elif kind == "num":
            out.append(_Token("num", float(raw) if "." in raw else int(raw), pos))
        elif kind == "word":
            low = raw.lower()
            out.append(_Token("word", low if low in KEYWORDS else raw, pos))
        elif kind == "op":
            out.append(_Token("op", "!=" if raw == "<>" else raw, pos))
        pos = m.end()
    out.append(_Token("end", None, len(text)))
    return out


# The parsed tree: ("or", [nodes]) | ("and", [nodes]) | ("not", node)
# | ("cmp", path, op, literal) | ("null", path, negated) | ("in", path, literals, negated)
_Node = tuple[Any, ...]


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = _tokens(text)
        self.i = 0
        self.paths: list[str] = []

    def peek(self) -> _Token:
        return self.toks[self.i]

    def take(self) -> _Token:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def fail(self, tok: _Token, wanted: str) -> ConditionError:
        found = "the end" if tok.kind == "end" else repr(self.text[tok.pos :].split()[0])
        return ConditionError(self.text, tok.pos, f"expected {wanted}, found {found}")

    def is_word(self, word: str) -> bool:
        tok = self.peek()
        return tok.kind == "word" and tok.value == word

    def expect_op(self, op: str) -> None:
        tok = self.take()
        if tok.kind != "op" or tok.value != op:
            raise self.fail(tok, repr(op))

    def parse(self) -> _Node:
        node = self.or_()
        if self.peek().kind != "end":
            raise self.fail(self.peek(), "and, or or the end")
        return node

    def or_(self) -> _Node:
        nodes = [self.and_()]
        while self.is_word("or"):
            self.take()
            nodes.append(self.and_())
        return nodes[0] if len(nodes) == 1 else ("or", nodes)

    def and_(self) -> _Node:
        nodes = [self.not_()]
        while self.is_word("and"):
            self.take()
            nodes.append(self.not_())
        return nodes[0] if len(nodes) == 1 else ("and", nodes)

    def not_(self) -> _Node:
        if self.is_word("not"):
            self.take()
            return ("not", self.not_())
        tok = self.peek()
        if tok.kind == "op" and tok.value == "(":
            self.take()
            node = self.or_()
            self.expect_op(")")
            return node
        return self.comparison()

    def path(self) -> str:
        tok = self.take()
        if tok.kind != "word" or tok.value in KEYWORDS:
            raise self.fail(tok, "a path like traits.plan")
        parts = tok.value.split(".")
        if parts[0] not in ROOTS:
            raise ConditionError(
                self.text, tok.pos, f"a path starts with {', '.join(ROOTS)}, not {parts[0]!r}"
            )
        if len(parts) < 2:
            raise ConditionError(self.text, tok.pos, f"{parts[0]} needs a key, like {parts[0]}.x")
        if parts[0] == "events" and len(parts) != 2:
            raise ConditionError(self.text, tok.pos, "an events path is events.<event name>")
        self.paths.append(tok.value)
        return str(tok.value)

    def literal(self) -> Any:
        tok = self.take()
        if tok.kind in ("str", "num"):
            return tok.value
        if tok.kind == "word" and tok.value in ("true", "false", "null"):
            return {"true": True, "false": False, "null": None}[tok.value]
        raise self.fail(tok, "a literal ('text', a number, true, false or null)")

    def comparison(self) -> _Node:
        path = self.path()
        tok = self.take()
        if tok.kind == "op" and tok.value in ("=", "!=", "<", "<=", ">", ">="):
            return ("cmp", path, tok.value, self.literal())
        if tok.kind == "word" and tok.value == "is":
            negated = self.is_word("not")
            if negated:
                self.take()
            null = self.take()
            if null.kind != "word" or null.value != "null":
                raise self.fail(null, "null")
            return ("null", path, negated)
        negated = tok.kind == "word" and tok.value == "not"
        if negated:
            tok = self.take()
        if tok.kind == "word" and tok.value == "in":
            self.expect_op("(")
            values = [self.literal()]
            while self.peek().kind == "op" and self.peek().value == ",":
                self.take()
                values.append(self.literal())
            self.expect_op(")")
            return ("in", path, tuple(values), negated)
        raise self.fail(tok, "an operator (= != < <= > >=, is, in)")


def _lookup(ctx: Mapping[str, Any], path: str) -> Any:
    parts = path.split(".")
    value: Any = ctx
    for part in parts:
        if not isinstance(value, Mapping) or part not in value:
            # A count of an event never had is 0, not null.
            return 0 if parts[0] == "events" else None
        value = value[part]
    return value


def _kind(value: Any) -> str | None:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "num"
    if isinstance(value, str):
        return "str"
    return None


def _equal(a: Any, b: Any) -> bool:
    ka = _kind(a)
    return ka is not None and ka == _kind(b) and a == b


_ORDER: dict[str, Callable[[Any, Any], bool]] = {
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


def _eval(node: _Node, ctx: Mapping[str, Any]) -> bool:
    tag = node[0]
    if tag == "or":
        return any(_eval(n, ctx) for n in node[1])
    if tag == "and":
        return all(_eval(n, ctx) for n in node[1])
    if tag == "not":
        return not _eval(node[1], ctx)
    value = _lookup(ctx, node[1])
    if tag == "null":
        return (value is None) != node[2]
    if tag == "in":
        return any(_equal(value, v) for v in node[2]) != node[3]
    op, literal = node[2], node[3]
    if op == "=":
        return _equal(value, literal)
    if op == "!=":
        return not _equal(value, literal)
    kind = _kind(value)
    if kind is None or kind != _kind(literal):
        return False
    return _ORDER[op](value, literal)


@dataclass(frozen=True)
class Condition:
    """A parsed condition. `evaluate(ctx)` takes {"traits": ..., "properties": ...,
    "preferences": ..., "events": ...}.

    Semantics: a missing path is null, except `events.<name>`, a count, which is 0. `= null`
    is never true (use `is null`) and `!= x` is always the negation of `= x`, so comparing
    null with = gives false and with != gives true; `not in` is the negation of `in`. Numbers
    compare numerically (1 = 1.0), strings as strings, booleans only with booleans; `=` across
    types is false and an ordering (< <= > >=) across types or with null is false."""

    text: str
    _node: _Node = field(compare=False, repr=False)
    _paths: tuple[str, ...] = field(compare=False, repr=False)

    @classmethod
    def parse(cls, text: str) -> Condition:
        """ConditionError (a ValueError) with the position when the text does not parse."""
        if not isinstance(text, str):
            raise ConditionError(str(text), 0, "a condition is a string")
        parser = _Parser(text)
        if parser.peek().kind == "end":
            raise ConditionError(text, 0, "empty condition")
        node = parser.parse()
        return cls(text, node, tuple(dict.fromkeys(parser.paths)))

    def evaluate(self, ctx: Mapping[str, Any]) -> bool:
        return _eval(self._node, ctx)

    def paths(self) -> frozenset[str]:
        """The roots the condition reads: some of traits, properties, preferences, events."""
        return frozenset(p.split(".")[0] for p in self._paths)

    def full_paths(self) -> tuple[str, ...]:
        """Every dotted path the condition reads, in order of appearance, once each."""
        return self._paths


# -- journeys -----------------------------------------------------------------------------------


class JourneyError(Exception):
    """A journey file that does not load; the message names the file, the step and the key."""

    def __init__(
        self,
        journey_id: str,
        path: Path | str,
        message: str,
        step: str | None = None,
        key: str | None = None,
    ) -> None:
        self.journey_id = journey_id
        self.path = str(path)
        self.step = step
        self.key = key
        self.message = message
        where = [self.path]
        if step is not None:
            where.append(f"step {step!r}")
        if key is not None:
            where.append(key)
        super().__init__(": ".join([*where, message]))


@dataclass(frozen=True)
class Step:
    id: str
    type: str
    next: str | None = None  # send, wait, wait_for: the step after; None ends the journey
    asset: str | None = None  # send
    duration_s: float | None = None  # wait
    event: str | None = None  # wait_for: the event awaited
    where: Condition | None = None  # wait_for: what the event's properties must satisfy
    timeout_s: float | None = None  # wait_for
    on_timeout: str | None = None  # wait_for: None ends the journey on timeout
    cases: tuple[tuple[Condition, str], ...] = ()  # branch: (if, goto), first match wins
    else_: str | None = None  # branch: where no case matches

    def targets(self) -> tuple[str, ...]:
        """The steps this one can go to."""
        out = [self.next, self.on_timeout, *(goto for _, goto in self.cases), self.else_]
        return tuple(t for t in out if t is not None)

    @property
    def waits(self) -> bool:
        return self.type in ("wait", "wait_for")


@dataclass(frozen=True)
class Journey:
    journey_id: str
    name: str
    reentry: str  # never | after_exit | always
    exit_on: str | None
    steps: dict[str, Step]  # by id, in file order
    first: str  # the entry step unless start_journey names another

    def step(self, step_id: str) -> Step:
        """The step; KeyError naming the journey when it has none of that id."""
        try:
            return self.steps[step_id]
        except KeyError:
            raise KeyError(f"journey {self.journey_id!r} has no step {step_id!r}") from None


def journeys_dir(config_dir: Path) -> Path:
    return config_dir / "journeys"


class _Reader:
    """Reads one journey file's keys, raising JourneyError with the file, step and key."""

    def __init__(self, journey_id: str, path: Path) -> None:
        self.journey_id = journey_id
        self.path = path

    def error(self, message: str, step: str | None = None, key: str | None = None) -> JourneyError:
        return JourneyError(self.journey_id, self.path, message, step, key)

    def text(self, doc: Mapping[str, Any], key: str, step: str | None, required: bool) -> Any:
        value = doc.get(key)
        if value is None:
            if required:
                raise self.error("is required", step, key)
            return None
        if not isinstance(value, str) or not value.strip():
            raise self.error("must be a non-empty string", step, key)
        return value

    def duration(self, doc: Mapping[str, Any], key: str, step: str) -> float:
        try:
            return parse_duration(self.text(doc, key, step, True))
        except ValueError as e:
            raise self.error(str(e), step, key) from None

    def condition(self, text: Any, step: str, key: str) -> Condition:
        try:
            return Condition.parse(text)
        except ConditionError as e:
            raise self.error(str(e), step, key) from None


def _read_step(r: _Reader, index: int, doc: Any) -> Step:
    if not isinstance(doc, dict):
        raise r.error(f"steps[{index}] must be a table ([[steps]])")
    raw_id = doc.get("id")
    if not isinstance(raw_id, str) or not STEP_ID.match(raw_id):
        raise r.error(f"steps[{index}] needs an id: letters, digits, '_', '-' and '.'", key="id")
    sid: str = raw_id
    kind = doc.get("type")
    if kind not in STEP_KEYS:
        raise r.error(f"must be one of {', '.join(STEP_TYPES)}, not {kind!r}", sid, "type")
    required, optional = STEP_KEYS[kind]
    unknown = sorted(set(doc) - {"id", "type", *required, *optional})
    if unknown:
        raise r.error(f"unknown keys for a {kind} step: {', '.join(unknown)}", sid)
    for key in required:
        if key not in doc:
            raise r.error(f"is required for a {kind} step", sid, key)
    nxt = r.text(doc, "next", sid, False)
    if kind == "send":
        return Step(sid, kind, nxt, asset=r.text(doc, "asset", sid, True))
    if kind == "wait":
        return Step(sid, kind, nxt, duration_s=r.duration(doc, "duration", sid))
    if kind == "wait_for":
        where = doc.get("where")
        return Step(
            sid,
            kind,
            nxt,
            event=r.text(doc, "event", sid, True),
            where=None if where is None else r.condition(where, sid, "where"),
            timeout_s=r.duration(doc, "timeout", sid),
            on_timeout=r.text(doc, "on_timeout", sid, False),
        )
    if kind == "branch":
        raw = doc["cases"]
        if not isinstance(raw, list) or not raw:
            raise r.error('must be a list like [{ if = "...", goto = "..." }]', sid, "cases")
        cases: list[tuple[Condition, str]] = []
        for i, case in enumerate(raw):
            key = f"cases[{i}]"
            if not isinstance(case, dict) or set(case) != {"if", "goto"}:
                raise r.error("must be a table with exactly the keys if and goto", sid, key)
            goto = r.text(case, "goto", sid, True)
            cases.append((r.condition(case["if"], sid, key + ".if"), goto))
        return Step(sid, kind, cases=tuple(cases), else_=r.text(doc, "else", sid, True))
    return Step(sid, kind)


def _check_graph(r: _Reader, steps: dict[str, Step], first: str) -> None:
    for step in steps.values():
        named = [("next", step.next), ("on_timeout", step.on_timeout), ("else", step.else_)]
        named += [(f"cases[{i}].goto", goto) for i, (_, goto) in enumerate(step.cases)]
        for key, target in named:
            if target is not None and target not in steps:
                raise r.error(f"unknown step {target!r}", step.id, key)
    reached = {first}
    todo = [first]
    while todo:
        for target in steps[todo.pop()].targets():
            if target not in reached:
                reached.add(target)
                todo.append(target)
    for sid in steps:
        if sid not in reached:
            raise r.error(f"is not reachable from the first step {first!r}", sid)
    # A cycle through no wait or wait_for would advance forever within one pass.
    state: dict[str, int] = {}  # 1 on the current path, 2 done

    def visit(sid: str, path: list[str]) -> None:
        state[sid] = 1
        path.append(sid)
        for target in steps[sid].targets():
            if steps[target].waits:
                continue
            if state.get(target) == 1:
                loop = [*path[path.index(target) :], target]
                raise r.error(f"loops back without a wait or wait_for: {' -> '.join(loop)}", target)
            if target not in state:
                visit(target, path)
        path.pop()
        state[sid] = 2

    for sid, step in steps.items():
        if sid not in state and not step.waits:
            visit(sid, [])


def load_journey(
    journey_id: str, path: Path, assets: Mapping[str, Asset | AssetError] | None = None
) -> Journey:
    """The journey of one file; JourneyError for the first problem found. `assets` maps each
    asset id of the config dir to its Asset or AssetError (None: sends are not checked)."""
    path = Path(path)
    r = _Reader(journey_id, path)
    if not JOURNEY_ID.match(journey_id):
        raise r.error("a journey id is letters, digits, '_', '-' and '.'")
    try:
        doc = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise r.error("the file is missing") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise r.error(f"not valid TOML: {e}") from None
    unknown = sorted(set(doc) - set(TOP_KEYS))
    if unknown:
        raise r.error(f"unknown keys {', '.join(unknown)}")
    name = r.text(doc, "name", None, True)
    reentry = doc.get("reentry", "never")
    if reentry not in REENTRY:
        raise r.error(f"must be one of {', '.join(REENTRY)}, not {reentry!r}", key="reentry")
    exit_on = r.text(doc, "exit_on", None, False)
    raw = doc.get("steps")
    if not isinstance(raw, list) or not raw:
        raise r.error("a journey needs at least one [[steps]]", key="steps")
    steps: dict[str, Step] = {}
    for i, item in enumerate(raw):
        step = _read_step(r, i, item)
        if step.id in steps:
            raise r.error("duplicate step id", step.id, "id")
        steps[step.id] = step
    if assets is not None:
        for step in steps.values():
            if step.asset is None:
                continue
            found = assets.get(step.asset)
            if found is None:
                known = ", ".join(sorted(assets)) or "none"
                raise r.error(f"unknown asset {step.asset!r} (known: {known})", step.id, "asset")
            if isinstance(found, AssetError):
                raise r.error(
                    f"asset {step.asset!r} does not load: {found.message}", step.id, "asset"
                )
    first = next(iter(steps))
    _check_graph(r, steps, first)
    return Journey(journey_id, name, reentry, exit_on, steps, first)


def _files(config_dir: Path) -> Iterator[Path]:
    root = journeys_dir(config_dir)
    if root.is_dir():
        for f in sorted(root.glob("*.toml")):
            if f.is_file() and not f.name.startswith("."):
                yield f


def _signature(config_dir: Path) -> tuple[Any, ...]:
    sig: list[Any] = []
    root = journeys_dir(config_dir)
    try:
        st = os.stat(root)
        sig.append((str(root), st.st_mtime_ns))
    except FileNotFoundError:
        sig.append((str(root), None))
    for f in _files(config_dir):
        st = f.stat()
        sig.append((f.name, st.st_mtime_ns, st.st_size))
    return tuple(sig)


_cache_lock = threading.Lock()
_cache: dict[Path, tuple[tuple[Any, ...], dict[str, Journey], dict[str, JourneyError]]] = {}


def load_journeys(config_dir: Path) -> dict[str, Journey]:
    """Every journey of the config dir by id; JourneyError for the first that does not load."""
    journeys, broken = load_journeys_and_errors(config_dir)
    if broken:
        raise next(iter(broken.values()))
    return journeys


def load_journeys_and_errors(
    config_dir: Path,
) -> tuple[dict[str, Journey], dict[str, JourneyError]]:
    """The journeys that load by id, and the error of each that does not: one broken file does
    not hide the others.

    Cached until a file under journeys/ or assets/ changes (the assets are checked by id and
    whether they load, through load_assets_and_errors' own cache)."""
    config_dir = Path(config_dir).resolve()
    assets, bad_assets = load_assets_and_errors(config_dir)
    by_id: dict[str, Asset | AssetError] = {**assets, **bad_assets}
    sig = (
        _signature(config_dir),
        tuple(sorted(assets)),
        tuple(sorted((k, str(e)) for k, e in bad_assets.items())),
    )
    with _cache_lock:
        hit = _cache.get(config_dir)
        if hit is not None and hit[0] == sig:
            return dict(hit[1]), dict(hit[2])
    journeys: dict[str, Journey] = {}
    broken: dict[str, JourneyError] = {}
    for f in _files(config_dir):
        try:
            journeys[f.stem] = load_journey(f.stem, f, by_id)
        except JourneyError as e:
            broken[f.stem] = e
    with _cache_lock:
        _cache[config_dir] = (sig, journeys, broken)
    return dict(journeys), dict(broken)


@dataclass(frozen=True)
class CheckResult:
    journey_id: str
    ok: bool
    line: str  # what `mallard journeys check` prints for the journey


def check_journeys(config_dir: Path) -> list[CheckResult]:
    """One result per journey file, in id order."""
    journeys, broken = load_journeys_and_errors(config_dir)
    out: list[CheckResult] = []
    for jid in sorted({*journeys, *broken}):
        if jid in broken:
            out.append(CheckResult(jid, False, f"FAIL {jid}: {broken[jid]}"))
            continue
        j = journeys[jid]
        sends = sorted({s.asset for s in j.steps.values() if s.asset is not None})
        line = f"ok   {jid}: {j.name!r}, {len(j.steps)} steps, first {j.first!r}"
        line += f", reentry {j.reentry}"
        if sends:
            line += f", sends {', '.join(sends)}"
        out.append(CheckResult(jid, True, line))
    return out
