"""The project cache's models, each unpickled when first asked for.

A no-op of one model of 1000 needs one model's declarations, and unpickling all of them
was most of what declaring 999 more cost it. So `.hefbuild/project.pickle` keeps each
model as bytes of its own; what models share (the pipeline of their target, one object for
every model of it) is pickled once beside them and referred to by its index, so a decoded
model shares it as the loaded ones did. Beside them, all models in one pickle: a run of
every model reads that at once (one pickle shares what many models hold alike, and
decodes in half the time of a thousand). `LazyModels` is a read-only mapping, name ->
model, in declaration order; asked for its values or items, it decodes all of them that
way; pickled itself (to another process), it is a plain dict.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable, Iterator, Mapping
from typing import Any


class _Pickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO, shared: dict[int, int]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._shared = shared

    def persistent_id(self, obj: Any) -> int | None:
        return self._shared.get(id(obj))


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, shared: list[Any]) -> None:
        super().__init__(file)
        self._shared = shared

    def persistent_load(self, pid: Any) -> Any:
        return self._shared[pid]


def pickled(models: Mapping[str, Any]) -> tuple[bytes, list[Any], dict[str, bytes]]:
    """(all models in one pickle, the pipelines they share, name -> a model's own bytes)."""
    shared: list[Any] = []
    index: dict[int, int] = {}
    for model in models.values():
        if id(model.pipeline) not in index:
            index[id(model.pipeline)] = len(shared)
            shared.append(model.pipeline)
    blobs = {}
    for name, model in models.items():
        buf = io.BytesIO()
        _Pickler(buf, index).dump(model)
        blobs[name] = buf.getvalue()
    every = pickle.dumps(dict(models), protocol=pickle.HIGHEST_PROTOCOL)
    return every, shared, blobs


class LazyModels(Mapping):
    """name -> model, decoded from its bytes when first asked for. A model whose bytes do
    not decode comes from `reload` (the declarations loaded from their files)."""

    def __init__(self, every: bytes, shared: list[Any], blobs: dict[str, bytes],
                 reload: Callable[[], Mapping[str, Any]]) -> None:
        self._every, self._shared, self._blobs, self._reload = every, shared, blobs, reload
        self._models: dict[str, Any] = {}
        self._all = False

    def __getitem__(self, name: str) -> Any:
        model = self._models.get(name)
        if model is None:
            blob = self._blobs[name]  # KeyError for a name not declared, as a dict's
            try:
                model = _Unpickler(io.BytesIO(blob), self._shared).load()
            except Exception:  # noqa: BLE001 - a damaged entry of a cache: read the file
                model = self._reload()[name]
            self._models[name] = model
        return model

    def values(self) -> Any:
        return self._every_model().values()

    def items(self) -> Any:
        return self._every_model().items()

    def _every_model(self) -> dict[str, Any]:
        """Every model, from the one pickle of them all (those decoded one by one before
        are replaced by equal ones: a declaration is a value)."""
        if not self._all:
            try:
                every = pickle.loads(self._every)
                if not isinstance(every, dict) or list(every) != list(self._blobs):
                    raise ValueError("not the models of the cache")
            except Exception:  # noqa: BLE001 - a damaged entry of a cache: read the files
                every = dict(self._reload())
            self._models, self._all = every, True
        return self._models

    def __iter__(self) -> Iterator[str]:
        return iter(self._blobs)

    def __len__(self) -> int:
        return len(self._blobs)

    def __contains__(self, name: object) -> bool:
        return name in self._blobs

    def __reduce__(self) -> tuple[type, tuple[dict[str, Any]]]:
        return dict, (dict(self.items()),)

    def __repr__(self) -> str:
        return f"LazyModels({list(self._blobs)!r}, {len(self._models)} decoded)"
