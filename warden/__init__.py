"""warden: a scheduler for shared GPU clusters that governs preemption."""

__version__ = "0.1.0"
