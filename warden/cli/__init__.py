"""The `warden` command."""
