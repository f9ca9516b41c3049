"""CLI commands for the power area (registered on edgekit.cli.app when imported)."""
