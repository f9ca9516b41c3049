"""CLI commands for the build area (registered on edgekit.cli.app when imported)."""
