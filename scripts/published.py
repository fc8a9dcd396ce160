"""Published evaluation returns at standard budgets, beside ours in the
standard table (scripts/bench_standard.py). Filled from the sources named in
each entry; see docs/results/standard/README.md for how each counts steps."""

# (task, agent) -> text for the table's "published at 100k" column
PUBLISHED_CELLS = {}
