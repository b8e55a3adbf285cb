"""The whole-system test's personas and its plan of timed actions, from the seed alone.

Personas are grouped by what the schedule does to them (plain ones are never regulated but by an
ACCESS, so their journeys, imports and preferences have one expected outcome). The plan holds
the timed actions of a run (regulations, kills, compactions, imports, the audience file), drawn
from random.Random(f"{seed}:plan") and the duration: the same seed plans the same run.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from tests.system.product import DAEMON, SERVER, WATCHER

# Personas by what the schedule does to them: plain ones are never regulated (but ACCESS), so
# their journeys, imports and preferences have one expected outcome.
PLAIN, SUPPRESS, NO_TRACK, DELETE = "plain", "suppress", "no_track", "delete"
GROUPS = {PLAIN: 26, SUPPRESS: 4, NO_TRACK: 3, DELETE: 5}
# Every role; MALLARD_SYSTEM_ROLES may name fewer, to tell which of them breaks an invariant.
ROLES = (
    "senders",
    "commands",
    "preferences",
    "import",
    "audience",
    "regulations",
    "compaction",
    "chaos",
)


@dataclass(frozen=True)
class Persona:
    index: int
    user_id: str
    anonymous_id: str
    email: str
    tier: str  # gold or silver: set once, read by the journey's branch
    group: str


def make_personas(seed: int) -> list[Persona]:
    rng = random.Random(f"{seed}:personas")
    tag = f"{rng.getrandbits(24):06x}"
    out: list[Persona] = []
    for group, n in GROUPS.items():
        for _ in range(n):
            i = len(out)
            user = f"sys{i:03d}-{tag}"
            tier = rng.choice(["gold", "silver"])
            out.append(Persona(i, user, f"anon-{user}", f"{user}@example.com", tier, group))
    return out


@dataclass(frozen=True)
class Planned:
    """A timed action of the schedule: `at` seconds after it starts."""

    at: float
    role: str
    action: str
    users: tuple[str, ...] = ()


def plan(seed: int, duration: float, personas: list[Persona]) -> list[Planned]:
    """The timed actions of a run, from the seed and the duration alone."""
    rng = random.Random(f"{seed}:plan")
    by = {g: [p.user_id for p in personas if p.group == g] for g in GROUPS}
    out: list[Planned] = []

    def at(lo: float, hi: float) -> float:
        return round(rng.uniform(lo * duration, hi * duration), 1)

    # Regulations: about one of each kind every 90 s (each run of the product's is a process
    # of its own). Deleted personas are never unsuppressed; suppressed ones may be, later.
    n = max(1, int(duration // 90))
    for user in rng.sample(by[DELETE], min(len(by[DELETE]), n)):
        out.append(Planned(at(0.15, 0.75), "regulations", "SUPPRESS_WITH_DELETE", (user,)))
    for user in rng.sample(by[SUPPRESS], min(len(by[SUPPRESS]), n)):
        t = at(0.05, 0.6)
        out.append(Planned(t, "regulations", "SUPPRESS", (user,)))
        if rng.random() < 0.6:
            later = round(rng.uniform(t + 15, max(t + 16, 0.8 * duration)), 1)
            out.append(Planned(later, "regulations", "UNSUPPRESS", (user,)))
    for user in rng.sample(by[NO_TRACK], min(len(by[NO_TRACK]), n)):
        out.append(Planned(at(0.05, 0.7), "regulations", "NO_TRACK", (user,)))
    others = by[PLAIN] + by[SUPPRESS] + by[NO_TRACK]
    for _ in range(n):
        out.append(Planned(at(0.1, 0.8), "regulations", "ACCESS", (rng.choice(others),)))
    # Imports of plain personas: each a file of its own, sometimes imported twice.
    for k in range(max(2, int(duration // 90))):
        users = tuple(rng.sample(by[PLAIN], rng.randint(3, 8)))
        t = at(0.05, 0.8)
        out.append(Planned(t, "import", f"imp{k}", users))
        if rng.random() < 0.5:
            out.append(Planned(round(t + rng.uniform(5, 30), 1), "import", f"imp{k}", users))
    out.append(Planned(at(0.2, 0.6), "audience", "add"))
    # Compactions by hand, every other one a whole pass (each takes a core for minutes here).
    for k in range(max(2, int(duration // 90))):
        out.append(Planned(at(0.1, 0.9), "compaction", "dagster" if k % 2 == 0 else "pass"))
    # A kill every 20 to 40 s, from 15 s on; never in the last 15 s.
    t = 15.0
    victims = [SERVER] * 3 + [WATCHER] * 3 + [DAEMON] + ["regulation-run"] * 2
    while (t := t + rng.uniform(20, 40)) < duration - 15:
        out.append(Planned(round(t, 1), "chaos", rng.choice(victims)))
    return sorted(out, key=lambda p: (p.at, p.role, p.action))
