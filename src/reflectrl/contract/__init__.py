"""The method contract below both front ends: what a method sees and returns (:mod:`.base`), the typed fields a
batch carries beside its tokens (:mod:`.fields`), and the one hook protocol (:mod:`.hooks`)."""

from .base import AuxInputs, Method, MethodRunner, Shaping, StepBatch, View, apply_shaping
from .fields import Field, LossInputs, register_field
from .hooks import Hook

__all__ = ["AuxInputs", "Field", "Hook", "LossInputs", "Method", "MethodRunner", "Shaping", "StepBatch", "View",
           "apply_shaping", "register_field"]
