"""Journeys as code: loading and validating config/journeys, conditions, durations, the cache,
the collector's check of stepIdToTrigger, and `mallard journeys check`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from mallard.commands import CommandCatalog
from mallard.config import REPO_CONFIG
from mallard.errors import InvalidRequest
from mallard.journeys import (
    Condition,
    ConditionError,
    JourneyError,
    load_journey,
    load_journeys,
    load_journeys_and_errors,
    parse_duration,
)

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """A copy of the repository's config/."""
    dest = tmp_path / "config"
    shutil.copytree(REPO_CONFIG, dest)
    return dest


def write_journey(config: Path, journey_id: str, text: str) -> Path:
    d = config / "journeys"
    d.mkdir(exist_ok=True)
    path = d / f"{journey_id}.toml"
    path.write_text(text)
    # Same-size rewrites within one mtime tick would look unchanged to the cache.
    now = time.time_ns()
    os.utime(path, ns=(now, now + len(list(d.iterdir())) * 10**9))
    return path


def test_repository_journey_loads(config: Path) -> None:
    journeys = load_journeys(config)
    j = journeys["welcome_series"]
    assert (j.name, j.reentry, j.exit_on, j.first) == (
        "Welcome series",
        "never",
        "unsubscribed",
        "hello",
    )
    assert list(j.steps) == ["hello", "pause", "clicked", "nudge", "reminder", "done"]
    hello, pause, clicked = j.step("hello"), j.step("pause"), j.step("clicked")
    assert (hello.type, hello.asset, hello.next) == ("send", "welcome", "pause")
    assert (pause.type, pause.duration_s, pause.next) == ("wait", 2 * 86400, "clicked")
    assert (clicked.event, clicked.timeout_s, clicked.next, clicked.on_timeout) == (
        "email_clicked",
        86400,
        "done",
        "nudge",
    )
    assert clicked.where is not None and clicked.where.text == "properties.assetId = 'welcome'"
    assert clicked.where.evaluate({"properties": {"assetId": "welcome"}})
    assert not clicked.where.evaluate({"properties": {"assetId": "newsletter"}})
    nudge = j.step("nudge")
    assert nudge.type == "branch" and nudge.else_ == "reminder"
    [(cond, goto)] = nudge.cases
    assert goto == "done" and cond.evaluate({"traits": {"plan": "pro"}})
    assert j.step("reminder").asset == "reminder"
    assert j.step("done").type == "exit" and j.step("done").targets() == ()
    with pytest.raises(KeyError, match="no step 'nope'"):
        j.step("nope")


GOOD_TAIL = '[[steps]]\nid = "done"\ntype = "exit"\n'


def journey(*steps: str, top: str = 'name = "T"\n') -> str:
    return top + "".join(f"[[steps]]\n{s}\n" for s in steps)


SEND = 'id = "a"\ntype = "send"\nasset = "welcome"'


