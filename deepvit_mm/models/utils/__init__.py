"""Model utilities shared beyond one family: the check of the neck and heads a backbone feeds.

``consumers``: whether a model's neck or heads were built for the levels its columnar backbone
feeds."""
from .consumers import ChannelMismatchError, check_consumers, check_model

__all__ = ['ChannelMismatchError', 'check_consumers', 'check_model']
