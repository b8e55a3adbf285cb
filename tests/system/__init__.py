"""The whole-system test (issue 52): the product started as `make run` starts it, every role at
once under a seeded random schedule with processes killed, then invariants against what was acked.

- product.py: the processes (mailbox, server, pipeline watcher, Dagster daemon);
- plan.py: the personas and the plan of timed actions, from the seed;
- schedule.py: the roles' threads, each calling the product as its users do;
- oracle.py: the record of what each role sent and what the product answered;
- facts.py: what the checks read from the product, and the rebuild of its marts;
- invariants.py: the checks, each returning every failure it found;
- test_system.py: the test (`pytest -m system tests/system`); test_invariants.py shows each
  check failing when its property is broken (no product running).

Environment: MALLARD_SYSTEM_S (schedule length, 180 s), MALLARD_SYSTEM_SEED (replays a schedule),
MALLARD_SYSTEM_ROLES (a subset of the roles), MALLARD_SYSTEM_IDLE_S (how long the pipeline may
take to become idle after the schedule; 300 s + a third of its length).
"""
