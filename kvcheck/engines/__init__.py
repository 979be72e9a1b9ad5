"""Fuzz engines: how sequences of operations are generated and checked.

- `walk` (kvcheck.engines.walk): a seeded random walk over the enabled operations,
  driving the checker directly; swarm testing; the default.
- `hypothesis` (kvcheck.engines.hypothesis_machine): the Hypothesis state machine that
  `make test` runs, available as `kvcheck fuzz --engine hypothesis`.

Both draw from one table of generators (kvcheck.engines.gen). `campaign` runs either
one in chunks of sequences, inline, in local processes or as Ray tasks.
"""
ENGINES = ("walk", "hypothesis")
DEFAULT_ENGINE = "walk"
