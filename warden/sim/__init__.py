"""The trace-driven simulator: replays a trace through the unchanged engine with a virtual clock."""