@pytest.mark.parametrize(
    ("text", "step", "message"),
    [
        ("name = ", None, "not valid TOML"),
        ('name = "T"\n', None, "at least one"),
        (journey(SEND, top=""), None, "name: is required"),
        (journey(SEND, top='name = "T"\ncolour = 1\n'), None, "unknown keys colour"),
        (journey(SEND, top='name = "T"\nreentry = "sometimes"\n'), None, "reentry: must be"),
        (journey('type = "send"\nasset = "welcome"'), None, "needs an id"),
        (journey('id = "a"\ntype = "jump"'), "a", "type: must be one of"),
        (journey(SEND + '\nduration = "1d"'), "a", "unknown keys for a send step: duration"),
        (journey('id = "a"\ntype = "exit"\nnext = "a"'), "a", "unknown keys for a exit step"),
        (journey('id = "a"\ntype = "send"'), "a", "asset: is required for a send step"),
        (journey('id = "a"\ntype = "wait"'), "a", "duration: is required"),
        (journey('id = "a"\ntype = "wait_for"\ntimeout = "1d"'), "a", "event: is required"),
        (journey('id = "a"\ntype = "wait_for"\nevent = "x"'), "a", "timeout: is required"),
        (journey('id = "a"\ntype = "branch"\nelse = "a"'), "a", "cases: is required"),
        (journey(SEND, 'id = "a"\ntype = "exit"'), "a", "id: duplicate step id"),
        (journey(SEND + '\nnext = "nowhere"'), "a", "next: unknown step 'nowhere'"),
        (
            journey('id = "a"\ntype = "wait_for"\nevent = "x"\ntimeout = "1d"\non_timeout = "z"'),
            "a",
            "on_timeout: unknown step 'z'",
        ),
        (
            journey(
                'id = "a"\ntype = "branch"\ncases = [{if = "traits.x = 1", goto = "q"}]\nelse = "a"'
            ),
            "a",
            "cases[0].goto: unknown step 'q'",
        ),
        (
            journey('id = "a"\ntype = "branch"\ncases = []\nelse = "a"'),
            "a",
            "cases: must be a list",
        ),
        (
            journey('id = "a"\ntype = "branch"\ncases = [{if = "traits.x = 1"}]\nelse = "a"'),
            "a",
            "cases[0]: must be a table with exactly the keys if and goto",
        ),
        (
            journey(
                'id = "a"\ntype = "branch"\ncases = [{if = "traits.x = 1", goto = "b"}]',
                'id = "b"\ntype = "exit"',
            ),
            "a",
            "else: is required",
        ),
        (
            journey('id = "a"\ntype = "send"\nasset = "nope"'),
            "a",
            "asset: unknown asset 'nope' (known: ",
        ),
        (
            journey('id = "a"\ntype = "send"\nasset = "broken"'),
            "a",
            "asset: asset 'broken' does not load: body.txt.ftl is missing",
        ),
        (journey(SEND, 'id = "b"\ntype = "exit"'), "b", "not reachable from the first step 'a'"),
        (
            journey(
                SEND + '\nnext = "b"',
                'id = "b"\ntype = "branch"\ncases = [{if = "traits.x = 1", goto = "c"}]\n'
                'else = "a"',
                'id = "c"\ntype = "exit"',
            ),
            "a",
            "loops back without a wait or wait_for: a -> b -> a",
        ),
        (journey(SEND + '\nnext = "a"'), "a", "loops back without a wait or wait_for: a -> a"),
        (journey('id = "a"\ntype = "wait"\nduration = "2 days"'), "a", "duration: '2 days'"),
        (journey('id = "a"\ntype = "wait"\nduration = "0s"'), "a", "is not a duration"),
        (journey('id = "a"\ntype = "wait"\nduration = 3'), "a", "duration: must be a non-empty"),
        (
            journey('id = "a"\ntype = "wait_for"\nevent = "x"\ntimeout = "1d"\nwhere = "x ="'),
            "a",
            "where: a path starts with traits",
        ),
        (
            journey(
                'id = "a"\ntype = "branch"\ncases = [{if = "traits.x =", goto = "a"}]\nelse = "a"'
            ),
            "a",
            "cases[0].if: expected a literal",
        ),
    ],
)
def test_bad_journeys(config: Path, text: str, step: str | None, message: str) -> None:
    bad = config / "assets" / "broken"
    bad.mkdir()
    (bad / "asset.toml").write_text('channel = "sms"\nkind = "transactional"\n')
    path = write_journey(config, "bad", text)
    with pytest.raises(JourneyError) as e:
        load_journeys(config)
    assert message in str(e.value)
    assert e.value.journey_id == "bad" and e.value.step == step
    assert str(path) in str(e.value)


def test_a_waiting_loop_and_reentry_defaults(config: Path) -> None:
    text = journey(
        SEND + '\nnext = "w"',
        'id = "w"\ntype = "wait_for"\nevent = "x"\ntimeout = "1h"\nnext = "a"\non_timeout = "e"',
        'id = "e"\ntype = "exit"',
    )
    j = load_journey("loop", write_journey(config, "loop", text), None)
    assert j.reentry == "never" and j.exit_on is None and j.first == "a"
    # The assets are checked only when given.
    text = journey('id = "a"\ntype = "send"\nasset = "nope"')
    assert load_journey("x", write_journey(config, "x", text), None).step("a").asset == "nope"
    with pytest.raises(JourneyError, match="journey id"):
        load_journey("bad id", write_journey(config, "y", text), None)


def test_a_broken_journey_does_not_hide_the_others(config: Path) -> None:
    write_journey(config, "broken", journey('id = "a"\ntype = "teleport"'))
    journeys, broken = load_journeys_and_errors(config)
    assert list(journeys) == ["welcome_series"]
    assert list(broken) == ["broken"] and "teleport" in str(broken["broken"])
    with pytest.raises(JourneyError, match="teleport"):
        load_journeys(config)


