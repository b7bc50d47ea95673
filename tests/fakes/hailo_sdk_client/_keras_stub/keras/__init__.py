"""FAKE minimal `keras` for the DFC test double, used only when real Keras is absent:
`layers.Layer`, `saving.register_keras_serializable` / `get_registered_object`,
`utils.register_keras_serializable`."""

from __future__ import annotations

import types
from typing import Any

IS_FAKE_KERAS = True
_REGISTRY: dict[str, Any] = {}


class Layer:
    pass


def register_keras_serializable(package: str = "Custom", name: str | None = None) -> Any:
    def decorate(cls: Any) -> Any:
        _REGISTRY[f"{package}>{name or cls.__name__}"] = cls
        return cls

    return decorate


def get_registered_object(name: str, custom_objects: Any = None, module_objects: Any = None) -> Any:
    return _REGISTRY.get(name)


layers = types.SimpleNamespace(Layer=Layer)
saving = types.SimpleNamespace(register_keras_serializable=register_keras_serializable,
                               get_registered_object=get_registered_object)
utils = types.SimpleNamespace(register_keras_serializable=register_keras_serializable)
