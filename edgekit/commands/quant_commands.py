"""CLI commands for the quant area (registered on edgekit.cli.app when imported)."""
