"""Extra doit commands (registered in pyproject.toml under [tool.doit.plugins.command])."""
