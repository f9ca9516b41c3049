"""edgekit.targets: device profiles, one YAML file per target (package data)."""
