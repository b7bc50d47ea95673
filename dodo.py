"""doit tasks of this project: one per (stage, model), from models/ and toolchain/.

`doit list` shows them; `doit verify:tiny-llama` builds and checks one model;
`doit explain TASK` says why a task would run.
"""

from pathlib import Path

from hefbuild.doit_tasks import project_tasks

DOIT_CONFIG, task_hefbuild = project_tasks(Path(__file__).parent)
