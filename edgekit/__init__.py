"""edgekit: package transformer models for Jetson Orin and keep them healthy in the field."""

__version__ = "0.1.0"