def test_the_cache_follows_edits(config: Path) -> None:
    path = write_journey(config, "edited", journey(SEND))
    assert load_journeys(config)["edited"].step("a").asset == "welcome"
    assert load_journeys(config) == load_journeys(config)
    path.write_text(journey(SEND.replace("welcome", "reminder")))
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 50 * 10**9))
    assert load_journeys(config)["edited"].step("a").asset == "reminder"
    # A change under assets/ is seen too: the asset a send names goes away.
    shutil.rmtree(config / "assets" / "reminder")
    journeys, broken = load_journeys_and_errors(config)
    assert "unknown asset 'reminder'" in str(broken["edited"])
    assert "welcome_series" in broken
    path.unlink()
    assert "edited" not in load_journeys_and_errors(config)[1]


def test_no_journeys_dir(tmp_path: Path) -> None:
    assert load_journeys(tmp_path) == {}


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30), ("5m", 300), ("2h", 7200), ("3d", 259200), ("1w", 604800), (" 10s ", 10)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0s", "-1s", "1.5h", "1y", "5", "d", "1 d", 5, None])
def test_bad_durations(text: Any) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


CTX: dict[str, Any] = {
    "traits": {
        "plan": "pro",
        "age": 42,
        "score": 4.5,
        "vip": True,
        "zip": "42",
        "address": {"city": "Lyon"},
        "nothing": None,
    },
    "properties": {"assetId": "welcome", "note": "it's"},
    "preferences": {
        "channel": {"email": True, "sms": False},
        "category": {"weekly_news": False},
        "unsubscribeAll": False,
    },
    "events": {"email_clicked": 2},
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("traits.plan = 'pro'", True),
        ("traits.plan != 'pro'", False),
        ("traits.plan <> 'free'", True),
        ("traits.age > 41 and traits.age <= 42", True),
        ("traits.age = 42.0", True),
        ("traits.score >= 4.5 and traits.score < 5", True),
        ("traits.age > -1", True),
        # Numbers vs strings: no coercion, a mismatch is false for = and orderings.
        ("traits.zip = 42", False),
        ("traits.zip != 42", True),
        ("traits.zip > 41", False),
        ("traits.age = '42'", False),
        ("traits.zip = '42'", True),
        ("traits.plan > 'basic'", True),
        ("traits.vip = true", True),
        ("traits.vip = 1", False),
        # Nested paths.
        ("traits.address.city = 'Lyon'", True),
        ("traits.address.city.name is null", True),
        ("preferences.channel.email = true and preferences.channel.sms = false", True),
        ("preferences.category.weekly_news = false", True),
        ("preferences.unsubscribeAll = false", True),
        ("properties.note = 'it''s'", True),
        # Null: a missing path or a null value.
        ("traits.missing = null", False),
        ("traits.missing = 'x'", False),
        ("traits.missing != 'x'", True),
        ("traits.missing < 3", False),
        ("traits.missing is null", True),
        ("traits.nothing is null", True),
        ("traits.plan is null", False),
        ("traits.plan IS NOT NULL", True),
        ("traits.missing in ('x', 'y')", False),
        ("traits.missing not in ('x', 'y')", True),
        # in.
        ("traits.plan in ('free', 'pro')", True),
        ("traits.plan in ('free')", False),
        ("traits.plan not in ('free')", True),
        ("traits.age in (41, 42)", True),
        ("traits.age in ('42')", False),
        # events: a count; one never had is 0.
        ("events.email_clicked > 1", True),
        ("events.email_opened = 0", True),
        # Precedence: not > and > or; parentheses group.
        ("traits.plan = 'free' and traits.age = 1 or traits.vip = true", True),
        ("traits.plan = 'free' and (traits.age = 1 or traits.vip = true)", False),
        ("traits.vip = true or traits.age = 1 and traits.plan = 'free'", True),
        ("(traits.vip = true or traits.age = 1) and traits.plan = 'free'", False),
        ("not traits.plan = 'free' and traits.age = 42", True),
        ("not (traits.plan = 'pro' and traits.age = 42)", False),
        ("not not traits.vip = true", True),
        ("traits.plan = 'pro' AND NOT traits.vip = false", True),
    ],
)
def test_conditions(text: str, expected: bool) -> None:
    assert Condition.parse(text).evaluate(CTX) is expected


