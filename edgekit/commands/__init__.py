"""CLI commands, one module per area; each registers itself on edgekit.cli.app."""
