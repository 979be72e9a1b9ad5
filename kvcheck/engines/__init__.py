"""Fuzz engines: how sequences of operations are generated and checked.

- `walk` (kvcheck.engines.walk): a seeded random walk over the enabled operations,
  driving the checker directly; swarm testing; the default.
- `hypothesis` (kvcheck.engines.hypothesis_machine): the Hypothesis state machine that
  `make test` runs, available as `kvcheck fuzz --engine hypothesis`.

- `guided` (kvcheck.engines.guided): the walk engine steered by the spec's step features
  (operation outcomes, configuration shape, named paths): a corpus of sequences that
  showed a new one, and sequences derived from it (extend, splice, change an argument,
  swap two operations) besides fresh walks.

All draw from one table of generators (kvcheck.engines.gen). `campaign` runs each
one in chunks of sequences, inline, in local processes or as Ray tasks.
"""
ENGINES = ("walk", "hypothesis", "guided")
DEFAULT_ENGINE = "walk"
ENGINES_HELP = ("walk (a seeded random walk with swarm testing), guided (the walk steered "
                "toward sequences that show the spec something new) or hypothesis (the "
                "Hypothesis state machine)")
"""Every engine in one phrase, for each --engine flag's help."""
