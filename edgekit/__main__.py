"""`python -m edgekit` runs the CLI (same as the `edgekit` console script)."""

from edgekit.cli import main

main()
