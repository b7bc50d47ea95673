"""The entry point a project's `dodo.py` imports (`from hefbuild.doit_tasks import
project_tasks`); the doit adapter itself is `hefbuild.cli`. Kept at this path so that
projects written before the layers moved keep working."""

from .cli.tasks import project_tasks

__all__ = ["project_tasks"]
