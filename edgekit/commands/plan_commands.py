"""CLI commands for the plan area (registered on edgekit.cli.app when imported)."""
