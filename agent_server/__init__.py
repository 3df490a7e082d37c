"""agent-server: the credential-aware sidecar that runs an AI agent's CLI turns."""

__version__ = "0.1.0"
