"""Finished studies: each measured one question once (its results are in docs/, named in bench/README.md) and is kept
runnable (`python -m bench.studies.NAME`) so the figure can be measured again. The harness (bench.run and its steps)
imports nothing from here."""
