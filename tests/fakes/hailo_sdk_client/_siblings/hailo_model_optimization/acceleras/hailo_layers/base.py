"""FAKE acceleras Keras layers: the classes a quantized HAR names."""

from __future__ import annotations

import keras


class HailoConv(keras.layers.Layer):
    pass


class HailoInputLayer(keras.layers.Layer):
    pass


class HailoCacheLayer(keras.layers.Layer):
    pass


class NotALayer:
    """Must not be registered (not a Keras layer)."""
