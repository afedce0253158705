"""The control plane: the engine driven by the real clock, behind an HTTP API and a database."""