def test_condition_paths() -> None:
    cond = Condition.parse(
        "traits.plan = 'pro' or (events.email_clicked > 0 and traits.address.city is null)"
    )
    assert cond.paths() == frozenset({"traits", "events"})
    assert cond.full_paths() == ("traits.plan", "events.email_clicked", "traits.address.city")
    assert cond == Condition.parse(cond.text)
    assert Condition.parse("properties.assetId = 'x'").evaluate({}) is False


@pytest.mark.parametrize(
    ("text", "position", "message"),
    [
        ("", 0, "empty condition"),
        ("traits.plan = ", 14, "expected a literal"),
        ("traits.plan = 'pro", 14, "unterminated string"),
        ("traits.plan == 'pro'", 13, "expected a literal"),
        ("customer.plan = 'pro'", 0, "a path starts with traits"),
        ("traits.a = 1 or TRAITS.plan = 'pro'", 16, "not 'TRAITS'"),
        ("traits = 1", 0, "traits needs a key"),
        ("events.a.b = 1", 0, "events.<event name>"),
        ("traits.a = 1 and", 16, "expected a path"),
        ("(traits.a = 1", 13, "expected ')'"),
        ("traits.a = 1)", 12, "expected and, or or the end"),
        ("traits.a in 'x'", 12, "expected '('"),
        ("traits.a is 'x'", 12, "expected null"),
        ("traits.a like 'x'", 9, "expected an operator"),
        ("traits.a = 1 ; drop", 13, "unexpected character ';'"),
        ("traits.a = pro", 11, "expected a literal"),
        ("1 = traits.a", 0, "expected a path"),
    ],
)
def test_condition_syntax_errors(text: str, position: int, message: str) -> None:
    with pytest.raises(ConditionError) as e:
        Condition.parse(text)
    assert isinstance(e.value, ValueError)
    assert e.value.position == position, str(e.value)
    assert message in str(e.value) and f"at position {position}" in str(e.value)


def test_catalog_checks_step_ids(config: Path) -> None:
    catalog = CommandCatalog(config, recheck_s=0)
    props: dict[str, Any] = {"journeyIdToTrigger": "welcome_series"}
    catalog.check("start_journey", {"properties": props})
    catalog.check("start_journey", {"properties": {**props, "stepIdToTrigger": "nudge"}})
    cases = [
        ("x", "unknown step 'x' of journey 'welcome_series'"),
        ("", "must be a step id of journey 'welcome_series'"),
        (3, "must be a step id"),
        (None, "must be a step id"),
    ]
    for value, message in cases:
        with pytest.raises(InvalidRequest) as e:
            catalog.check("start_journey", {"properties": {**props, "stepIdToTrigger": value}})
        assert '"properties.stepIdToTrigger"' in str(e.value) and message in str(e.value)
    # A file that does not parse: a known journey with no valid steps.
    path = write_journey(config, "broken", "name = ")
    catalog.check("start_journey", {"properties": {"journeyIdToTrigger": "broken"}})
    with pytest.raises(InvalidRequest, match="unknown step 'a' of journey 'broken'"):
        catalog.check(
            "start_journey",
            {"properties": {"journeyIdToTrigger": "broken", "stepIdToTrigger": "a"}},
        )
    # An edit to a file (not only a new file) is seen.
    path.write_text(journey(SEND))
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 60 * 10**9))
    catalog.check(
        "start_journey", {"properties": {"journeyIdToTrigger": "broken", "stepIdToTrigger": "a"}}
    )


def run_check(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mallard.cli", "journeys", "check", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        env={**os.environ, "MALLARD_CONFIG_DIR": str(config)},
    )


def test_journeys_check_cli(config: Path, tmp_path: Path) -> None:
    done = run_check(config)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        "ok   welcome_series: 'Welcome series', 6 steps, first 'hello', reentry never, "
        "sends reminder, welcome"
    ]
    write_journey(config, "zz_bad", journey(SEND + '\nnext = "gone"'))
    write_journey(config, "aa_ok", journey(SEND))
    done = run_check(config)
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("ok   aa_ok: 'T', 1 steps, first 'a'")
    assert lines[1].startswith("ok   welcome_series")
    assert lines[2].startswith("FAIL zz_bad: ") and "next: unknown step 'gone'" in lines[2]
    # --config-dir wins over the environment; an empty dir is fine.
    empty = tmp_path / "empty"
    empty.mkdir()
    done = run_check(config, "--config-dir", str(empty))
    assert done.returncode == 0 and "no journeys under" in done.stdout
